"""The one place a trainer and an evaluator are built: from the backend, the model, the optimizer, the loss and the
epoch plan, as `harness train` builds them. `harness train`, its input-cost probe, `harness bench train` and every
script in `benchmarks/` call these, so a benchmark times the step users run: the same loss divisor
(`backend.loss_divisor(plan)`), the same backend seams (Horovod's tape and cross-rank sums), the same global batch.
"""
from __future__ import annotations

from typing import Callable, Optional

from harness.distribute.batch import BatchSizes, batch_sizes
from harness.train.evaluator import Evaluator
from harness.train.trainer import StepProgress, Trainer, per_example_cross_entropy


def synthetic_batch(backend, per_replica_batch_size: int) -> BatchSizes:
    """The batch sizes of a run without shards (synthetic batches, benchmarks): `per_replica_batch_size` on each
    of the backend's replicas in sync, over its workers (`harness.distribute.batch.batch_sizes`)."""
    c = backend.context
    replicas_per_worker = c.replicas_in_sync // max(c.num_workers, 1)
    return batch_sizes(workers=c.num_workers, replicas_per_worker=replicas_per_worker,
                       per_replica_batch_size=per_replica_batch_size)


def make_trainer(backend, model, optimizer, plan, *, loss_fn: Optional[Callable] = None, class_weights=None,
                 clip_norm: Optional[float] = None) -> Trainer:
    """The run's `Trainer`.

    Args:
      backend: `harness.distribute.backend.TrainingBackend` (or `HorovodBackend`).
      model, optimizer: built under `backend.scope()`; the optimizer wrapped for loss scaling where the policy
        needs it (`precision.wrap_optimizer`).
      plan: the epoch plan (`harness.distribute.plan.Plan`) or its `BatchSizes` (`synthetic_batch` for runs without
        shards): the global batch and what each replica divides its summed loss by come from it.
      loss_fn: per-example loss `fn(labels, logits, class_weights) -> [batch]` float32 (`harness.train.losses`);
        default sparse softmax cross-entropy (`trainer.per_example_cross_entropy`).
      class_weights: optional float32 `[classes]`.
      clip_norm: global-norm gradient clipping after the reduction, or None.
    With several workers the trainer counts its batches and steps (`trainer.StepProgress`), so the step-progress
    watchdog can tell a worker waiting for its own input from one waiting for its peers.
    """
    batch = getattr(plan, "batch", plan)
    progress = StepProgress() if backend.context.num_workers > 1 else None
    return Trainer(backend=backend, model=model, optimizer=optimizer, loss_fn=loss_fn or per_example_cross_entropy,
                   loss_divisor=backend.loss_divisor(batch), global_batch_size=batch.global_batch_size,
                   class_weights=class_weights, clip_norm=clip_norm, progress=progress)


def make_evaluator(backend, model, metrics, *, loss_fn: Optional[Callable] = None) -> Evaluator:
    """The run's `Evaluator`: `metrics` (`harness.train.metrics.for_task`) of `model` over a whole validation set,
    every replica scoring with the model state that is saved (`backend.align_model_state` before each pass)."""
    return Evaluator(backend=backend, model=model, loss_fn=loss_fn or per_example_cross_entropy, metrics=metrics,
                     before_evaluate=lambda: backend.align_model_state(model))
