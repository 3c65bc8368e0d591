"""Preemption: SIGTERM to any worker makes every worker write one backup at the same step and exit retryable.

Kubernetes evicts or preempts a pod with SIGTERM and kills it SIGKILL after its grace period (30 s by default);
often only one pod of a job gets it. The model is tf.distribute's `PreemptionCheckpointHandler`
(tensorflow/python/distribute/failure_handling/failure_handling.py), which agrees through the coordination
service on the step to save at. Here the agreement rides on the call boundaries the controller already has: the
SIGTERM handler (`harness.train.interrupt`) only notes the step, and after each call of K steps every worker
sums a vector of one int32 per worker (`TrainingBackend.sum_over_workers`, one all-reduce; none on one worker):
worker w's entry is 1 + the step SIGTERM reached it at, 0 if none did. Any entry non-zero: every worker writes the
backup at the step the call ended at (the same on all: calls are the same on every worker), waits for the others
(a second sum, so that no worker exits, and no launcher kills the chief, before the chief's backup is whole), and
raises `PreemptedError` (exit 138, retried by the operators). No step is lost: the backup holds the call's steps,
and the resumed run continues the epoch at the next batch (`harness.data.pipeline._epochs`).

The check costs one small all-reduce per call: `stats()` says how much (seconds per call, measured).
"""
from __future__ import annotations

import os
import socket
import time

import numpy as np

from harness.errors import PreemptedError
from harness.train import interrupt


class Preemption:
    """The check after each call: `after_call(step)` (`harness.train.controller.Controller`'s `on_call_end`).

    Args:
      backend: the `TrainingBackend` (its `sum_over_workers` and `context`).
      backup: the job's `harness.train.checkpoint.Backup` (every worker calls its `save`).
      initial_step: the global step the run starts from (the first call boundary).
    """

    def __init__(self, backend, backup, initial_step: int = 0):
        self.backend, self.backup = backend, backup
        self.workers, self.rank = backend.context.num_workers, backend.context.rank
        self.collective_s: list[float] = []   # wall time of each call's check (seconds), workers > 1
        interrupt.at_boundary(initial_step)

    def after_call(self, step: int) -> None:
        """After the call that ended at global step `step`: if SIGTERM reached any worker, back up at `step` on
        every worker and raise.

        Raises:
          PreemptedError: naming the worker(s) SIGTERM reached (and this host, if it was this one), the step it
            arrived at, and the backup written at `step`.
        """
        arrived = interrupt.terminated_at()
        mine = np.zeros(self.workers, np.int32)
        if arrived is not None:
            mine[self.rank] = arrived + 1
        if self.workers > 1:
            t0 = time.perf_counter()
            signalled = self.backend.sum_over_workers(mine)
            self.collective_s.append(time.perf_counter() - t0)
        else:
            signalled = mine
        interrupt.at_boundary(step)
        if not signalled.any():
            return
        self.backup.save(step)
        if self.workers > 1:
            self.backend.sum_over_workers(np.zeros(self.workers, np.int32))  # everyone's save done: exit together
        raise PreemptedError(self.describe(signalled, step))

    def describe(self, signalled, step: int) -> str:
        """`SIGTERM on worker 1 (host h) at step 37: backup written at step 40 in OUT/backup; run the same
        command to resume` (the host where this process is the one SIGTERM reached)."""
        names = []
        for w in np.flatnonzero(signalled):
            host = f" (host {socket.gethostname()})" if w == self.rank else ""
            names.append(f"worker {w}{host} at step {int(signalled[w]) - 1}")
        return (f"SIGTERM on {', '.join(names)}: backup written at step {step} in "
                f"{os.path.abspath(self.backup.chief_dir)}; run the same command to resume")

    def stats(self) -> dict:
        """The check's cost: `{"calls", "mean_s", "max_s"}` (seconds per call; zeros on one worker, which runs no
        collective)."""
        s = self.collective_s
        return {"calls": len(s), "mean_s": float(np.mean(s)) if s else 0.0, "max_s": float(max(s)) if s else 0.0}
