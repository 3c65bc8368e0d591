"""Strategies: harness/distribute/strategy.py, each built in a fresh process (TensorFlow's device and collective
configuration must happen before its runtime starts)."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "build_strategy.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def _env(tf_config=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""  # the same answers on GPU hosts
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _start(*args, tf_config=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], env=_env(tf_config), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"no answer within {TIMEOUT_S} s; stderr tail:\n{err[-3000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"exit {proc.returncode}, no JSON; stderr tail:\n{err[-3000:]}"
    return json.loads(lines[-1])


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_mirrored_on_two_logical_cpus():
    r = _result(_start("mirrored", "--num-cpu-replicas", "2", "--allreduce"))
    assert r["strategy"] == "MirroredStrategy" and not r["default"]
    assert (r["replicas_in_sync"], r["replicas_per_worker"], r["num_workers"]) == (2, 2, 1)
    assert r["allreduce"] == 2.0 and r["backend"] == "mirrored" and r["is_chief"]


def test_auto_without_cluster_is_the_default_strategy():
    r = _result(_start("auto"))
    assert (r["strategy"], r["default"], r["replicas_in_sync"], r["backend"]) == ("default strategy", True, 1, "single")


def test_multi_worker_on_localhost_two_processes_and_their_gpu_counts_compared():
    """Two workers build MultiWorkerMirroredStrategy (their GPU counts compared on the way: 0 and 0), sum over their
    replicas, then compare 4 GPUs against 8 through the coordination service: one named line on each, before any
    collective (tensorflow/tensorflow#47203 failed in the first collective on its group size)."""
    addresses = [f"localhost:{p}" for p in _free_ports(2)]
    procs = [_start("auto", "--allreduce", "--agree-gpus", str(4 + 4 * i),
                    tf_config={"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}})
             for i in range(2)]
    try:
        results = [_result(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, r in enumerate(results):
        assert r["strategy"] == "MultiWorkerMirroredStrategy"
        assert (r["rank"], r["num_workers"], r["replicas_in_sync"]) == (i, 2, 2)
        assert r["allreduce"] == 2.0
        host = socket.gethostname()
        assert r["agree"] == (f"ClusterConfigError: the workers have different numbers of GPUs (worker 0 on {host} 4 "
                              f"GPUs, worker 1 on {host} 8 GPUs): MultiWorkerMirroredStrategy runs one replica per "
                              "GPU and needs the same count on every worker (one without a GPU runs one CPU "
                              "replica); give every worker the same GPUs (CUDA_VISIBLE_DEVICES, the pods' "
                              "nvidia.com/gpu limit), or run one process per GPU with --backend horovod")
    assert [r["is_chief"] for r in results] == [True, False]


def test_tf_config_after_runtime_start_is_a_cluster_config_error():
    addresses = [f"localhost:{p}" for p in _free_ports(2)]
    proc = _start("multi_worker", "--init-tf-first",
                  tf_config={"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 0}})
    r = _result(proc)
    assert r["error"] == "ClusterConfigError"
    assert "before any other TensorFlow op" in r["message"]


def test_a_worker_that_never_says_its_gpu_count_is_a_lost_peer_named_with_its_address():
    import tensorflow as tf

    from harness.distribute import environment
    from harness.distribute.strategy import agree_devices
    from harness.errors import PeerLostError

    config = environment.read_tf_config({"TF_CONFIG": json.dumps(
        {"cluster": {"worker": ["host-a:2222", "host-b:2222"]}, "task": {"type": "worker", "index": 0}})})
    published = {}

    def never(key, timeout_in_ms):
        raise tf.errors.DeadlineExceededError(None, None, f"{key} not set within {timeout_in_ms} ms")

    with pytest.raises(PeerLostError, match=r"^worker 1 at host-b:2222 did not say its GPU count within 1.5 s "
                                            r"\(DeadlineExceededError\); HARNESS_WORKER_WAIT_S sets the wait$"):
        agree_devices(config, 2, timeout_s=1.5, publish=published.__setitem__, read=never)
    assert published == {"harness/gpus/worker/0": f"2 {socket.gethostname()}"}
