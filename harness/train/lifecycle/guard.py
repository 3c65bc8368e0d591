"""The run's protections as one object: what keeps a run whole through a Ctrl-C, a preemption, a stuck or lost peer,
and early stopping, handed to the controller as its ordered actions (`harness.train.loop.controller`, module doc).

    guard = Guard(backend, backup, initial_step=step, cluster=cluster, stopper=stopper, peer_timeout_s=bound)
    run = build_run(..., guard=guard, backup=backup)   # the controller gets `guard.actions(run.trainer)`
    try: run.controller.fit(...)
    finally: guard.close()

The order, and why:
  - after each call: the Ctrl-C check (`interrupt.Check`), the watchdog's beat (`watchdog.Watchdog`, workers > 1),
    then the preemption check (`preemption.Preemption`: a collective on every worker at the same call; a SIGTERM
    asks the controller for a backup at that step, and the preemption exits after it);
  - at an epoch end, before the backup: the backend's model-state alignment (Horovod: BatchNormalization statistics
    averaged over the ranks, so the backup holds the same state on every rank), then early stopping's record (its
    state is in the backup);
  - after the backup and the user's callbacks: the ranks wait for the chief's writes on the control plane
    (`ChiefWrites`, before the watchdog re-arms: a write is not a step's length), early stopping's decision, the
    watchdog's beat, the Ctrl-C check.
A fault kind that needs a check at a call boundary or an epoch end is one more action here.
"""
from __future__ import annotations

from typing import Optional

from harness.train.lifecycle import interrupt, watchdog as watchdog_lib
from harness.train.lifecycle.preemption import Preemption
from harness.train.loop.controller import EpochEnd


class Guard:
    """The run's protections.

    Args:
      backend: the `TrainingBackend` (its context, epoch-end alignment and cross-worker sums).
      backup: the run's `harness.train.lifecycle.backup.Backup` (named by the preemption's and watchdog's lines).
      initial_step: the global step the run starts from.
      cluster: `harness.train.lifecycle.peers.Cluster` (each worker's host); None on one worker.
      stopper: `harness.train.lifecycle.early_stopping.EarlyStopping`, or None.
      peer_timeout_s: the step-progress watchdog's bound (seconds; `HARNESS_PEER_TIMEOUT_S`); the watchdog runs
        only with several workers (one process has no peer to wait for).
    """

    def __init__(self, backend, backup, *, initial_step: int = 0, cluster=None, stopper=None,
                 peer_timeout_s: Optional[float] = None, data_service: str = ""):
        self.backend, self.backup, self.cluster, self.stopper = backend, backup, cluster, stopper
        self.data_service = data_service or ""
        self.peer_timeout_s = peer_timeout_s
        self.preemption = Preemption(backend, backup, initial_step,
                                     hosts=cluster.hosts if cluster is not None else None)
        self.watchdog: Optional[watchdog_lib.Watchdog] = None

    def actions(self, trainer) -> tuple:
        """The controller's actions, in order (module doc); starts the watchdog's thread (workers > 1, or a
        tf.data service feeding the input: its workers are peers too), whose message reads `trainer.progress`."""
        if (self.backend.context.num_workers > 1 or self.data_service) and self.cluster is not None:
            describe = watchdog_lib.stalled(self.cluster, self.backup, self.peer_timeout_s, trainer.progress,
                                            self.data_service)
            self.watchdog = watchdog_lib.Watchdog(describe, bound_s=self.peer_timeout_s, linger_s=describe.linger_s)
        aligned = tuple(EpochEnd(fn) for fn in self.backend.epoch_end_callbacks(trainer.model))
        return (ChiefWrites(self.backend), interrupt.Check(), *((self.watchdog,) if self.watchdog else ()),
                self.preemption, *aligned,
                *((self.stopper,) if self.stopper else ()))

    def close(self) -> None:
        """Stop the watchdog's thread (the run ended, or failed)."""
        if self.watchdog is not None:
            self.watchdog.close()


class ChiefWrites:
    """The action after an epoch's end (`after_epoch_end`): `backend.wait_for_chief()`, every rank waits there for
    the chief's writes, not in the next step's collective (Horovod's stall inspector: `HorovodBackend`)."""

    def __init__(self, backend):
        self.backend = backend

    def after_epoch_end(self, epoch: int, logs: dict) -> None:
        self.backend.wait_for_chief()
