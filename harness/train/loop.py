"""The training loop: one `tf.function` step run through a `tf.distribute` strategy, for every backend.

Under tf.distribute each replica divides its summed per-example loss by the global batch and the optimizer's
`apply_gradients` all-reduces (sums) the gradients across replicas (tensorflow.org/tutorials/distribute/
custom_training). Under Horovod the strategy is the default one, each rank divides by its own batch and
`hvd.DistributedGradientTape` averages the gradients (`gradient_tape` seam). Loss scaling happens exactly once:
the scaled loss is differentiated, the gradients are reduced across replicas or ranks and unscaled once.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import sys
from typing import Callable, Sequence

import tensorflow as tf
import tf_keras as keras
from tqdm import tqdm

from harness.errors import NonFiniteLossError
from harness.profile.timing import StepTimer
from harness.train import metrics

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How long to train and how examples are counted.

    Attributes:
      epochs: epochs to run in all (a resumed run continues up to this number).
      steps_per_epoch: optimizer steps per epoch, the same on every worker (see `harness.distribute.batch`).
      global_batch_size: examples per step over all replicas.
      loss_divisor: what each replica divides its summed loss by: the global batch under tf.distribute, the
        per-rank batch under Horovod (whose tape averages).
      validation_steps: evaluation steps per epoch (0: no validation).
      warmup_steps: first steps excluded from timing summaries (tracing, cache fill).
    """

    epochs: int
    steps_per_epoch: int
    global_batch_size: int
    loss_divisor: int
    validation_steps: int = 0
    warmup_steps: int = 2


def _per_example_loss(labels, logits, class_weights):
    """Sparse softmax cross-entropy per example, `[batch]` float32; pixel losses are averaged per patch."""
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))
    if class_weights is not None:
        losses *= tf.gather(class_weights, labels)
    if losses.shape.rank > 1:
        losses = tf.reduce_mean(tf.reshape(losses, [tf.shape(losses)[0], -1]), axis=1)
    return losses


def clip_after_reduction(grads, clip_norm: float):
    """Sum `grads` over the replicas in sync (what `apply_gradients` would do), then clip them to `clip_norm` by
    their global norm (`tf.clip_by_global_norm`): the norm is the update's, the same on every replica, not one
    replica's share. Under Horovod the tape has already averaged over the ranks and the default strategy's one
    replica sums nothing."""
    reduced = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, list(grads))
    return tf.clip_by_global_norm(reduced, clip_norm)[0]


class Trainer:
    """Runs training and evaluation steps of `model` under `strategy`.

    Args (keyword-only):
      model: Keras model, built under `strategy.scope()`; maps inputs to logits `[batch, ..., classes]` float32.
      optimizer: Keras optimizer, already wrapped by `precision.wrap_optimizer` when loss scaling is needed.
      strategy: the `tf.distribute.Strategy` (the default strategy under Horovod).
      context: the `WorkerContext` (chief or not, rank, replicas).
      config: `LoopConfig`.
      class_weights: optional `[classes]` float32 weights multiplying each example's (pixel's) loss.
      gradient_tape: seam for Horovod: wraps the `tf.GradientTape` (e.g. `hvd.DistributedGradientTape`).
      cross_rank_sum: seam for Horovod: sums a tensor across ranks (identity under tf.distribute, whose
        `strategy.reduce` already spans all workers). The step's loss is averaged with it, so every rank sees the
        same loss and stops at the same step.
      after_first_step: seam for Horovod: called once after the first step, when the optimizer's slots exist
        (broadcast of rank 0's variables).
      step_hooks: objects with `before_step(step)` and `after_step(step)` (step: the 1-based global number of the
        step), called around each training step outside its timed span (e.g. the profiler's trace window).
      timer: the `StepTimer` to record steps in (default: a new one with `config.warmup_steps`).
      loss_fn: `fn(labels, logits, class_weights) -> [batch]` float32 per-example loss (`harness.train.losses`);
        default `_per_example_loss`. Summed and divided by `config.loss_divisor`; evaluation passes no weights.
      clip_norm: clip the gradients to this global norm after the cross-replica reduction and loss unscaling
        (`clip_after_reduction`); None: no clipping.
    """

    def __init__(self, *, model, optimizer, strategy, context, config: LoopConfig, class_weights=None,
                 gradient_tape: Callable | None = None, cross_rank_sum: Callable | None = None,
                 after_first_step: Callable[[], None] | None = None, step_hooks: Sequence = (),
                 timer: StepTimer | None = None, clip_norm: float | None = None, loss_fn: Callable | None = None):
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.context, self.config = context, config
        self.class_weights = None if class_weights is None else tf.constant(class_weights, tf.float32)
        self._wrap_tape = gradient_tape or (lambda tape: tape)
        self._cross_rank_sum = cross_rank_sum or (lambda x: x)
        self._after_first_step = after_first_step
        self._ranks = context.num_workers if cross_rank_sum else 1
        self._scaling = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
        self.timer = timer or StepTimer(config.warmup_steps)
        self.step_hooks = tuple(step_hooks)
        self.clip_norm = clip_norm
        self._loss_fn = loss_fn or _per_example_loss
        self.train_step = tf.function(self._train_step)
        self.eval_step = tf.function(self._eval_step)

    # --- steps ----------------------------------------------------------------------------------------------
    def _replica_train_step(self, inputs, labels):
        model, opt = self.model, self.optimizer
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = tf.reduce_sum(self._loss_fn(labels, logits, self.class_weights)) / self.config.loss_divisor
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = opt.get_scaled_loss(loss) if self._scaling else loss
        grads = self._wrap_tape(tape).gradient(scaled, model.trainable_variables)
        if self._scaling:
            grads = opt.get_unscaled_gradients(grads)
        if self.clip_norm is not None:
            grads = clip_after_reduction(grads, self.clip_norm)  # reduced here: the optimizer must not sum again
            opt.apply_gradients(zip(grads, model.trainable_variables), skip_gradients_aggregation=True)
            return loss
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def _train_step(self, batch):
        per_replica = self.strategy.run(self._replica_train_step, args=batch)
        loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return self._cross_rank_sum(loss) / self._ranks

    def _replica_eval_step(self, inputs, labels):
        logits = self.model(inputs, training=False)
        loss = tf.reduce_sum(self._loss_fn(labels, logits, None))
        examples = tf.cast(tf.shape(labels)[0], tf.float32)
        return tf.stack([loss, examples]), metrics.confusion_counts(labels, logits, logits.shape[-1])

    def _eval_step(self, batch):
        per_replica = self.strategy.run(self._replica_eval_step, args=batch)
        return tuple(self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for v in per_replica)

    # --- loops ----------------------------------------------------------------------------------------------
    def evaluate(self, iterator, steps: int) -> dict:
        """Run `steps` evaluation steps; returns `val_loss` and the metrics of one int64 confusion matrix summed
        over all replicas, workers and ranks (`harness.train.metrics.from_confusion`: val_accuracy, val_mean_iou,
        per-class val_precision/val_recall/val_f1/val_iou, val_confusion_matrix).

        Accuracy and the matrix count pixels for image masks, examples for tables.
        """
        totals, matrix = tf.zeros([2]), None
        for _ in range(steps):
            sums, counts = self.eval_step(next(iterator))
            totals, matrix = totals + sums, counts if matrix is None else matrix + counts
        loss, examples = self._cross_rank_sum(totals).numpy().tolist()
        return {"val_loss": loss / max(examples, 1.0), **metrics.from_confusion(self._cross_rank_sum(matrix))}

    def fit(self, train_iterator, *, validation: Callable[[], object] | None = None, initial_step: int = 0,
            on_epoch_end: Sequence[Callable[[int, dict], None]] = ()) -> list[dict]:
        """Train from global step `initial_step` (a multiple of steps_per_epoch) to epochs × steps_per_epoch.

        Args:
          train_iterator: iterator over distributed `(inputs, labels)` batches; never exhausted (the dataset
            repeats), so an epoch ends by step count on every worker alike.
          validation: returns a fresh iterator over the validation set, or None.
          on_epoch_end: callables `(epoch, logs)`, e.g. the backup.
        Returns:
          one logs dict per epoch run: loss, val_loss/val_accuracy when validating, examples_per_s,
          input_stall_share, steps.
        Raises:
          NonFiniteLossError: when the loss of a step is NaN or infinite (all workers see the same reduced loss,
            so all stop at the same step).
        """
        cfg, history = self.config, []
        first_epoch = initial_step // cfg.steps_per_epoch
        step = initial_step
        for epoch in range(first_epoch, cfg.epochs):
            bar = tqdm(total=cfg.steps_per_epoch, desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False,
                       disable=not (self.context.is_chief and sys.stderr.isatty()))
            first_timed = len(self.timer.steps)
            loss_sum = 0.0
            for _ in range(cfg.steps_per_epoch):
                for hook in self.step_hooks:
                    hook.before_step(step + 1)
                mark = self.timer.begin()
                batch = next(train_iterator)
                self.timer.got_input(mark)
                loss = float(self.train_step(batch))
                if self._after_first_step is not None:
                    self._after_first_step()
                    self._after_first_step = None
                step += 1
                self.timer.end(mark, step, cfg.global_batch_size)
                for hook in self.step_hooks:
                    hook.after_step(step)
                if not math.isfinite(loss):
                    raise NonFiniteLossError(f"loss is {loss} at step {step} (epoch {epoch + 1}); lower the "
                                             "learning rate or check the input for NaN/inf values")
                loss_sum += loss
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.close()
            logs = {"epoch": epoch + 1, "step": step, "loss": loss_sum / cfg.steps_per_epoch}
            if validation is not None and cfg.validation_steps:
                logs.update(self.evaluate(validation(), cfg.validation_steps))
            logs.update(self.timer.summary(self.timer.steps[first_timed:]))
            history.append(logs)
            if self.context.is_chief:
                print(format_epoch(logs, cfg.epochs), flush=True)
            for callback in on_epoch_end:
                callback(epoch + 1, logs)
        return history


def format_epoch(logs: dict, epochs: int) -> str:
    """One line per epoch: `epoch 2/5 step 40: loss 0.41 val_loss 0.45 val_accuracy 0.83 | 812 examples/s,
    input stall 3.1%`."""
    parts = [f"epoch {logs['epoch']}/{epochs} step {logs['step']}: loss {logs['loss']:.4f}"]
    for key in ("val_loss", "val_accuracy", "val_mean_iou"):
        if key in logs:
            parts.append(f"{key} {logs[key]:.4f}")
    return " ".join(parts) + (f" | {logs['examples_per_s']:.1f} examples/s, "
                              f"input stall {100 * logs['input_stall_share']:.1f}%")
