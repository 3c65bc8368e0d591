"""Preemption: SIGTERM to any worker makes every worker write one backup at the same step and exit retryable.

Kubernetes evicts or preempts a pod with SIGTERM and kills it SIGKILL after its grace period (30 s by default);
often only one pod of a job gets it. The model is tf.distribute's `PreemptionCheckpointHandler`
(tensorflow/python/distribute/failure_handling/failure_handling.py), which agrees through the coordination
service on the step to save at. Here the agreement rides on the call boundaries the controller already has: the
SIGTERM handler (`harness.train.lifecycle.interrupt`) only notes the step, and after each call of K steps every worker
sums a vector of one int32 per worker (`TrainingBackend.sum_over_workers`, one all-reduce; none on one worker):
worker w's entry is 1 + the step SIGTERM reached it at, 0 if none did. Any entry non-zero: every worker writes the
backup at the step the call ended at (the same on all: calls are the same on every worker), waits for the others
(a second sum, so that no worker exits, and no launcher kills the chief, before the chief's backup is whole), and
raises `PreemptedError` (exit 138, retried by the operators). No step is lost: the backup holds the call's steps,
and the resumed run continues the epoch at the next batch (`harness.data.input.pipeline._epochs`).

The check costs one small all-reduce (~2.5-3 ms on 2 busy CPU cores, localhost: gRPC under MWMS, Gloo under
Horovod), negligible against a call of auto K (~0.25 s) but not against calls of a few fast steps. So the first
`MEASURED_CALLS` calls are checked each, their mean wall time per step agreed (it rides in the same all-reduce),
and from then on a call is checked when it passes a multiple of `every_steps`, the steps of about
`CHECK_INTERVAL_S` (1 s: far inside a 30 s grace period); every worker computes the same `every_steps` from the
same sum and runs the same steps, so all check after the same calls, whatever K each call has. The backup is
written at the check after the signal: no step is lost, at most `CHECK_INTERVAL_S` (or one call) of waiting.
`stats()` says what the checks cost (seconds per check, measured).
"""
from __future__ import annotations

import os
import socket
import time

import numpy as np

from harness.errors import PreemptedError
from harness.train.lifecycle import interrupt

CHECK_INTERVAL_S = 1.0   # checks at about this interval once the calls are timed (seconds)
MEASURED_CALLS = 3       # calls checked each, and timed, before the stride is chosen


class Preemption:
    """The check after each call, an action of the controller (`harness.train.loop.controller`): `after_call(step)`
    asks for the backup at `step` when SIGTERM reached any worker, and `after_backup(step)` then exits.

    Args:
      backend: the `TrainingBackend` (its `sum_over_workers` and `context`).
      backup: the job's `harness.train.lifecycle.backup.Backup` (the controller writes it; named in the message).
      initial_step: the global step the run starts from (the first call boundary).
      hosts: each worker's host as the job names it (`harness.train.lifecycle.peers.Cluster.hosts`: TF_CONFIG's address,
        a Horovod rank's hostname), so every worker's line names the host SIGTERM reached; None: this process's
        hostname, on its own line only.
    """

    def __init__(self, backend, backup, initial_step: int = 0, hosts=None):
        self.backend, self.backup, self.hosts = backend, backup, hosts
        self.workers, self.rank = backend.context.num_workers, backend.context.rank
        self.collective_s: list[float] = []   # wall time of each check (seconds), workers > 1
        self.calls, self.every_steps = 0, 1
        self._step_us: list[float] = []   # the measured calls' wall time per step, mean over the workers (µs)
        self._last, self._step = time.perf_counter(), initial_step
        self._signalled = None   # per worker, 1 + the step SIGTERM reached it at: a backup was asked for
        interrupt.at_boundary(initial_step)

    def after_call(self, step: int) -> bool:
        """After the call that ended at global step `step`: whether SIGTERM reached any worker (the same answer
        on every worker), so that every worker backs up at `step` (`after_backup` then raises)."""
        now, self.calls = time.perf_counter(), self.calls + 1
        step_s, self._last = (now - self._last) / max(step - self._step, 1), now
        previous, self._step = self._step, step
        arrived = interrupt.terminated_at()
        interrupt.at_boundary(step)
        if (self.workers > 1 and self.calls > MEASURED_CALLS
                and step // self.every_steps == previous // self.every_steps):
            return False   # no multiple of every_steps passed: not checked (the same calls on every worker)
        mine = np.zeros(self.workers + 1, np.int32)   # per worker: 1 + the step SIGTERM came at; last: µs a step
        if arrived is not None:
            mine[self.rank] = arrived + 1
        if self.workers > 1:
            mine[-1] = min(int(step_s * 1e6), 2 ** 31 // self.workers - 1)
            t0 = time.perf_counter()
            summed = self.backend.sum_over_workers(mine)
            self.collective_s.append(time.perf_counter() - t0)
            self._step_us.append(int(summed[-1]) / self.workers)
            if self.calls == MEASURED_CALLS:   # every worker's mean, agreed: the same every_steps on all
                per_step = float(np.mean(self._step_us[1:] or self._step_us)) / 1e6   # the first call traces
                self.every_steps = int(min(100_000, max(1, round(CHECK_INTERVAL_S / max(per_step, 1e-6)))))
            signalled = summed[:-1]
        else:
            signalled = mine[:-1]
        if not signalled.any():
            return False
        self._signalled = signalled
        return True

    def after_backup(self, step: int) -> None:
        """After the backup the controller wrote at `step`: if it was this check's, wait for every worker's and
        raise.

        Raises:
          PreemptedError: naming the worker(s) SIGTERM reached (and this host, if it was this one), the step it
            arrived at, and the backup written at `step`.
        """
        if self._signalled is None:
            return
        if self.workers > 1:
            self.backend.sum_over_workers(np.zeros(self.workers + 1, np.int32))  # every save done: exit together
        raise PreemptedError(self.describe(self._signalled, step))

    def describe(self, signalled, step: int) -> str:
        """`SIGTERM on worker 1 (host h) at step 37: backup written at step 40 in OUT/backup; run the same
        command to resume` (the host: of every worker with `hosts`, else of this process only)."""
        names = []
        for w in np.flatnonzero(signalled):
            name = self.hosts[w] if self.hosts else socket.gethostname() if w == self.rank else None
            host = f" (host {name})" if name else ""
            names.append(f"worker {w}{host} at step {int(signalled[w]) - 1}")
        return (f"SIGTERM on {', '.join(names)}: backup written at step {step} in "
                f"{_where(self.backup.chief_dir)}; run the same command to resume")

    def stats(self) -> dict:
        """The checks' cost: `{"calls", "checks", "every_steps", "median_s", "max_s"}` (calls seen, checks run, a
        call checked when it passes a multiple of that many steps, seconds per check; no checks on one worker,
        which runs no collective)."""
        s = self.collective_s
        return {"calls": self.calls, "checks": len(s), "every_steps": self.every_steps,
                "median_s": float(np.median(s)) if s else 0.0, "max_s": float(max(s)) if s else 0.0}


def _where(folder: str) -> str:
    """`folder` as the message names it: absolute when local, as given when a URL (`gs://...`)."""
    return folder if "://" in folder else os.path.abspath(folder)
