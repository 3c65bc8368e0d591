"""Cluster faults with real worker processes on localhost (issue 11.4): a worker whose own port another process
holds fails at once, naming the port and its TF_CONFIG entry; its peer, which takes that process for worker 0,
fails within HARNESS_WORKER_WAIT_S naming worker 0; SIGTERM ends a worker blocked in the strategy constructor and
a worker whose strategy is built, within seconds."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from harness import exit_codes
from harness.launch.local import free_ports

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "build_strategy.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]
WAIT_S = 5   # worker 1 waits this long for worker 0 (another process holds its port), then fails
STARTUP_S = 40   # importing TensorFlow on 2 shared cores, before make_strategy runs
TERM_S = 5


def _start(ports, index, *args, wait_s=WAIT_S) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), CUDA_VISIBLE_DEVICES="",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", HARNESS_WORKER_WAIT_S=str(wait_s),
               TF_CONFIG=json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                     "task": {"type": "worker", "index": index}}))
    return subprocess.Popen([sys.executable, str(SCRIPT), "multi_worker", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"no exit within {timeout} s (a hang):\n{out[-2000:]}\n{err[-3000:]}")


def _kill(*procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)


def test_own_port_taken_fails_at_once_and_the_peer_within_the_wait():
    ports = free_ports(2)
    squatter = socket.create_server(("", ports[0]))   # another process on worker 0's port
    t0 = time.monotonic()
    w0, w1 = _start(ports, 0), _start(ports, 1)
    try:
        out0, err0 = _finish(w0, STARTUP_S + WAIT_S)
        s0 = time.monotonic() - t0
        out1, err1 = _finish(w1, STARTUP_S + 3 * WAIT_S)
        s1 = time.monotonic() - t0
    finally:
        _kill(w0, w1)
        squatter.close()
    assert w0.returncode == 3, err0[-3000:]
    error = json.loads(out0.splitlines()[-1])
    assert error["error"] == "ClusterConfigError"
    assert f"port {ports[0]} of this worker (TF_CONFIG cluster.worker[0] = 'localhost:{ports[0]}') is taken" \
        in error["message"]
    assert s0 < STARTUP_S, s0   # at once: not after waiting for worker 1 and a gRPC failure
    assert w1.returncode == -signal.SIGKILL and exit_codes.is_retryable(w1.returncode), err1[-3000:]
    assert (f"PeerLostError: worker 1 could not join the cluster within {WAIT_S} s: MultiWorkerMirroredStrategy"
            f" is still waiting for worker 0 at localhost:{ports[0]}") in err1, err1[-3000:]
    assert WAIT_S <= s1 < STARTUP_S + 2 * WAIT_S, s1


def _in_constructor(proc: subprocess.Popen, port: int, timeout: float = STARTUP_S) -> None:
    """Wait until `proc` is in the strategy constructor: its gRPC server listens on its own `port` (TF_CONFIG's
    address), which it starts just before the constructor connects to the cluster's leader. (TF 2.18 also logged
    "Started server with target" on stderr; TF 2.21 does not.)"""
    seen = []
    threading.Thread(target=lambda: seen.extend(proc.stderr), daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("localhost", port), timeout=0.5).close()
        except OSError:
            time.sleep(0.1)
            continue
        time.sleep(1.0)   # connecting
        return
    pytest.fail(f"worker never reached the strategy constructor (exit {proc.poll()}):\n{''.join(seen)[-3000:]}")


def _ends_after(proc: subprocess.Popen, send) -> float:
    send()
    t0 = time.monotonic()
    try:
        proc.wait(TERM_S + 10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"SIGTERM ignored for {TERM_S + 10} s")
    return time.monotonic() - t0


def test_sigterm_ends_a_worker_blocked_in_the_strategy_constructor():
    ports = free_ports(2)
    squatter = socket.create_server(("", ports[0]))   # answers for worker 0, which never comes
    w1 = _start(ports, 1, wait_s=300)
    try:
        _in_constructor(w1, ports[1])
        took = _ends_after(w1, lambda: os.killpg(w1.pid, signal.SIGTERM))   # as `harness launch local` stops it
    finally:
        _kill(w1)
        squatter.close()
    assert w1.returncode != 0 and took < TERM_S, took


def test_sigterm_ends_a_worker_whose_strategy_is_built():
    """TensorFlow's preemption notifier takes SIGTERM in the strategy constructor; the harness gives it back."""
    ports = free_ports(2)
    workers = [_start(ports, i, "--hold", "300") for i in range(2)]
    try:
        for w in workers:
            line = w.stdout.readline()   # the JSON line once the strategy is built
            assert '"MultiWorkerMirroredStrategy"' in line, line + w.stderr.read()[-3000:]
        took = _ends_after(workers[1], lambda: workers[1].send_signal(signal.SIGTERM))
    finally:
        _kill(*workers)
    assert workers[1].returncode == -signal.SIGTERM and took < TERM_S, took
