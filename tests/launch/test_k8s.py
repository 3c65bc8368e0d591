"""`harness launch k8s`: manifests checked against the real schemas, and the Indexed Job's TF_CONFIG.

TFJob and MPIJob are validated with jsonschema against the `openAPIV3Schema` of their CRDs (../shared/k8s, see
SOURCE.md there), made strict the way `kubectl apply --validate=strict` is: an object that lists its properties
accepts no others (the CRDs leave that open, and the API server would silently prune a misspelt field). Pod
templates and core objects (Service, Job, NetworkPolicy) go through the `kubernetes` client's models, and must
come back unchanged from a round trip through them (a field the model does not know would be dropped).
"""
import copy
import os
import pathlib
import secrets
import subprocess
import sys

import jsonschema
import pytest
import yaml
from shared_data import SHARED_DATA

from harness import exit_codes
from harness.distribute import environment
from harness.errors import ConfigError
from harness.launch import k8s

ROOT = pathlib.Path(__file__).resolve().parents[2]
# beside the exports: HARNESS_SHARED_DATA's sibling `k8s` (the README's set-up names only HARNESS_SHARED_DATA)
SHARED_K8S = pathlib.Path(os.environ.get("HARNESS_SHARED_K8S", SHARED_DATA.parent / "k8s"))
CRDS = {("kubeflow.org/v1", "TFJob"): "kubeflow.org_tfjobs.yaml",
        ("kubeflow.org/v2beta1", "MPIJob"): "kubeflow.org_mpijobs.yaml"}
CORE_MODELS = {("v1", "Service"): "V1Service", ("batch/v1", "Job"): "V1Job",
               ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
               ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy"}
CMD = ("harness", "train", "--data", "/mnt/harness/data", "--output", "/mnt/harness/runs/a")
HVD_CMD = CMD + ("--backend", "horovod")


# --- validation helpers ------------------------------------------------------------------------------------------
def _strict(schema):
    """Copy of an OpenAPI schema where every object with `properties` rejects other keys."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


_SCHEMAS = {}
# The CRDs as ../shared/k8s/SOURCE.md pins them: fetched (and checked) when ../shared/k8s is absent.
CRD_SOURCES = {
    "kubeflow.org_tfjobs.yaml": ("https://raw.githubusercontent.com/kubeflow/training-operator/"
                                 "078ec30ff26649a07d2e28893c332d4cef70e233/manifests/base/crds/kubeflow.org_tfjobs.yaml",
                                 "1fea6d2d9d3fec4697db322d4490be67b0d616478f42566e4c48ae865130a8c8"),
    "kubeflow.org_mpijobs.yaml": ("https://raw.githubusercontent.com/kubeflow/mpi-operator/"
                                  "caa3c47fc42eb762635f78045ec0fcd1a89eb038/manifests/base/kubeflow.org_mpijobs.yaml",
                                  "78b0131f931fcc8d99f6ce0407281f41b62527e443ec691d26d9634b390ad3bb"),
}


def _crd_file(name: str) -> pathlib.Path:
    """`SHARED_K8S/name`, else the pinned public copy fetched into the test cache (SHA-256 checked); skips the
    test, naming both, when neither can be had."""
    path = SHARED_K8S / name
    if path.is_file():
        return path
    import pooch

    url, digest = CRD_SOURCES[name]
    cache = pathlib.Path(os.environ.get("HARNESS_SHARED_DATA_CACHE",
                                        pathlib.Path.home() / ".cache" / "harness" / "shared-data")) / "k8s"
    try:
        return pathlib.Path(pooch.retrieve(url, known_hash=f"sha256:{digest}", fname=name, path=cache,
                                           downloader=pooch.HTTPDownloader(timeout=30, progressbar=False)))
    except Exception as e:  # network, digest: the reason to skip, named
        pytest.skip(f"CRD not in {SHARED_K8S} (HARNESS_SHARED_K8S), and fetching {url} into {cache} failed: "
                    f"{type(e).__name__}: {str(e)[:200]}")


def crd_schema(api_version: str, kind: str) -> dict:
    if (api_version, kind) not in _SCHEMAS:
        path = _crd_file(CRDS[(api_version, kind)])
        crd = yaml.safe_load(path.read_text())
        assert crd["spec"]["names"]["kind"] == kind
        group, version = api_version.split("/")
        assert crd["spec"]["group"] == group
        (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
        _SCHEMAS[(api_version, kind)] = _strict(served["schema"]["openAPIV3Schema"])
    return _SCHEMAS[(api_version, kind)]


def round_trip(obj: dict, model: str) -> None:
    """Deserialize `obj` into the kubernetes client model and back; nothing may be lost or changed."""
    from kubernetes.client import ApiClient

    api = ApiClient()
    parsed = api._ApiClient__deserialize(copy.deepcopy(obj), model)
    assert api.sanitize_for_serialization(parsed) == obj


def validate(manifest: dict) -> None:
    key = (manifest["apiVersion"], manifest["kind"])
    if key in CORE_MODELS:
        round_trip(manifest, CORE_MODELS[key])
        return
    jsonschema.validate(manifest, crd_schema(*key))
    replicas = manifest["spec"].get("tfReplicaSpecs") or manifest["spec"]["mpiReplicaSpecs"]
    for spec in replicas.values():
        round_trip(spec["template"], "V1PodTemplateSpec")


def _make(kind, **kw):
    kw.setdefault("network_policy", False)   # the job's own objects; the policy has its tests below
    kw.setdefault("workers", 2)
    kw.setdefault("image", "registry.example/harness:0.1.0")
    kw.setdefault("command", HVD_CMD if kind == "mpijob" else CMD)
    return k8s.manifests(k8s.K8sOptions(kind=kind, **kw))


def _containers(template):
    return {c["name"]: c for c in template["spec"]["containers"]}


def _env(container):
    return {e["name"]: e.get("value") for e in container["env"]}


# --- TFJob -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpus", [0, 4])
def test_tfjob_matches_crd_and_operator_conventions(gpus):
    (job,) = _make("tfjob", workers=3, gpus_per_worker=gpus, cpu="8", memory="32Gi")
    validate(job)
    (worker,) = job["spec"]["tfReplicaSpecs"].values()
    assert list(job["spec"]["tfReplicaSpecs"]) == ["Worker"]
    # ExitCode: training-operator restarts pods whose code it retries (138, 130, 137, 143), fails the job on 2
    assert worker["replicas"] == 3 and worker["restartPolicy"] == "ExitCode"
    c = _containers(worker["template"])["tensorflow"]
    assert c["command"] == list(CMD)
    assert c["ports"] == [{"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"}]
    assert c["resources"]["limits"] == {"cpu": "8", "memory": "32Gi", **({"nvidia.com/gpu": "4"} if gpus else {})}
    assert {"name": "shared", "mountPath": "/mnt/harness"} in c["volumeMounts"]
    spec = worker["template"]["spec"]
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "harness-shared"}} in spec["volumes"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert "TF_CONFIG" not in _env(c)  # the operator writes it
    assert _env(c)["HARNESS_WORKER_WAIT_S"] == "900"   # peers may wait for scheduling and image pulls


# --- MPIJob ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_mpijob_matches_crd(launcher):
    (job,) = _make("mpijob", workers=2, gpus_per_worker=8, mpi_launcher=launcher)
    validate(job)
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 8 and spec["mpiImplementation"] == "OpenMPI"
    assert spec["sshAuthMountPath"] == "/home/harness/.ssh"
    launcher_pod, workers = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert launcher_pod["replicas"] == 1 and workers["replicas"] == 2
    cmd = _containers(launcher_pod["template"])["launcher"]["command"]
    assert cmd[0] == launcher and cmd[cmd.index("-np") + 1] == "16"   # 2 pods x 8 slots
    assert cmd[-len(HVD_CMD):] == list(HVD_CMD)
    resources = _containers(launcher_pod["template"])["launcher"]["resources"]
    assert resources == {"requests": {"cpu": "1", "memory": "2Gi"}}   # no GPU for the launcher, but not BestEffort
    w = _containers(workers["template"])["worker"]
    assert w["command"][0] == "/usr/sbin/sshd" and w["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert w["resources"]["requests"] == {"cpu": "24", "memory": "96Gi"}   # 3 CPUs and 12 GiB per GPU


# --- faults: restarts, backoffLimit ---------------------------------------------------------------------------------
def operator_gives_up(backoff_limit: int, restarts: int) -> bool:
    """The training-operator's rule (pkg/core/job.go, PastBackoffLimit), also Kubernetes' for OnFailure pods."""
    return restarts > 0 if backoff_limit == 0 else restarts >= backoff_limit


@pytest.mark.parametrize("kind", k8s.KINDS)
@pytest.mark.parametrize("workers, max_restarts", [(4, 3), (1, 0), (8, 5)])
def test_backoff_limit_lets_the_job_survive_max_restarts_faults(kind, workers, max_restarts):
    """Each fault restarts every worker (its peers fail their next collective): `workers` restarts per fault."""
    job = _make(kind, workers=workers, max_restarts=max_restarts)[-1]
    limit = job["spec"]["runPolicy"]["backoffLimit"] if "runPolicy" in job["spec"] else job["spec"]["backoffLimit"]
    assert limit == workers * max_restarts + 1
    assert not operator_gives_up(limit, workers * max_restarts)
    assert operator_gives_up(limit, workers * (max_restarts + 1))
    explicit = _make(kind, workers=workers, backoff_limit=7)[-1]
    assert 7 in (explicit["spec"].get("backoffLimit"), explicit["spec"].get("runPolicy", {}).get("backoffLimit"))


def test_default_job_survives_a_fault_of_four_workers():
    (job,) = _make("tfjob", workers=4)
    assert not operator_gives_up(job["spec"]["runPolicy"]["backoffLimit"], 4)   # was 3: failed at the first fault


def test_mpijob_workers_restart_on_failure():
    (job,) = _make("mpijob")
    validate(job)
    replicas = job["spec"]["mpiReplicaSpecs"]
    assert replicas["Worker"]["restartPolicy"] == "OnFailure" and replicas["Launcher"]["restartPolicy"] == "OnFailure"
    (never,) = _make("mpijob", restart_policy="Never")
    assert never["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("policy", ["ExitCode", "Always"])
def test_mpijob_refuses_restart_policies_the_operator_rejects(policy):
    with pytest.raises(ConfigError, match=f"--restart-policy '{policy}' is not valid for mpijob: one of "
                                          "OnFailure, Never"):
        _make("mpijob", restart_policy=policy)


def test_mpijob_refuses_harness_train_without_the_horovod_backend():
    with pytest.raises(ConfigError, match="harness train without --backend under MPI.*add --backend horovod"):
        _make("mpijob", command=CMD)
    with pytest.raises(ConfigError, match="with --backend tf"):
        _make("mpijob", command=CMD + ("--backend", "tf"))


# --- resources, storage ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", k8s.KINDS)
def test_training_pods_request_cpu_and_memory_by_default(kind):
    """No requests = BestEffort QoS, the first pods evicted; one evicted MPIJob worker fails the job."""
    for gpus, cpu, memory in ((0, "3", "12Gi"), (2, "6", "24Gi")):
        templates = k8s._pod_templates(_make(kind, gpus_per_worker=gpus)[-1])
        for t in templates:
            for c in t["spec"]["containers"]:
                requests = c["resources"]["requests"]
                if c["name"] == "launcher":
                    assert requests == k8s.LAUNCHER_REQUESTS
                    continue
                assert requests == {"cpu": cpu, "memory": memory}
                assert c["resources"].get("limits", {}) == ({"nvidia.com/gpu": str(gpus)} if gpus else {})
    given = k8s._pod_templates(_make(kind, gpus_per_worker=2, cpu="10", memory="40Gi")[-1])[-1]
    c = given["spec"]["containers"][0]
    assert c["resources"]["requests"] == {"cpu": "10", "memory": "40Gi"}
    assert c["resources"]["limits"] == {"cpu": "10", "memory": "40Gi", "nvidia.com/gpu": "2"}


@pytest.mark.parametrize("kind", k8s.KINDS)
def test_volume_is_not_reowned_at_every_pod_start(kind):
    for t in k8s._pod_templates(_make(kind)[-1]):
        context = t["spec"]["securityContext"]
        assert context["fsGroup"] == 1000 and context["fsGroupChangePolicy"] == "OnRootMismatch"


@pytest.mark.parametrize("kind", k8s.KINDS)
def test_volume_claim_size_writes_the_claim_first(kind):
    objects = _make(kind, volume_claim="geo-data", volume_claim_size="500Gi", storage_class="filestore",
                    namespace="geo")
    claim = objects[0]
    validate(claim)
    assert (claim["kind"], claim["metadata"]["name"], claim["metadata"]["namespace"]) == (
        "PersistentVolumeClaim", "geo-data", "geo")
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "500Gi"}},
                             "storageClassName": "filestore"}
    for t in k8s._pod_templates(objects[-1]):
        assert {"name": "shared", "persistentVolumeClaim": {"claimName": "geo-data"}} in t["spec"]["volumes"]
    assert [o["kind"] for o in _make(kind)][0] != "PersistentVolumeClaim"   # not unless asked


@pytest.mark.parametrize("kw, match", [
    (dict(volume_claim_size="500 GB"), "--volume-claim-size '500 GB' is not a Kubernetes quantity"),
    (dict(volume_claim=None, volume_claim_size="1Ti"), "needs a --volume-claim"),
    (dict(memory="32GB"), "--memory '32GB' is not a Kubernetes quantity"),
    (dict(max_restarts=-1), "--max-restarts and --backoff-limit must be >= 0"),
])
def test_bad_resource_options_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        _make("tfjob", **kw)


# --- the MPIJob launcher's environment and line -----------------------------------------------------------------------
def test_mpijob_launcher_exports_only_variables_it_has():
    """`-x NAME` of an unset variable makes mpirun warn at every run (NCCL_DEBUG was exported while unset)."""
    (job,) = _make("mpijob", overrides={"container": {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}})
    launcher = _containers(job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])["launcher"]
    cmd = launcher["command"]
    exported = [cmd[i + 1] for i, t in enumerate(cmd) if t == "-x"]
    assert set(exported) <= set(_env(launcher)) | set(k8s.IMAGE_EXPORTED)
    assert "NCCL_DEBUG" in exported
    (plain,) = _make("mpijob")
    plain_cmd = _containers(plain["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])["launcher"]["command"]
    assert "NCCL_DEBUG" not in plain_cmd
    # Horovod docs/mpi.rst: MPI and NCCL off the loopback and Docker bridge; one prefix per rank's lines.
    assert " -mca btl_tcp_if_exclude lo,docker0 --tag-output " in " ".join(plain_cmd)
    assert _env(launcher)["NCCL_SOCKET_IFNAME"] == "^lo,docker0" and "NCCL_SOCKET_IFNAME" in exported


@pytest.mark.parametrize("launcher_kind", ["mpirun", "horovodrun"])
def test_mpijob_user_env_reaches_the_ranks_through_the_launcher(launcher_kind):
    """The workers run sshd; the ranks get the launcher's environment (mpirun -x; horovodrun exports it all)."""
    env = [{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/secrets/key.json"},
           {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}}]
    mounts = [{"name": "key", "mountPath": "/var/secrets"}]
    (job,) = _make("mpijob", mpi_launcher=launcher_kind, overrides={"container": {"env": env,
                                                                                 "volumeMounts": mounts}})
    validate(job)
    replicas = job["spec"]["mpiReplicaSpecs"]
    launcher = _containers(replicas["Launcher"]["template"])["launcher"]
    worker = _containers(replicas["Worker"]["template"])["worker"]
    assert [e for e in launcher["env"] if e["name"] in ("GOOGLE_APPLICATION_CREDENTIALS", "WANDB_API_KEY")] == env
    assert not {"GOOGLE_APPLICATION_CREDENTIALS", "WANDB_API_KEY"} & {e["name"] for e in worker["env"]}
    assert mounts[0] in worker["volumeMounts"] and "volumeMounts" not in launcher   # files are read by the ranks
    cmd = launcher["command"]
    if launcher_kind == "mpirun":
        exported = [cmd[i + 1] for i, t in enumerate(cmd) if t == "-x"]
        assert {"GOOGLE_APPLICATION_CREDENTIALS", "WANDB_API_KEY"} <= set(exported)


def test_mpijob_refuses_env_from():
    with pytest.raises(ConfigError, match="container.envFrom does not reach the ranks of an MPIJob"):
        _make("mpijob", overrides={"container": {"envFrom": [{"secretRef": {"name": "s"}}]}})


# --- Indexed Job + headless Service ------------------------------------------------------------------------------
def test_indexed_job_and_headless_service_are_valid_core_objects():
    service, job = _make("indexed-job", workers=4, gpus_per_worker=1, port=2345, restart_policy="Never")
    validate(service)
    validate(job)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert service["spec"]["ports"][0]["port"] == 2345
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)
    pod = spec["template"]
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]   # hostnames <job>-<i>.<service>
    assert pod["spec"]["restartPolicy"] == "Never"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    env = _env(_containers(pod)["harness"])
    assert env["HARNESS_K8S_JOB"] == job["metadata"]["name"]
    assert env["HARNESS_K8S_SERVICE"] == service["metadata"]["name"]
    assert (env["HARNESS_NUM_WORKERS"], env["HARNESS_PORT"]) == ("4", "2345")


def test_indexed_job_pod_environment_gives_dns_cluster():
    _, job = _make("indexed-job", workers=3, name="unet", namespace="geo")
    env = dict(_env(_containers(job["spec"]["template"])["harness"]), JOB_COMPLETION_INDEX="2")
    config = environment.read_tf_config(env)
    assert config.cluster == {"worker": ("unet-0.unet:2222", "unet-1.unet:2222", "unet-2.unet:2222")}
    assert (config.task_type, config.task_index) == ("worker", 2)


# --- the user's settings, and bad options --------------------------------------------------------------------------
OVERRIDES = {
    "manifest": {"metadata": {"labels": {"team": "geo"}, "annotations": {"owner": "me"}}},
    "pod": {"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "serviceAccountName": "trainer"},
    "container": {"env": [{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/secrets/key.json"}]},
}


@pytest.mark.parametrize("kind", k8s.KINDS)
def test_overrides_land_in_every_object_and_stay_valid(kind):
    objects = _make(kind, overrides=OVERRIDES, network_policy=True)
    for obj in objects:
        validate(obj)
        assert obj["metadata"]["labels"]["team"] == "geo"
        assert obj["metadata"]["labels"]["harness/job"] == "harness-train"   # merged, not replaced
    main = objects[-1]
    templates = k8s._pod_templates(main)
    for t in templates:
        assert t["spec"]["serviceAccountName"] == "trainer"
        for c in t["spec"]["containers"]:
            env = _env(c)
            assert env["TF_USE_LEGACY_KERAS"] == "1"                          # appended, not replaced
            # MPIJob: the ranks see the launcher's environment, not the sshd container's.
            assert ("GOOGLE_APPLICATION_CREDENTIALS" in env) == (kind != "mpijob" or c["name"] == "launcher")


@pytest.mark.parametrize("kw, match", [
    (dict(kind="indexed-job", restart_policy="ExitCode"), "not valid for indexed-job"),
    (dict(kind="mpijob", command=HVD_CMD, overrides={"container": {"env": [{"value": "x"}]}}), "has no name"),
    (dict(kind="tfjob", name="Bad_Name"), "DNS label"),
    (dict(kind="tfjob", name="x" * 60), "at most 63"),
    (dict(kind="tfjob", command=()), "no command"),
    (dict(kind="mpijob", command=HVD_CMD, overrides={"pods": {}}), "unknown sections"),
    (dict(kind="k8s"), "one of tfjob"),
])
def test_bad_options_are_config_errors(kw, match):
    kw = {"command": CMD, "workers": 2, "image": "i", **kw}
    with pytest.raises(ConfigError, match=match):
        k8s.manifests(k8s.K8sOptions(**kw))


def test_schema_check_catches_mistakes():
    (job,) = _make("tfjob")
    bad = copy.deepcopy(job)
    bad["spec"]["tfReplicaSpec"] = bad["spec"].pop("tfReplicaSpecs")   # misspelt
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(job)
    bad["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(job)
    bad["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


def test_cli_writes_a_yaml_stream(tmp_path):
    overrides = tmp_path / "mine.yaml"
    overrides.write_text(yaml.safe_dump(OVERRIDES))
    out = tmp_path / "job.yaml"
    r = subprocess.run([sys.executable, "-m", "harness.cli", "launch", "k8s", "--kind", "indexed-job",
                        "--workers", "2", "--gpus-per-worker", "1", "--image", "h:1", "--overrides", str(overrides),
                        "--max-restarts", "2", "--volume-claim-size", "100Gi", "-o", str(out), "--", *CMD], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.startswith("# Generated by: harness launch k8s --kind indexed-job")
    objects = list(yaml.safe_load_all(text))
    assert [o["kind"] for o in objects] == ["PersistentVolumeClaim", "NetworkPolicy", "Service", "Job"]
    for obj in objects:
        validate(obj)
    assert objects[-1]["spec"]["backoffLimit"] == 2 * 2 + 1
    assert "# Survives 2 faults" in text and "deletes it with your data" in text
    r = subprocess.run([sys.executable, "-m", "harness.cli", "launch", "k8s", "--kind", "tfjob", "--workers", "2",
                        "--image", "h:1", "--name", "UPPER", "--", *CMD], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "ConfigError" in r.stderr


# --- exit codes and restarts, gang scheduling ---------------------------------------------------------------------------
def test_tfjob_retries_cluster_faults_and_fails_on_bad_input():
    """restartPolicy ExitCode applies training-operator's IsRetryableExitCode to the pod's code: the harness's 138
    (a lost, stuck or late peer, a preemption) is retried, its 2 (bad input or configuration) fails the job."""
    (job,) = _make("tfjob")
    validate(job)
    assert job["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] == "ExitCode"
    assert exit_codes.is_retryable(exit_codes.RETRYABLE) and not exit_codes.is_retryable(exit_codes.PERMANENT)
    (bounded,) = _make("tfjob", restart_policy="OnFailure")   # counted against backoffLimit
    assert bounded["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] == "OnFailure"
    text = k8s.to_yaml([job], k8s.K8sOptions(kind="tfjob", command=CMD, workers=2, image="i"))
    assert "# restartPolicy ExitCode: a pod that exits 138" in text


def test_indexed_job_with_never_fails_on_permanent_codes_and_retries_the_others():
    _, job = _make("indexed-job", restart_policy="Never")
    validate(job)
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": "harness", "operator": "NotIn",
                                                             "values": [130, 137, 138, 143]}}
    assert rules[1] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    _, on_failure = _make("indexed-job")   # Kubernetes refuses a podFailurePolicy with OnFailure
    assert "podFailurePolicy" not in on_failure["spec"]


@pytest.mark.parametrize("workers", [1, 4])
def test_gang_tfjob_asks_for_every_worker_at_once(workers):
    (job,) = _make("tfjob", workers=workers, gang=True, queue="research", priority_class="high",
                   scheduler_name="volcano")
    validate(job)
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": workers, "queue": "research",
                                                          "priorityClass": "high"}
    assert job["spec"]["runPolicy"]["backoffLimit"] == k8s.default_backoff_limit(k8s.K8sOptions(
        kind="tfjob", command=CMD, workers=workers, image="i"))   # the rest of runPolicy kept
    (worker,) = job["spec"]["tfReplicaSpecs"].values()
    assert worker["template"]["spec"]["schedulerName"] == "volcano"


@pytest.mark.parametrize("workers", [1, 4])
def test_gang_mpijob_counts_the_launcher_and_creates_it_at_startup(workers):
    """mpi-operator's PodGroup minMember is minAvailable (default workers + 1); a launcher created only once the
    workers are Ready would never join a gang that waits for it (kubeflow/mpi-operator issue 608)."""
    (job,) = _make("mpijob", workers=workers, gang=True, scheduler_name="scheduler-plugins-scheduler")
    validate(job)
    spec = job["spec"]
    assert spec["runPolicy"]["schedulingPolicy"] == {"minAvailable": workers + 1}
    assert spec["launcherCreationPolicy"] == "AtStartup"
    for replica in spec["mpiReplicaSpecs"].values():
        assert replica["template"]["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


@pytest.mark.parametrize("kind", ["tfjob", "mpijob"])
def test_without_gang_no_scheduling_policy_and_the_wait_is_said(kind):
    (job,) = _make(kind)
    validate(job)
    assert "schedulingPolicy" not in job["spec"]["runPolicy"]
    assert all("schedulerName" not in t["spec"] for t in k8s._pod_templates(job))
    if kind == "mpijob":
        assert job["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    options = k8s.K8sOptions(kind=kind, command=HVD_CMD if kind == "mpijob" else CMD, workers=2, image="i")
    assert "# Not gang-scheduled (--gang): pods start one by one and wait up to 900 s" in k8s.to_yaml([job], options)


def test_gang_scheduling_policy_is_checked_by_the_schema():
    (job,) = _make("tfjob", gang=True)
    bad = copy.deepcopy(job)
    bad["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(job)
    bad["spec"]["runPolicy"]["schedulingPolicy"]["minMember"] = 2   # the PodGroup's name, not the job's
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


@pytest.mark.parametrize("kw, match", [
    (dict(kind="indexed-job", gang=True), "--gang needs an operator that makes the PodGroup"),
    (dict(kind="tfjob", queue="q"), "need --gang"),
    (dict(kind="tfjob", gang=True, scheduler_name="Volcano Scheduler"), "not a scheduler's name"),
])
def test_bad_gang_options_are_config_errors(kw, match):
    kw = {"command": CMD, "workers": 2, "image": "i", **kw}
    with pytest.raises(ConfigError, match=match):
        k8s.manifests(k8s.K8sOptions(**kw))


def test_cli_gang_flags(tmp_path):
    out = tmp_path / "job.yaml"
    r = subprocess.run([sys.executable, "-m", "harness.cli", "launch", "k8s", "--kind", "mpijob", "--workers", "3",
                        "--image", "h:1", "--gang", "--queue", "research", "-o", str(out), "--", *HVD_CMD],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    job = list(yaml.safe_load_all(out.read_text()))[-1]   # after the NetworkPolicy
    validate(job)
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4, "queue": "research"}
    assert "# Gang-scheduled: all 4 pods are bound at once or none" in out.read_text()


# --- the NetworkPolicy: ingress from the job's own pods only -------------------------------------------------------
JOB_LABELS = {"app.kubernetes.io/name": "harness", "harness/job": "unet"}


def _selects(selector: dict, labels: dict) -> bool:
    """A `matchLabels` selector's rule (Kubernetes labels.SelectorFromSet): every pair is among the pod's labels."""
    assert set(selector) == {"matchLabels"}, selector   # no matchExpressions, nothing else
    return selector["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("kind", k8s.KINDS)
def test_network_policy_admits_ingress_from_the_jobs_own_pods_only(kind):
    """TensorFlow's server runs the graphs it is sent, from anyone (TensorFlow SECURITY.md): every pod of the job
    (the workers; for MPIJob the launcher too) is isolated for ingress and admits the job's pods only."""
    objects = _make(kind, network_policy=True, name="unet", namespace="geo")
    kinds = [o["kind"] for o in objects]
    assert kinds == ["NetworkPolicy", *(["Service"] if kind == "indexed-job" else []),
                     {"tfjob": "TFJob", "mpijob": "MPIJob", "indexed-job": "Job"}[kind]]   # before any pod
    policy = objects[0]
    validate(policy)
    assert (policy["apiVersion"], policy["metadata"]["name"], policy["metadata"]["namespace"]) == (
        "networking.k8s.io/v1", "unet", "geo")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": JOB_LABELS}
    assert spec["policyTypes"] == ["Ingress"]          # egress open: data, images, credentials are outside
    (rule,) = spec["ingress"]
    # No `ports`: every port (NCCL, Open MPI, Gloo listen on ephemeral ones), and no namespaceSelector or ipBlock.
    assert rule == {"from": [{"podSelector": {"matchLabels": JOB_LABELS}}]}
    templates = k8s._pod_templates(objects[-1])
    assert len(templates) == (2 if kind == "mpijob" else 1)   # MPIJob: launcher and workers
    for t in templates:
        assert _selects(spec["podSelector"], t["metadata"]["labels"])          # isolated
        assert _selects(rule["from"][0]["podSelector"], t["metadata"]["labels"])   # admitted
    for stranger in ({"app.kubernetes.io/name": "harness", "harness/job": "other"}, {"app": "curl"}, {}):
        assert not _selects(rule["from"][0]["podSelector"], stranger)
    if kind != "mpijob":   # the TF gRPC port is a port of the selected pods, so within "every port"
        (c,) = templates[0]["spec"]["containers"]
        assert [p["containerPort"] for p in c["ports"]] == [2222]


def test_network_policy_is_checked_by_the_schema():
    (policy, _) = _make("tfjob", network_policy=True)
    bad = copy.deepcopy(policy)
    bad["spec"]["ingress"][0]["form"] = bad["spec"]["ingress"][0].pop("from")   # misspelt: would admit all
    with pytest.raises(AssertionError):
        validate(bad)
    bad = copy.deepcopy(policy)
    bad["spec"]["podSelectors"] = bad["spec"].pop("podSelector")
    with pytest.raises((AssertionError, ValueError)):
        validate(bad)


@pytest.mark.parametrize("kind", k8s.KINDS)
def test_cli_writes_the_network_policy_unless_told_not_to(kind, tmp_path):
    from harness import cli

    command = HVD_CMD if kind == "mpijob" else CMD
    base = ["launch", "k8s", "--kind", kind, "--workers", "2", "--image", "h:1", "--name", "unet"]
    assert cli.main([*base, "-o", str(tmp_path / "on.yaml"), "--", *command]) == 0
    text = (tmp_path / "on.yaml").read_text()
    objects = list(yaml.safe_load_all(text))
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    validate(policy)
    assert policy["spec"]["podSelector"] == {"matchLabels": JOB_LABELS}
    assert "# NetworkPolicy: the job's pods admit connections from the job's own pods only" in text
    assert cli.main([*base, "--no-network-policy", "-o", str(tmp_path / "off.yaml"), "--", *command]) == 0
    text = (tmp_path / "off.yaml").read_text()
    assert "NetworkPolicy" not in [o["kind"] for o in yaml.safe_load_all(text)]
    assert "# No NetworkPolicy (--no-network-policy)" in text
    assert [o for o in yaml.safe_load_all(text)] == [o for o in objects if o["kind"] != "NetworkPolicy"]


# --- credentials: from Secrets, never literal values in the manifest ---------------------------------------------
@pytest.mark.parametrize("kind", k8s.KINDS)
@pytest.mark.parametrize("name", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_SECRET", "DB_PASSWORD"])
def test_a_credentials_literal_value_is_refused_without_echoing_it(kind, name):
    value = "hx-secret-" + secrets.token_hex(8)
    with pytest.raises(ConfigError, match=f"container.env {name} has a literal value.*secretKeyRef") as e:
        _make(kind, overrides={"container": {"env": [{"name": name, "value": value}]}})
    assert value not in str(e.value)
    ref = {"name": name, "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}
    job = _make(kind, overrides={"container": {"env": [ref]}})[-1]
    validate(job)
    envs = [e for t in k8s._pod_templates(job) for c in t["spec"]["containers"] for e in c["env"]]
    assert ref in envs
    # a path or a setting is not a credential: GOOGLE_APPLICATION_CREDENTIALS names a file the pod mounts
    _make(kind, overrides=OVERRIDES)
