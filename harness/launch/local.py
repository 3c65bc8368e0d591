"""`harness launch local --workers N -- CMD...`: N worker processes on this machine, one TF_CONFIG each.

Each worker gets `TF_CONFIG = {"cluster": {"worker": ["localhost:P0", ...]}, "task": {"type": "worker",
"index": i}}` (the format MultiWorkerMirroredStrategy reads, tensorflow.org/guide/distributed_training), its own
free port, and optionally its own slice of GPUs (`CUDA_VISIBLE_DEVICES`). Output lines are streamed with a
`[worker i]` prefix. When one worker fails the others are stopped and the launcher fails, naming the worker that
failed first and exiting with a code derived from its code (`harness.launch.stopping`). SIGTERM and SIGINT to the
launcher are forwarded to every worker's process group.

Network (`network`): by default ("private") the workers run in a network namespace of their own with loopback
only (`harness.launch.netns`): TensorFlow's server listens on every interface and runs any graph it is sent, so on
this host's network each worker's port would be open to every host that can reach this one. There, no other host
(and nothing on this host outside the namespace) reaches them; they also reach nothing beyond it, so a command that
names a URL (gs://, grpc://, https://) is refused before any worker starts. "host" runs them in this host's
network; that, and a machine where no namespace can be made, is said once on stderr with the ports, before any
worker starts.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence

from harness import choices
from harness.errors import ConfigError, PreemptedError, WorkerFailedError
from harness.launch import netns, stopping

GRACE_S = stopping.GRACE_S  # seconds a worker gets between the forwarded signal and SIGKILL
NETWORKS = choices.LOCAL_NETWORKS


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


def _stream(proc: subprocess.Popen, prefix: str, out, seen: dict | None = None, index: int = 0) -> None:
    for line in proc.stdout:
        out.write(f"{prefix} {line}")
        out.flush()
        if seen is not None and index not in seen and stopping.peer_lost_line(line):
            seen[index] = line.strip()   # the first line of this worker's that says a peer is gone


def _stop(procs: Sequence[subprocess.Popen], signum: int = signal.SIGTERM) -> None:
    """Send `signum` to the process group of every running worker, SIGKILL the groups still running after
    `GRACE_S` seconds. Bounded: returns within `GRACE_S` plus the time to reap."""
    for p in procs:
        if p.poll() is None:
            _killpg(p.pid, signum)
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _killpg(p.pid, signal.SIGKILL)
            p.wait()


def _killpg(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:   # ended between the poll and the signal
        pass


def _wait(index: int, proc: subprocess.Popen, exits: queue.Queue) -> None:
    exits.put((index, proc.wait()))


def run_local(command: Sequence[str], *, workers: int, gpus_per_worker: int = 0, timeout_s: float | None = None,
              out=None, network: str = "private", err=None) -> None:
    """Run `command` as `workers` workers and wait for all of them.

    The worker that failed first in time is the failure (its peers fail after it, in their next collective, or
    are ended by this launcher's stop: neither is named). SIGTERM and SIGINT to the launcher are forwarded to
    every worker's process group; workers still running `GRACE_S` seconds after a stop get SIGKILL.

    network: "private" (the workers in a namespace with loopback only; where none can be made here, they run in
      this host's network and `err` gets one line saying so, with the ports) or "host" (this host's network; the
      same line). `out`: the workers' prefixed output (default stdout); `err`: the launcher's notes (stderr).

    Raises:
      WorkerFailedError: when a worker exits non-zero (the others are stopped; one line names the worker that
        failed first, its address, its exit code and whether it is retryable; `exit_code` is
        `stopping.launcher_code` of its code), or when `timeout_s` seconds pass first (all are stopped; exit 2).
      PreemptedError: the launcher got SIGTERM (exit 138, retryable: see `harness.launch.stopping`).
      KeyboardInterrupt: the launcher got SIGINT (the CLI exits 130).
      ConfigError: if `command` is empty, `workers < 1`, `network` is not one of NETWORKS, or, with a private
        network, the command names a URL (it would need a network the workers do not have).
    """
    if not command:
        raise ConfigError("no command to launch (put it after --)")
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if network not in NETWORKS:
        raise ConfigError(f"--network must be one of {', '.join(NETWORKS)}, got {network!r}")
    urls = netns.needs_network(command) if network == "private" else []
    if urls:
        raise ConfigError(f"{' '.join(urls)}: the workers run in a private network namespace (loopback only, no route "
                          "out, its own localhost), which cannot reach it; pass --network host to run them in this "
                          "host's network (their ports are then open to other hosts: close them with a firewall)")
    out, err = out or sys.stdout, err or sys.stderr
    envs = worker_environments(workers, gpus_per_worker=gpus_per_worker)
    addresses = [json.loads(env["TF_CONFIG"])["cluster"]["worker"][i] for i, env in enumerate(envs)]
    private = _private_network(network, addresses, err)
    try:
        _run(command if private is None else private.wrap(command), envs, addresses, timeout_s, out)
    finally:
        if private is not None:
            private.__exit__(None, None, None)


def _private_network(network: str, addresses: Sequence[str], err) -> netns.PrivateNetwork | None:
    """An entered PrivateNetwork, or None (for "host", or where none can be made) after one line on `err` naming
    the ports open to other hosts."""
    reason = "--network host"
    if network == "private":
        try:
            private = netns.PrivateNetwork().__enter__()
        except netns.NamespaceError as e:
            reason = f"no private network namespace can be made here ({e.strerror})"
        else:
            return private
    ports = ", ".join(a.rsplit(":", 1)[1] for a in addresses)
    err.write(f"harness launch local: {reason}: the workers' TCP ports {ports} listen on every interface and are "
              "open to every host that can reach this one (TensorFlow's server runs any graph it is sent); close "
              "them to other hosts with a firewall\n")
    err.flush()
    return None


def _run(command: Sequence[str], envs, addresses, timeout_s, out) -> None:
    procs, threads, exits, seen = [], [], queue.Queue(), {}
    failure = timed_out = peer_lost = None
    with stopping.StopSignals() as stop:
        try:
            for i, env in enumerate(envs):
                # A new session per worker, so stopping it also stops whatever it started.
                p = subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
                procs.append(p)
                for target, args in ((_stream, (p, f"[worker {i}]", out, seen, i)), (_wait, (i, p, exits))):
                    t = threading.Thread(target=target, args=args, daemon=True)
                    t.start()
                    threads.append(t)
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            running = len(procs)
            # Exits in the order they happen (one waiting thread per worker), not by worker index.
            while running and failure is None and stop.signum is None:
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = f"timed out after {timeout_s:.0f} s with workers still running"
                    break
                try:
                    i, code = exits.get(timeout=0.1)
                except queue.Empty:
                    continue
                running -= 1
                if code != 0:
                    failure = (i, code)
                    if stopping.is_abort(code):   # a peer already gone, before the others are stopped
                        peer_lost = next((f"worker {j} had already exited with code {p.returncode}"
                                          for j, p in enumerate(procs) if j != i and p.poll() not in (None, 0)), None)
        finally:
            signum = stop.signum
            _stop(procs, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
            for t in threads:
                t.join(timeout=5)
    if failure:
        i, code = failure
        if stopping.is_abort(code) and peer_lost is None and i in seen:
            peer_lost = f"its line {seen[i][:160]!r}"
        raise WorkerFailedError(f"worker {i} {stopping.describe(code, peer_lost)}: the first to fail, at "
                                f"{addresses[i]}; stopped the other workers",
                                exit_code=stopping.launcher_code(code, peer_lost))
    if timed_out:
        raise WorkerFailedError(timed_out)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if signum is not None:
        raise PreemptedError(f"the launcher got {signal.Signals(signum).name}: forwarded it to the process groups "
                             f"of all {len(procs)} workers and stopped them; the same command resumes from the "
                             "last backup")
