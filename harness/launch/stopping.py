"""How the launchers stop: the signals they catch and forward, the bounded stop of process trees, and the exit
code and one-line description a launcher derives from the worker (or rank) that failed first.

Codes follow Kubernetes' training-operator (`IsRetryableExitCode`, see `harness.exit_codes`): a launcher passes a
worker's harness code on as it is (2 permanent, 138 retryable, 130 interrupted); any other code is retryable when
the operator retries it (128 + SIGINT / SIGKILL / SIGTERM: 130, 137, 143) and passed on as the shell reports it,
else permanent (2): e.g. 1 (a traceback), 139 (a segfault). A launcher stopped by SIGTERM (an eviction, a
preemption, `kill`) exits 138 (`harness.errors.PreemptedError`): what a worker stopped by SIGTERM exits with, so a
job reads the same whether its pod ran the launcher or a worker; one stopped by SIGINT exits 130.
"""
from __future__ import annotations

import os
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


def launcher_code(code: int) -> int:
    """The launcher's exit code for a failed worker's `code` (a `Popen.returncode`: -N for signal N, or the
    shell's 128 + N as mpirun and horovodrun report it); see the module doc."""
    if code in (exit_codes.PERMANENT, exit_codes.RETRYABLE, exit_codes.INTERRUPTED):
        return code
    return exit_codes.shell_code(code) if exit_codes.is_retryable(code) else exit_codes.PERMANENT


def describe(code: int) -> str:
    """`exited with code -9 (SIGKILL, 137 to the shell), retryable` / `exited with code 2, permanent`: how a
    worker ended (`code` as `Popen.returncode` or as mpirun / horovodrun report it) and whether training-operator's
    rule retries it."""
    shell = exit_codes.shell_code(code)
    number = shell - 128
    name = signal.Signals(number).name if shell > 128 and number in signal.valid_signals() else None
    if code < 0 and name:
        how = f"exited with code {code} ({name}, {shell} to the shell)"
    elif name and code not in (exit_codes.RETRYABLE, exit_codes.INTERRUPTED):   # the harness's own codes
        how = f"exited with code {code} ({name})"
    else:
        how = f"exited with code {code}"
    return f"{how}, {'retryable' if exit_codes.is_retryable(code) else 'permanent'}"


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
