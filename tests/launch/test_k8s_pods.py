"""The pod environment each manifest of `harness launch k8s` produces, fed to real local worker processes.

No cluster here, so each test plays the part of Kubernetes and its operator, then runs 2 real workers on this
machine (DNS names replaced by localhost ports) that must form the expected cluster:
  - TFJob: TF_CONFIG as the training-operator writes it (pkg/controller.v1/tensorflow/tensorflow.go,
    genTFConfigJSONStr: `<job>-<type>-<i>.<namespace>.svc:<tfjob-port>`, "environment": "cloud");
  - Indexed Job: the container's env plus the JOB_COMPLETION_INDEX Kubernetes adds to pod i;
  - MPIJob: the launcher's own command run by mpirun here (the operator's hostfile replaced by this host), which
    gives each rank its OMPI_COMM_WORLD_* variables.
Each worker runs scripts/report_cluster.py, whose all-reduce only returns once every worker is connected.
"""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from harness.launch import k8s
from harness.launch.local import free_ports

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "report_cluster.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 180


def _env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k != "TF_CONFIG" and not k.startswith(("OMPI_", "HARNESS_", "JOB_COMPLETION"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), CUDA_VISIBLE_DEVICES="",
               PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    env.update(extra)
    return env


def _run_all(commands_envs: list) -> list[dict]:
    """Start every (command, env) at once; each must print `CLUSTER {json}` within TIMEOUT_S (else all are
    killed and the test fails)."""
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for cmd, env in commands_envs]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT_S)
            outputs.append(out)
            assert p.returncode == 0, out[-3000:]
    except subprocess.TimeoutExpired:
        pytest.fail(f"workers did not form a cluster within {TIMEOUT_S} s")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    # raw_decode from each marker: mpirun forwards its ranks' output in chunks, two lines may share one.
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(chunk)[0] for out in outputs for chunk in out.split("CLUSTER ")[1:]]


def _containers(template):
    return {c["name"]: c for c in template["spec"]["containers"]}


def _container_env(container) -> dict:
    return {e["name"]: e["value"] for e in container["env"]}


def operator_tf_config(tfjob: dict, replica_type: str, index: int, namespace: str = "default") -> dict:
    """The TF_CONFIG the Kubeflow training-operator writes into a TFJob's pod."""
    name = tfjob["metadata"]["name"]
    cluster = {}
    for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        container = _containers(spec["template"])["tensorflow"]
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "tfjob-port"]
        rt = rtype.lower()
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    return {"cluster": cluster, "task": {"type": replica_type.lower(), "index": index}, "environment": "cloud"}


def _localhost(config: dict, ports: dict) -> dict:
    """`config` with every DNS address replaced by its localhost port."""
    cluster = {t: [f"localhost:{ports[a]}" for a in addrs] for t, addrs in config["cluster"].items()}
    return dict(config, cluster=cluster)


def test_tfjob_pods_form_a_multi_worker_cluster():
    job = k8s.manifests(k8s.K8sOptions(kind="tfjob", workers=2, image="h:1", name="unet",
                                       command=(sys.executable, str(SCRIPT), "tf")))[-1]
    spec = job["spec"]["tfReplicaSpecs"]["Worker"]
    container = _containers(spec["template"])["tensorflow"]
    configs = [operator_tf_config(job, "Worker", i, "geo") for i in range(spec["replicas"])]
    dns = configs[0]["cluster"]["worker"]
    assert dns == ["unet-worker-0.geo.svc:2222", "unet-worker-1.geo.svc:2222"]
    ports = dict(zip(dns, free_ports(2)))
    local = [_localhost(c, ports) for c in configs]
    results = _run_all([(container["command"],
                         _env({**_container_env(container), "TF_CONFIG": json.dumps(c)})) for c in local])
    assert [r["rank"] for r in results] == [0, 1] and [r["is_chief"] for r in results] == [True, False]
    for i, r in enumerate(results):
        assert r["multi_worker"] and r["num_workers"] == 2
        assert r["cluster"] == local[0]["cluster"] and r["task"] == ["worker", i]
        assert r["allreduce"] == 2.0


def test_indexed_job_pods_build_tf_config_and_form_a_cluster():
    job = k8s.manifests(k8s.K8sOptions(kind="indexed-job", workers=2, image="h:1", name="unet",
                                       command=(sys.executable, str(SCRIPT), "tf")))[-1]
    container = _containers(job["spec"]["template"])["harness"]
    addresses = ",".join(f"localhost:{p}" for p in free_ports(2))
    pod_env = [dict(_container_env(container), JOB_COMPLETION_INDEX=str(i), HARNESS_WORKER_ADDRESSES=addresses)
               for i in range(job["spec"]["completions"])]
    assert "TF_CONFIG" not in pod_env[0]   # built by the harness
    results = _run_all([(container["command"], _env(e)) for e in pod_env])
    assert [r["rank"] for r in results] == [0, 1]
    for i, r in enumerate(results):
        assert r["multi_worker"] and r["replicas_in_sync"] == 2
        assert r["cluster"] == {"worker": addresses.split(",")} and r["task"] == ["worker", i]
        assert r["allreduce"] == 2.0


def test_mpijob_launcher_command_runs_every_rank_with_ompi_variables():
    assert shutil.which("mpirun"), "mpirun not found (tools/install.sh installs openmpi-bin)"
    # One worker pod with 2 slots: the launcher starts 2 ranks there.
    job = k8s.manifests(k8s.K8sOptions(kind="mpijob", workers=1, gpus_per_worker=2, image="h:1",
                                       command=(sys.executable, str(SCRIPT), "horovod")))[-1]
    launcher = _containers(job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])["launcher"]
    env = _env(_container_env(launcher))
    if os.geteuid() == 0:   # the image runs as a user; CI runs as root, where mpirun needs consent
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    results = _run_all([(launcher["command"], env)])
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert (r["launcher"], r["backend"], r["num_workers"], r["local_size"]) == ("openmpi", "horovod", 2, 2)
        assert r["hvd"] == [r["rank"], 2, r["local_rank"], 2] and r["local_rank"] == r["rank"]
        assert r["allreduce"] == 2.0
