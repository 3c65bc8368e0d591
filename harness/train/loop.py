"""The training loop: one `tf.function` step run through a `tf.distribute` strategy, for every backend.

Under tf.distribute each replica divides its summed per-example loss by the global batch and the optimizer's
`apply_gradients` all-reduces (sums) the gradients across replicas (tensorflow.org/tutorials/distribute/
custom_training). Under Horovod the strategy is the default one, each rank divides by its own batch and
`hvd.DistributedGradientTape` averages the gradients (`gradient_tape` seam). Loss scaling happens exactly once:
the scaled loss is differentiated, the gradients are reduced across replicas or ranks and unscaled once.

Steps per loop: one `tf.function` call runs K steps, drawing each batch with `next(iterator)` inside the function
(a `for _ in tf.range(K)` loop), as orbit's `StandardTrainer` (`steps_per_loop`) and Keras `Model.compile(...,
steps_per_execution=K)` do; the host waits for the device once per call, for the `[K]` per-step losses, and each
step's input wait is timed in the graph (`tf.timestamp()` before and after `next(iterator)`), so the input-stall
share needs no per-step host sync. A call never crosses an epoch end (validation, backup) nor the edges of a
step hook's window (inside the profiler's trace window each call is one step whose batch the host draws, as
before, so that the trace's input-pipeline analyzer finds the steps). Under Horovod the loop is the same: the
distributed tape still reduces the gradients inside each step.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import sys
from typing import Callable, Sequence

import tensorflow as tf
import tf_keras as keras
from tqdm import tqdm

from harness.errors import NonFiniteLossError
from harness.profile.timing import StepTimer
from harness.train import interrupt
from harness.train import metrics as metrics_lib

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
      steps_per_loop: steps per `tf.function` call (K), or None for auto (`choose_steps_per_loop`).
    """

    epochs: int
    steps_per_epoch: int
    global_batch_size: int
    loss_divisor: int
    validation_steps: int = 0
    warmup_steps: int = 2
    steps_per_loop: int | None = None

    def __post_init__(self):
        if self.steps_per_loop is not None and self.steps_per_loop < 1:
            raise ValueError(f"steps_per_loop must be >= 1 or None (auto), got {self.steps_per_loop}")


AUTO_TARGET_S = 0.25      # auto: one call lasts about this long (seconds), within orbit's usual 0.1-1 s
AUTO_MEASURED_CALLS = 3   # auto: calls of one step timed after warm-up before K is chosen
AUTO_MAX_STEPS = 1000


def choose_steps_per_loop(step_s: float, target_s: float = AUTO_TARGET_S, max_steps: int = AUTO_MAX_STEPS) -> int:
    """K for `steps_per_loop: auto`: the steps that fill about `target_s` seconds at `step_s` seconds per one-step
    call (which includes the per-call overhead, so K errs low), between 1 and `max_steps`."""
    if step_s <= 0:
        return max_steps
    return int(min(max_steps, max(1, round(target_s / step_s))))


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
        step), called for each step of a call before and after it, outside its timed span; a hook with `first`
        and `last` steps (the profiler's trace window) gets calls of one step from `first` to `last`.
      timer: the `StepTimer` to record steps in (default: a new one with `config.warmup_steps`).
      loss_fn: `fn(labels, logits, class_weights) -> [batch]` float32 per-example loss (`harness.train.losses`);
        default `_per_example_loss`. Summed and divided by `config.loss_divisor`; evaluation passes no weights.
      clip_norm: clip the gradients to this global norm after the cross-replica reduction and loss unscaling
        (`clip_after_reduction`); None: no clipping.
      before_evaluate: called before each evaluation on every worker (the backend's `align_model_state`: every
        replica scores with the model state that is saved).
      metrics: the evaluation's counts and ratios (`harness.train.metrics.Classification` / `Regression`);
        default: classification over the logits' last axis.
    """

    def __init__(self, *, model, optimizer, strategy, context, config: LoopConfig, class_weights=None,
                 gradient_tape: Callable | None = None, cross_rank_sum: Callable | None = None,
                 after_first_step: Callable[[], None] | None = None, step_hooks: Sequence = (),
                 timer: StepTimer | None = None, clip_norm: float | None = None, loss_fn: Callable | None = None,
                 metrics=None, before_evaluate: Callable[[], None] | None = None):
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
        self._metrics = metrics
        self._before_evaluate = before_evaluate
        self.train_step = tf.function(self._train_step)
        self.train_loop = tf.function(self._train_loop)
        self.eval_step = tf.function(self._eval_step)
        self.steps_per_loop = config.steps_per_loop   # None until auto has measured
        self._k_tensors = {}

    # --- steps ----------------------------------------------------------------------------------------------
    def _replica_train_step(self, inputs, labels, after=None):
        model, opt = self.model, self.optimizer
        if after is not None:  # start once `after` has run (the input-wait timestamp of `_train_loop`)
            with tf.control_dependencies([after]):
                inputs, labels = tf.nest.map_structure(tf.identity, (inputs, labels))
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
            applied = opt.apply_gradients(zip(grads, model.trainable_variables), skip_gradients_aggregation=True)
        else:
            applied = opt.apply_gradients(zip(grads, model.trainable_variables))
        with tf.control_dependencies([applied] if applied is not None else []):
            return tf.identity(loss)  # the step ends when its update is applied (the timestamp after it)

    def _train_step(self, batch):
        per_replica = self.strategy.run(self._replica_train_step, args=batch)
        loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return self._cross_rank_sum(loss) / self._ranks

    def _next_batch(self, iterator):
        """`next(iterator)` inside the loop function (a seam: tests count the batches drawn here)."""
        return next(iterator)

    def _train_loop(self, iterator, steps):
        """`steps` (int32 scalar tensor, so one trace serves every K) training steps in one call.

        Returns float64 `[3, steps]`, one tensor so the host fetches it at once: per step, the loss (not yet
        averaged over ranks), the seconds `next(iterator)` took (the input wait) and the seconds from the step's
        start to its update, both from `tf.timestamp()` in the graph.
        """
        losses = tf.TensorArray(tf.float32, size=steps)
        waits = tf.TensorArray(tf.float64, size=steps)
        durations = tf.TensorArray(tf.float64, size=steps)
        done = tf.constant(0.0)
        for i in tf.range(steps):
            tf.autograph.experimental.set_loop_options(parallel_iterations=1)  # one step at a time, in order
            with tf.control_dependencies([done]):      # after the previous step's update
                start = tf.timestamp()
            with tf.control_dependencies([start]):
                batch = self._next_batch(iterator)
            with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                got = tf.timestamp()
            # The step starts after `got` through its inputs alone (`after`: one Identity per batch tensor, on
            # the replica's device). A control block around the whole step put an edge from `got` on every op of
            # the model: ~40 µs more per step on the CPU (benchmarks/step_loop.py overhead case). With no edge at
            # all, `got` ran after the step's first ops and a step that never waited measured a 5-7% stall
            # (tests/train/test_probe.py).
            per_replica = self.strategy.run(functools.partial(self._replica_train_step, after=got), args=batch)
            loss = tf.cast(self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None), tf.float32)
            with tf.control_dependencies([loss]):
                end = tf.timestamp()
            done = loss
            losses = losses.write(i, loss)
            waits = waits.write(i, got - start)
            durations = durations.write(i, end - start)
        return tf.stack([tf.cast(losses.stack(), tf.float64), waits.stack(), durations.stack()])

    def _replica_eval_step(self, inputs, labels):
        logits = self.model(inputs, training=False)
        loss = tf.reduce_sum(self._loss_fn(labels, logits, None))
        examples = tf.cast(tf.shape(labels)[0], tf.float32)
        counting = self._metrics or metrics_lib.Classification(logits.shape[-1])
        return tf.stack([loss, examples]), counting.counts(labels, logits)

    def _eval_step(self, batch):
        per_replica = self.strategy.run(self._replica_eval_step, args=batch)
        return tuple(self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for v in per_replica)

    # --- loops ----------------------------------------------------------------------------------------------
    def evaluate(self, iterator, steps: int) -> dict:
        """Run `steps` evaluation steps; returns `val_loss` and the metrics of counts summed over all replicas,
        workers and ranks: for classification one int64 confusion matrix (`harness.train.metrics.from_confusion`:
        val_accuracy, val_mean_iou, per-class val_precision/val_recall/val_f1/val_iou, val_confusion_matrix), for
        regression val_rmse, val_mae, val_r2.

        Accuracy and the matrix count pixels for image masks, examples for tables; nodata labels are not counted.
        """
        if self._before_evaluate is not None:
            self._before_evaluate()
        totals, matrix = tf.zeros([2]), None
        for _ in range(steps):
            sums, counts = self.eval_step(next(iterator))
            totals, matrix = totals + sums, counts if matrix is None else matrix + counts
        loss, examples = self._cross_rank_sum(totals).numpy().tolist()
        results = self._metrics.results if self._metrics else metrics_lib.from_confusion
        return {"val_loss": loss / max(examples, 1.0), **results(self._cross_rank_sum(matrix))}

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
            so all stop at the same step). The check runs once per call: the error names the call's first
            non-finite step, and the call's later steps have run.
        """
        cfg, history = self.config, []
        step = initial_step
        for epoch in range(initial_step // cfg.steps_per_epoch, cfg.epochs):
            bar = tqdm(total=cfg.steps_per_epoch, desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False,
                       disable=not (self.context.is_chief and sys.stderr.isatty()))
            first_timed = len(self.timer.steps)
            loss_sum, end = 0.0, (epoch + 1) * cfg.steps_per_epoch
            while step < end:
                k, host_fed = self._steps_this_call(step, end, train_iterator)
                losses = self._run_call(train_iterator, step, k, host_fed)
                interrupt.check()  # a SIGINT whose KeyboardInterrupt TensorFlow swallowed (harness.train.interrupt)
                for i, loss in enumerate(losses):
                    if not math.isfinite(loss):
                        raise NonFiniteLossError(
                            f"loss is {loss} at step {step + i + 1} (epoch {epoch + 1}); lower the learning rate "
                            "or check the input for NaN/inf values")
                step += k
                loss_sum += float(sum(losses))
                bar.update(k)
                bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
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
            interrupt.check()
        return history

    def _run_call(self, iterator, step: int, k: int, host_fed: bool) -> list[float]:
        """Steps `step + 1 .. step + k` in one call of `train_loop`; records them in the timer and returns their
        losses (averaged over ranks), after the one wait for the device. `host_fed`: one step whose batch is
        drawn on the host and passed to `train_step` (a Python iterator; the profiler's trace window, whose
        input-pipeline analyzer finds steps by the host's `next(iterator)`)."""
        for s in range(step + 1, step + k + 1):
            for hook in self.step_hooks:
                hook.before_step(s)
        if not host_fed:
            mark = self.timer.begin()
            out = self.train_loop(iterator, self._steps_tensor(k))
            if self._ranks > 1:   # Horovod: every rank sees the same losses (one collective per call)
                out = tf.concat([self._cross_rank_sum(out[:1]) / self._ranks, out[1:]], 0)
            losses, waits, durations = out.numpy().tolist()   # the one wait for the device
            self.timer.end_call(mark, step + 1, waits, durations, self.config.global_batch_size)
        else:
            mark = self.timer.begin()
            batch = next(iterator)
            self.timer.got_input(mark)
            losses = [float(self.train_step(batch))]
            self.timer.end(mark, step + 1, self.config.global_batch_size)
        if self._after_first_step is not None:
            self._after_first_step()
            self._after_first_step = None
        for s in range(step + 1, step + k + 1):
            for hook in self.step_hooks:
                hook.after_step(s)
        return losses

    def _steps_tensor(self, k: int):
        """K as an int32 scalar tensor, made once per K (an eager op less per call)."""
        if k not in self._k_tensors:
            self._k_tensors[k] = tf.constant(k, tf.int32)
        return self._k_tensors[k]

    def _steps_this_call(self, step: int, epoch_end: int, iterator=None) -> tuple[int, bool]:
        """`(K, host_fed)` for the call that starts after global step `step`: the configured or auto K, never past
        the epoch's end, ending before a hook's window (`first`..`last`) opens; inside the window one host-fed
        step per call (as for a Python iterator, and for the very first step under Horovod, whose broadcast of
        rank 0's variables follows it)."""
        k = self.steps_per_loop if self.steps_per_loop is not None else self._auto_steps()
        host_fed = not _in_graph(iterator)
        if self._after_first_step is not None:
            k = 1
        for hook in self.step_hooks:
            first, last = getattr(hook, "first", None), getattr(hook, "last", None)
            if first is None or last is None:
                continue
            if first <= step + 1 <= last:
                host_fed = True
            elif step + 1 < first:
                k = min(k, first - step - 1)
        return (1, True) if host_fed else (max(1, min(k, epoch_end - step)), False)

    def _auto_steps(self) -> int:
        """Auto K: 1 through warm-up and `AUTO_MEASURED_CALLS` timed one-step calls, then `choose_steps_per_loop`
        from their median wall time (input wait included)."""
        measured = [s.step_s for s in self.timer.steps if not s.warmup]
        if len(measured) < AUTO_MEASURED_CALLS:
            return 1
        step_s = self._agreed_mean(sorted(measured)[len(measured) // 2])
        self.steps_per_loop = choose_steps_per_loop(step_s)
        log.info("steps per loop: %d (auto, %.2f ms per one-step call)", self.steps_per_loop, 1e3 * step_s)
        return self.steps_per_loop

    def _agreed_mean(self, value: float) -> float:
        """The mean of `value` over every worker (a collective, called at the same step on all), so that all
        choose the same K: Horovod's per-call loss all-reduce must be submitted the same number of times."""
        if self.context.num_workers == 1:
            return value  # one process: nothing to agree on
        value = tf.constant(value, tf.float32)
        if self._ranks > 1:
            return float(self._cross_rank_sum(value) / self._ranks)

        @tf.function  # a strategy run outside a function warns of its eager overhead
        def mean_over_workers():
            per_replica = self.strategy.run(lambda: tf.identity(value))
            return self.strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)
        return float(mean_over_workers())


def _in_graph(iterator) -> bool:
    """Whether `iterator` can be passed into a `tf.function` (a tf.data or tf.distribute iterator, or one that says
    so: `harness.train.synthetic.OnDeviceBatches`)."""
    return (isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator))
            or getattr(iterator, "in_graph", False))


def format_epoch(logs: dict, epochs: int) -> str:
    """One line per epoch: `epoch 2/5 step 40: loss 0.41 val_loss 0.45 val_accuracy 0.83 | 812 examples/s,
    input stall 3.1%`."""
    parts = [f"epoch {logs['epoch']}/{epochs} step {logs['step']}: loss {logs['loss']:.4f}"]
    for key in ("val_loss", "val_accuracy", "val_mean_iou", "val_rmse", "val_mae", "val_r2"):
        if key in logs:
            parts.append(f"{key} {logs[key]:.4f}")
    return " ".join(parts) + (f" | {logs['examples_per_s']:.1f} examples/s, "
                              f"input stall {100 * logs['input_stall_share']:.1f}%")
