"""How the launchers stop: the signals they catch and forward, the bounded stop of process trees, and the exit
code and one-line description a launcher derives from the worker (or rank) that failed first.

Codes follow Kubernetes' training-operator (`IsRetryableExitCode`, see `harness.exit_codes`): a launcher passes a
worker's harness code on as it is (2 permanent, 138 retryable, 130 interrupted); any other code is retryable when
the operator retries it (128 + SIGINT / SIGKILL / SIGTERM: 130, 137, 143) and passed on as the shell reports it,
else permanent (2): e.g. 1 (a traceback), 139 (a segfault), a SIGABRT's 134 unless a peer was lost before it
(then 138: `launcher_code`'s `peer_lost`). A launcher stopped by SIGTERM (an eviction, a
preemption, `kill`) exits 138 (`harness.errors.PreemptedError`): what a worker stopped by SIGTERM exits with, so a
job reads the same whether its pod ran the launcher or a worker; one stopped by SIGINT exits 130.
"""
from __future__ import annotations

import os
import re
import signal
import threading
from typing import Iterable, Optional

import psutil

from harness import exit_codes

# Seconds between the forwarded signal and SIGKILL: time for the workers to write their backup at the next step
# boundary (harness.errors.PreemptedError), within Kubernetes' default terminationGracePeriodSeconds (30 s) with 5 s
# left for the launcher to reap them and exit before the kubelet's own SIGKILL.
GRACE_S = 25.0
FORWARDED = (signal.SIGTERM, signal.SIGINT)


# A SIGABRT (134) is a C++ check that failed, permanent; but TensorFlow's gRPC server also aborts the process when
# a peer is lost: the collective fails ("StartAbort UNAVAILABLE", "Deadline Exceeded", "Socket closed"), then the
# server's Stop() aborts ("grpc_server_lib.cc ... Clean shutdown is not currently implemented", tensorflow#60706,
# #31917). A worker's 134 after such a line in its own output, or after a peer of the same launch had already
# ended, is the peer's fault: retryable (138).
SIGABRT_CODE = 128 + signal.SIGABRT
PEER_LOST_LINE = re.compile(
    r"StartAbort (UNAVAILABLE|DEADLINE_EXCEEDED|ABORTED)|Socket closed|Connection reset by peer|failed to connect to "
    r"all addresses|Deadline Exceeded|is down, aborting collectives|PeerLostError|Connection refused", re.IGNORECASE)


def peer_lost_line(line: str) -> bool:
    """Whether a worker's output `line` says a peer of the collective is gone (TensorFlow's gRPC and collective
    errors, the harness's own `PeerLostError`)."""
    return bool(PEER_LOST_LINE.search(line))


def is_abort(code: int) -> bool:
    """Whether `code` (as `Popen.returncode` or a shell's) is SIGABRT's."""
    return exit_codes.shell_code(code) == SIGABRT_CODE


def launcher_code(code: int, peer_lost: Optional[str] = None) -> int:
    """The launcher's exit code for a failed worker's `code` (a `Popen.returncode`: -N for signal N, or the
    shell's 128 + N as mpirun and horovodrun report it); see the module doc. A SIGABRT with `peer_lost` (what says
    a peer was lost before it) is retryable (138)."""
    if code in (exit_codes.PERMANENT, exit_codes.RETRYABLE, exit_codes.INTERRUPTED):
        return code
    if is_abort(code) and peer_lost:
        return exit_codes.RETRYABLE
    return exit_codes.shell_code(code) if exit_codes.is_retryable(code) else exit_codes.PERMANENT


def describe(code: int, peer_lost: Optional[str] = None) -> str:
    """`exited with code -9 (SIGKILL, 137 to the shell), retryable` / `exited with code 2, permanent`: how a
    worker ended (`code` as `Popen.returncode` or as mpirun / horovodrun report it) and whether training-operator's
    rule retries it. A SIGABRT says whether a peer was lost before it (`peer_lost`: what says so, or None)."""
    if is_abort(code):
        how = _how(code)
        if peer_lost:
            return (f"{how} after a lost peer ({peer_lost}), retryable: TensorFlow's gRPC server aborts when a "
                    "peer of its collective is lost")
        return f"{how}, permanent: a C++ abort (a failed check) with no lost peer before it"
    return f"{_how(code)}, {'retryable' if exit_codes.is_retryable(code) else 'permanent'}"


def _how(code: int) -> str:
    shell = exit_codes.shell_code(code)
    number = shell - 128
    name = signal.Signals(number).name if shell > 128 and number in signal.valid_signals() else None
    if code < 0 and name:
        how = f"exited with code {code} ({name}, {shell} to the shell)"
    elif name and code not in (exit_codes.RETRYABLE, exit_codes.INTERRUPTED):   # the harness's own codes
        how = f"exited with code {code} ({name})"
    else:
        how = f"exited with code {code}"
    return how


class StopSignals:
    """Context manager: while inside, SIGTERM and SIGINT to this process are recorded (the first one in `signum`)
    instead of ending it, so the launcher can forward them and stop its workers in bounded time. The previous
    handlers come back on exit. Outside the main thread (where Python cannot set handlers) it records nothing."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous = {}

    def _record(self, signum, frame):
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in FORWARDED:
                self._previous[s] = signal.signal(s, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def family(pid: int) -> list[psutil.Process]:
    """The process `pid` and all its descendants (empty when it is gone). List them before signalling: mpirun and
    horovodrun put ranks in process groups of their own, and a rank whose parent died is no longer a descendant."""
    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def stop_tree(procs: Iterable[psutil.Process], groups: Iterable[int], signum: int = signal.SIGTERM,
              grace_s: float = GRACE_S) -> list[psutil.Process]:
    """Send `signum` to the process groups `groups` and to each of `procs`, wait up to `grace_s` seconds, then
    SIGKILL the groups and whatever of `procs` is left. Returns the processes that needed SIGKILL. Bounded:
    returns within `grace_s` plus a few seconds."""
    procs, groups = list(procs), list(groups)
    for g in groups:
        _killpg(g, signum)
    for p in procs:
        try:
            p.send_signal(signum)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for g in groups:
        _killpg(g, signal.SIGKILL)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return alive


def _killpg(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass
