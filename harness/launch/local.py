"""`harness launch local --workers N -- CMD...`: N worker processes on this machine, one TF_CONFIG each.

Each worker gets `TF_CONFIG = {"cluster": {"worker": ["localhost:P0", ...]}, "task": {"type": "worker",
"index": i}}` (the format MultiWorkerMirroredStrategy reads, tensorflow.org/guide/distributed_training), its own
free port, and optionally its own slice of GPUs (`CUDA_VISIBLE_DEVICES`). Output lines are streamed with a
`[worker i]` prefix. When one worker fails the others are stopped and the launcher fails, naming the worker.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence

from harness.errors import ConfigError, WorkerFailedError

GRACE_S = 10.0  # seconds a worker gets between SIGTERM and SIGKILL


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on localhost right now (bound to port 0, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("localhost", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports: Sequence[int], index: int, host: str = "localhost") -> str:
    """TF_CONFIG JSON for worker `index` of a cluster of workers on `host` at `ports`."""
    return json.dumps({"cluster": {"worker": [f"{host}:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def worker_environments(workers: int, *, gpus_per_worker: int = 0, base: Mapping[str, str] | None = None
                        ) -> list[dict[str, str]]:
    """The environment of each worker: `base` (default: this process's) plus TF_CONFIG and, with GPUs,
    CUDA_VISIBLE_DEVICES = this worker's `gpus_per_worker` devices."""
    base = dict(os.environ if base is None else base)
    ports = free_ports(workers)
    envs = []
    for i in range(workers):
        env = dict(base, TF_CONFIG=tf_config(ports, i), PYTHONUNBUFFERED="1")
        if gpus_per_worker:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(i * gpus_per_worker,
                                                                         (i + 1) * gpus_per_worker))
        envs.append(env)
    return envs


def _stream(proc: subprocess.Popen, prefix: str, out) -> None:
    for line in proc.stdout:
        out.write(f"{prefix} {line}")
        out.flush()


def _stop(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _first_failure(procs: Sequence[subprocess.Popen]) -> str | None:
    """`worker i exited with code C` for the worker that failed, None while none has.

    When several have failed by the time we look, a worker killed by a signal is named first: it is the cause,
    and its peers' failures in their next collective the effect."""
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() not in (None, 0)]
    if not failed:
        return None
    i, code = min(failed, key=lambda f: (f[1] > 0, f[0]))
    name = f" ({signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else ""
    return f"worker {i} exited with code {code}{name}"


def run_local(command: Sequence[str], *, workers: int, gpus_per_worker: int = 0, timeout_s: float | None = None,
              out=None) -> None:
    """Run `command` as `workers` workers and wait for all of them.

    Raises:
      WorkerFailedError: when a worker exits non-zero (the others are stopped; the message names the first
        failure and its exit code), or when `timeout_s` seconds pass first (all are stopped).
      ConfigError: if `command` is empty or `workers < 1`.
    """
    if not command:
        raise ConfigError("no command to launch (put it after --)")
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    out = out or sys.stdout
    procs, threads = [], []
    for i, env in enumerate(worker_environments(workers, gpus_per_worker=gpus_per_worker)):
        # A new session per worker, so stopping it also stops whatever it started.
        p = subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        procs.append(p)
        t = threading.Thread(target=_stream, args=(p, f"[worker {i}]", out), daemon=True)
        t.start()
        threads.append(t)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    failure = None
    try:
        while failure is None and any(p.poll() is None for p in procs):
            failure = _first_failure(procs)
            if failure is None and deadline is not None and time.monotonic() > deadline:
                failure = f"timed out after {timeout_s:.0f} s with workers still running"
            time.sleep(0.1)
        if failure is None:
            failure = _first_failure(procs)
    finally:
        _stop(procs)
        for t in threads:
            t.join(timeout=5)
    if failure:
        raise WorkerFailedError(f"{failure}; stopped the other workers")
