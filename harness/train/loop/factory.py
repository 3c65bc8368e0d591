"""The one place a run's loop is built: `build_run` makes the `Trainer`, the `Evaluator` and the `Controller` from
the backend, the model, the optimizer, the loss and the epoch plan, as `harness train` builds them. `harness train`,
its input-cost probe, `harness bench train`, `harness train --tune` and every script in `benchmarks/` call it, so a
benchmark times the step users run: the same loss (`harness.train.model.losses.make_loss`), the same divisor
(`backend.loss_divisor(plan)`), the same backend seams (Horovod's tape and cross-rank sums), the same global batch.
`build_evaluator` is its validation pass alone, for `harness evaluate`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from harness.distribute.batch import BatchSizes, batch_sizes
from harness.train.loop.controller import Controller, Schedule
from harness.train.loop.evaluator import Evaluator
from harness.train.loop.trainer import StepProgress, Trainer
from harness.train.model import parts as parts_lib
from harness.train.report.console import EpochLines
from harness.train.report.progress import DEFAULT_INTERVAL_S


@dataclasses.dataclass(frozen=True)
class Run:
    """A run's loop: `controller.fit(...)` trains with `trainer` and scores with `evaluator` (None without
    validation metrics)."""

    controller: Controller
    trainer: Trainer
    evaluator: Optional[Evaluator]


def synthetic_batch(backend, per_replica_batch_size: int) -> BatchSizes:
    """The batch sizes of a run without shards (synthetic batches, benchmarks): `per_replica_batch_size` on each
    of the backend's replicas in sync, over its workers (`harness.distribute.batch.batch_sizes`)."""
    c = backend.context
    replicas_per_worker = c.replicas_in_sync // max(c.num_workers, 1)
    return batch_sizes(workers=c.num_workers, replicas_per_worker=replicas_per_worker,
                       per_replica_batch_size=per_replica_batch_size)


def build_run(backend, model, optimizer, plan, schedule: Schedule, *, loss_fn: Optional[Callable] = None,
              class_weights=None, clip_norm: Optional[float] = None, metrics=None, actions: Sequence = (),
              guard=None, backup=None, callbacks=None, timer=None, epoch_lines: bool = True,
              progress_s: float | None = DEFAULT_INTERVAL_S) -> Run:
    """The run's `Run(controller, trainer, evaluator)`; the only constructor of the three.

    Args:
      backend: `harness.distribute.backend.TrainingBackend` (or `HorovodBackend`).
      model, optimizer: built under `backend.scope()`; the optimizer wrapped for loss scaling where the policy
        needs it (`harness.train.model.precision.wrap_optimizer`).
      plan: the epoch plan (`harness.distribute.plan.Plan`) or its `BatchSizes` (`synthetic_batch` for runs without
        shards): the global batch and what each replica divides its summed loss by come from it.
      schedule: epochs, steps per epoch, K, warm-up steps (`harness.train.loop.controller.Schedule`).
      loss_fn: per-example loss `fn(labels, logits, class_weights) -> [batch]` float32; default the sparse softmax
        cross-entropy (`harness.train.model.parts.default_loss`).
      class_weights: optional float32 `[classes]`.
      clip_norm: global-norm gradient clipping after the reduction, or None.
      metrics: validation metrics (`harness.train.model.metrics.for_task`); None: no evaluator.
      actions: the controller's actions in order (reporting: TensorBoard, the profiler's trace window), run after
        the epoch line.
      guard: the run's protections (`harness.train.lifecycle.guard.Guard`): its `actions(trainer)` follow
        `actions`; None: none.
      backup: the `Backup` the controller writes at each epoch end and when an action asks, or None.
      callbacks: the user's `KerasCallbacks`, or None.
      timer: a `StepTimer` (the profiler's), or None for the controller's own.
      epoch_lines: the chief prints one line per epoch (`harness.train.report.console`) and its progress within
        one (`harness.train.report.progress`, every `progress_s` seconds where not on a terminal); False for
        probes: neither.
    With several workers (or a tf.data service feeding the input) the trainer counts its batches and steps
    (`trainer.StepProgress`), so the step-progress watchdog can tell a worker waiting for its own input from one
    waiting for its peers.
    """
    batch = getattr(plan, "batch", plan)
    loss_fn = loss_fn or parts_lib.default_loss()
    watched = backend.context.num_workers > 1 or bool(guard is not None and getattr(guard, "data_service", ""))
    progress = StepProgress() if watched else None
    trainer = Trainer(backend=backend, model=model, optimizer=optimizer, loss_fn=loss_fn,
                      loss_divisor=backend.loss_divisor(batch), global_batch_size=batch.global_batch_size,
                      class_weights=class_weights, clip_norm=clip_norm, progress=progress)
    evaluator = build_evaluator(backend, model, loss_fn, metrics) if metrics is not None else None
    ordered = ((EpochLines(backend.context, schedule.epochs),) if epoch_lines else ()) + tuple(actions)
    if guard is not None:
        ordered += tuple(guard.actions(trainer))
    controller = Controller(trainer, schedule, context=backend.context, evaluator=evaluator, actions=ordered,
                            backup=backup, callbacks=callbacks, timer=timer,
                            progress_s=progress_s if epoch_lines else None)
    return Run(controller, trainer, evaluator)


def build_evaluator(backend, model, loss_fn: Callable, metrics) -> Evaluator:
    """The validation pass of `build_run`'s runs, alone (`harness evaluate`: a trained model scored on an export):
    `Evaluator` with the backend's model-state alignment before each pass."""
    return Evaluator(backend=backend, model=model, loss_fn=loss_fn, metrics=metrics,
                     before_evaluate=lambda: backend.align_model_state(model))
