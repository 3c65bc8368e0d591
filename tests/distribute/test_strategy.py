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


def test_multi_worker_on_localhost_two_processes():
    addresses = [f"localhost:{p}" for p in _free_ports(2)]
    procs = [_start("auto", "--allreduce", tf_config={"cluster": {"worker": addresses},
                                                       "task": {"type": "worker", "index": i}})
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
    assert [r["is_chief"] for r in results] == [True, False]


def test_tf_config_after_runtime_start_is_a_cluster_config_error():
    addresses = [f"localhost:{p}" for p in _free_ports(2)]
    proc = _start("multi_worker", "--init-tf-first",
                  tf_config={"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 0}})
    r = _result(proc)
    assert r["error"] == "ClusterConfigError"
    assert "before any other TensorFlow op" in r["message"]
