"""The trainer (orbit's `StandardTrainer`): the training step written once, run one step per call or K per call.

Under tf.distribute each replica divides its summed per-example loss by the global batch and the optimizer's
`apply_gradients` all-reduces (sums) the gradients across replicas (tensorflow.org/tutorials/distribute/
custom_training). Under Horovod the strategy is the default one, each rank divides by its own batch and the
backend's gradient tape (`hvd.DistributedGradientTape`) averages the gradients. Loss scaling happens exactly once:
the scaled loss is differentiated, the gradients are reduced across replicas or ranks and unscaled once.

One step, two ways to call it (Keras' `Model.make_train_function` is the model: one step, wrapped in a loop of K):
  - `train_step(batch)`: one step on a batch the host drew (the profiler's trace window, Python iterators);
  - `train_loop(iterator, steps)`: K steps in one `tf.function` call, each drawing its batch with `next(iterator)`
    inside the function (a `tf.while_loop` of K iterations), as orbit's `steps_per_loop` and Keras'
    `steps_per_execution` do; the host waits for the device once per call, for the per-step results. Each step's
    input wait is timed in the graph (`tf.timestamp()` before and after `next(iterator)`), so the input-stall share
    needs no per-step host sync.

Skipped updates: under loss scaling (`mixed_float16`) the loss-scale optimizer applies no update in a step whose
gradients are not finite, and halves its scale (`LossScaleOptimizer`, tensorflow.org/guide/mixed_precision).
Every step reports whether its update was skipped (the same test on the reduced gradients the optimizer makes), so
the controller can count them.

A Keras 3 model (`harness.keras_kinds`): the step sums the gradients over the replicas itself and hands the sum
to the optimizer, whose own sum is turned off (`kinds.no_second_sum`), so Keras 3's LossScaleOptimizer tests the
summed gradients on every replica alike (on its own it tests each replica's share before the sum: an overflow on one
replica applied NaN weights or deadlocked the workers), and `--clip-norm` clips the sum. The tape differentiates
with respect to each Keras 3 variable's `tf.Variable` (`.value`), which Horovod's tape needs. A skipped update
advances the optimizer's step counter, as tf-keras's does (Keras 3's does not), so the schedule follows the step.
Its BatchNormalization layers train on TensorFlow's fused kernel, as tf-keras's do (`keras3_batch_norm.fuse`).
"""
from __future__ import annotations

import functools

import tensorflow as tf

from harness.tracing import graph_function, user_code
from harness import keras_kinds as kinds
from harness.train.model import keras3_batch_norm

ROWS = ("loss", "input_wait_s", "step_s", "skipped")  # rows of `train_loop`'s result, in order


class StepProgress:
    """Where this worker is inside the K-step call, readable from another thread while the call runs (the
    step-progress watchdog, `harness.train.lifecycle.watchdog`): `drawn` counts the batches the loop has drawn from its
    input, `finished` the steps whose update has run (int64 scalar variables on the host CPU, counted since the trainer
    was built), and `in_call` whether a K-step call is running. Inside a call, `drawn > finished`: this worker has its
    batch and is inside its step (its compute, or the all-reduce waiting for its peers); `drawn == finished`: it
    waits for its own input. Between calls it is in the host's work (a collective of the controller's, such as the
    preemption check, which waits for its peers too).

    Two variable increments per step (a few µs on a CPU); built only for runs of several workers."""

    def __init__(self):
        self.in_call = False
        with tf.device("/cpu:0"):
            self.drawn = tf.Variable(0, dtype=tf.int64, trainable=False, name="harness_batches_drawn")
            self.finished = tf.Variable(0, dtype=tf.int64, trainable=False, name="harness_steps_finished")

    def waiting_for_input(self) -> bool:
        """True inside a call whose last batch drawn has been trained on: the loop waits for its next batch."""
        return self.in_call and int(self.drawn.numpy()) <= int(self.finished.numpy())


def clip_after_reduction(grads, clip_norm: float):
    """Sum `grads` over the replicas in sync (what `apply_gradients` would do), then clip them to `clip_norm` by
    their global norm (`tf.clip_by_global_norm`): the norm is the update's, the same on every replica, not one
    replica's share. Under Horovod the tape has already averaged over the ranks and the default strategy's one
    replica sums nothing."""
    reduced = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, list(grads))
    return tf.clip_by_global_norm(reduced, clip_norm)[0]


def _sum_over_replicas(grads) -> list:
    """`grads` summed over the replicas in sync (`None` gradients, of unused weights, left as they are)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
    out = list(grads)
    for i, g in zip(present, summed):
        out[i] = g
    return out


def _all_finite(grads) -> tf.Tensor:
    """float32 scalar: 1 when every gradient is finite, else 0 (`None` gradients, of unused weights, count as
    finite, as the loss-scale optimizer counts them)."""
    flags = [tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None]
    return tf.cast(tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True), tf.float32)


class Trainer:
    """The training step of `model` on the backend's strategy; built by `harness.train.loop.factory.build_run`.

    Args:
      backend: the `harness.distribute.backend.TrainingBackend` (its strategy, gradient tape and cross-rank sum).
      model: Keras model (Keras 3 or tf-keras: `harness.keras_kinds.of_model`), built under `backend.scope()`; maps
        inputs to logits `[batch, ..., classes]` float32.
      optimizer: Keras optimizer of the model's kind, already wrapped by `precision.wrap_optimizer` when loss
        scaling is needed.
      loss_fn: `fn(labels, logits, class_weights) -> [batch]` float32 per-example loss (`harness.train.model.losses`).
      loss_divisor: what each replica divides its summed loss by (`backend.loss_divisor(plan)`).
      global_batch_size: examples per step over all replicas (examples/s).
      class_weights: optional `[classes]` float32 weights multiplying each example's (pixel's) loss.
      clip_norm: clip the gradients to this global norm after the cross-replica reduction and loss unscaling
        (`clip_after_reduction`); None: no clipping.
      progress: a `StepProgress` the K-step loop counts its batches and steps in, or None.
    Raises:
      UserCodeError: `model` is not a Keras model of either kind.
      RuntimeError: a Keras 3 whose optimizer sums gradients where `keras_kinds.no_second_sum` cannot turn it off.
    """

    def __init__(self, *, backend, model, optimizer, loss_fn, loss_divisor: int, global_batch_size: int,
                 class_weights=None, clip_norm: float | None = None, progress: StepProgress | None = None):
        self.backend, self.strategy = backend, backend.strategy
        self.model, self.optimizer = model, optimizer
        self.loss_fn, self.loss_divisor, self.global_batch_size = loss_fn, loss_divisor, global_batch_size
        self.class_weights = None if class_weights is None else tf.constant(class_weights, tf.float32)
        self.clip_norm, self.progress = clip_norm, progress
        self.kind = kinds.of_model(model)
        keras = kinds.module(self.kind)
        self.fused_batch_norm = 0
        if self.kind == kinds.KERAS3:
            kinds.no_second_sum(optimizer)   # the step sums the gradients itself
            self.fused_batch_norm = keras3_batch_norm.fuse(model)   # tf-keras's fused kernel, Keras 3's numbers
        self.loss_scaling = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
        self.loss_scale_floor = kinds.LOSS_SCALE_FLOOR[self.kind]
        # The optimizer's slots (momentum, Adam's moments) made now, not inside the first call: a `tf.function` whose
        # first call creates variables is traced twice (once to create them, once as it runs), ~0.3 CPU-s per step
        # function on a small MLP. Only when every layer has its weights: a layer that a subclassed model first calls
        # inside the trace (one branch of a Python `if`) makes them there, and the optimizer must see them too.
        if all(layer.built for layer in _layers(model, self.kind)):
            with self.strategy.scope():
                optimizer.build(model.trainable_variables)
        # Traced as written; AutoGraph converts the user's model and loss only (`harness.tracing`).
        self.train_step = graph_function(self._host_fed_step)
        self.train_loop = graph_function(self._loop)
        self._forward = user_code(self._model_and_loss)
        self._k_tensors = {}

    # --- the step, written once -------------------------------------------------------------------------------
    def _replica_step(self, inputs, labels, after=None):
        """One replica's step: its loss, float32 scalar; under loss scaling `[loss, finite]` float32 (`finite`: 1
        when its gradients were finite). Without loss scaling the step has no finiteness test at all: every op in
        the step costs a few µs per step on a CPU (benchmarks/step_loop.py overhead case)."""
        if after is not None:  # start once `after` has run (the input-wait timestamp of `_loop`)
            with tf.control_dependencies([after]):
                inputs, labels = tf.nest.map_structure(tf.identity, (inputs, labels))
        if self.kind == kinds.KERAS3:
            return self._keras3_replica_step(inputs, labels)
        model, opt = self.model, self.optimizer
        with tf.GradientTape() as tape:
            loss = self._forward(inputs, labels)
            scaled = opt.get_scaled_loss(loss) if self.loss_scaling else loss
        grads = self.backend.gradient_tape(tape).gradient(scaled, model.trainable_variables)
        if self.loss_scaling:
            grads = opt.get_unscaled_gradients(grads)
        finite = _all_finite(grads) if self.loss_scaling else None
        if self.clip_norm is not None:
            grads = clip_after_reduction(grads, self.clip_norm)  # reduced here: the optimizer must not sum again
            applied = opt.apply_gradients(zip(grads, model.trainable_variables), skip_gradients_aggregation=True)
        else:
            applied = opt.apply_gradients(zip(grads, model.trainable_variables))
        with tf.control_dependencies([applied] if applied is not None else []):  # the step ends with its update
            return tf.identity(loss) if finite is None else tf.stack([tf.identity(loss), finite])

    def _keras3_replica_step(self, inputs, labels):
        """`_replica_step` for a Keras 3 model: the gradients summed here, then tested, clipped and applied."""
        model, opt = self.model, self.optimizer
        with tf.GradientTape() as tape:
            loss = self._forward(inputs, labels)
            scaled = opt.scale_loss(loss) if self.loss_scaling else loss
        variables = model.trainable_variables
        grads = self.backend.gradient_tape(tape).gradient(scaled, [v.value for v in variables])
        grads = _sum_over_replicas(grads)   # still scaled: Keras 3's LossScaleOptimizer unscales in `apply`
        finite = _all_finite(grads) if self.loss_scaling else None
        if self.clip_norm is not None:     # the scaled gradients' norm is the scale times the unscaled one's
            limit = self.clip_norm * tf.cast(opt.dynamic_scale, tf.float32) if self.loss_scaling else self.clip_norm
            grads = tf.clip_by_global_norm(grads, limit)[0]
        opt.apply(grads, variables)
        if finite is not None:   # a skipped update counts as a step, as in tf-keras (Keras 3 leaves it uncounted)
            opt.iterations.assign_add(tf.cast(1.0 - finite, opt.iterations.dtype))
        return tf.stack([tf.identity(loss), finite]) if finite is not None else tf.identity(loss)

    def _model_and_loss(self, inputs, labels):
        """This replica's loss, float32 scalar: the summed per-example loss over `loss_divisor`, plus the model's
        regularization losses (`tf.nn.scale_regularization_loss`). Run through `user_code`: the user's model and
        loss are converted by AutoGraph as under Keras' `fit`."""
        logits = self.model(inputs, training=True)
        loss = tf.reduce_sum(self.loss_fn(labels, logits, self.class_weights)) / self.loss_divisor
        if self.model.losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
        return loss

    def _step(self, batch, after=None):
        """One step over every replica: `(loss, skipped)` float32 scalars. `loss` is summed over this worker's
        replicas (and over every worker under tf.distribute), not yet over Horovod's ranks; `skipped` is 1 when
        the optimizer applied no update (some replica's gradients were not finite: their sum is not either), None
        without loss scaling (no update is ever skipped)."""
        per_replica = self.strategy.run(functools.partial(self._replica_step, after=after), args=batch)
        reduced = tf.cast(self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None), tf.float32)
        if not self.loss_scaling:
            return reduced, None
        loss, finite = tf.unstack(reduced)
        return loss, tf.cast(finite < self.strategy.num_replicas_in_sync, tf.float32)

    def _host_fed_step(self, batch):
        """`train_step`: one step on a batch drawn on the host; float64 `[2]`: the loss averaged over ranks, and
        the skipped flag."""
        loss, skipped = self._step(batch)
        skipped = tf.constant(0.0) if skipped is None else skipped
        return tf.cast(tf.stack([self.backend.mean_over_ranks(loss), skipped]), tf.float64)

    def _next_batch(self, iterator):
        """`next(iterator)` inside the K-step function (a seam: tests count the batches drawn here)."""
        return next(iterator)

    def _loop(self, iterator, steps):
        """`steps` (int32 scalar tensor, so one trace serves every K) training steps in one call.

        Returns float64 `[4, steps]` (`ROWS`; `[3, steps]` without loss scaling), one tensor so the host fetches it
        at once: per step, the loss (not yet averaged over ranks), the seconds `next(iterator)` took (the input
        wait), the seconds from the step's start to its update, both from `tf.timestamp()` in the graph, and 1
        where the update was skipped.
        """
        arrays = (tf.TensorArray(tf.float32, size=steps),                                  # loss
                  tf.TensorArray(tf.float64, size=steps),                                  # input wait
                  tf.TensorArray(tf.float64, size=steps),                                  # step
                  tf.TensorArray(tf.float32, size=steps if self.loss_scaling else 0))      # skipped

        def one_step(i, done, arrays):
            with tf.control_dependencies([done]):      # after the previous step's update
                start = tf.timestamp()
            with tf.control_dependencies([start]):
                batch = self._next_batch(iterator)
            with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                got = tf.timestamp()
            after = got
            if self.progress is not None:
                # The step starts once the batch is counted: a count that merely ran beside the step could wait
                # for a free inter-op thread behind a blocked collective (seen under Horovod with a peer gone).
                with tf.control_dependencies([got]):
                    after = self.progress.drawn.assign_add(1)
            # The step starts after `got` through its inputs alone (`after`: one Identity per batch tensor, on
            # the replica's device). A control block around the whole step put an edge from `got` on every op of
            # the model: ~40 µs more per step on the CPU (benchmarks/step_loop.py overhead case). With no edge at
            # all, `got` ran after the step's first ops and a step that never waited measured a 5-7% stall
            # (tests/train/measure/test_probe.py).
            loss, skipped = self._step(batch, after=after)
            with tf.control_dependencies([loss]):
                end = tf.timestamp()
                if self.progress is not None:
                    self.progress.finished.assign_add(1)
            losses, waits, durations, skips = arrays
            arrays = (losses.write(i, loss), waits.write(i, got - start), durations.write(i, end - start),
                      skips.write(i, skipped) if self.loss_scaling else skips)
            return i + 1, loss, arrays

        # one step at a time, in order (parallel_iterations=1)
        _, _, (losses, waits, durations, skips) = tf.while_loop(
            lambda i, done, arrays: i < steps, one_step, (tf.constant(0), tf.constant(0.0), arrays),
            parallel_iterations=1)
        rows = [tf.cast(losses.stack(), tf.float64), waits.stack(), durations.stack()]
        return tf.stack(rows + ([tf.cast(skips.stack(), tf.float64)] if self.loss_scaling else []))

    def run_loop(self, iterator, k: int):
        """K steps in one call: float64 `[4, K]` (`ROWS`; `[3, K]` without loss scaling) on the host, losses
        averaged over ranks (the one wait for the device, and under Horovod one collective per call, so every rank
        sees the same losses)."""
        if self.progress is not None:
            self.progress.in_call = True
        try:
            out = self.train_loop(iterator, self._steps_tensor(k))
        finally:
            if self.progress is not None:
                self.progress.in_call = False
        if self.backend.ranks_summed > 1:
            out = tf.concat([self.backend.mean_over_ranks(out[:1]), out[1:]], 0)
        return out.numpy()

    def _steps_tensor(self, k: int):
        """K as an int32 scalar tensor, made once per K (an eager op less per call)."""
        if k not in self._k_tensors:
            self._k_tensors[k] = tf.constant(k, tf.int32)
        return self._k_tensors[k]

    def loss_scale(self) -> float | None:
        """The loss-scale optimizer's current scale, or None without loss scaling."""
        if not self.loss_scaling:
            return None
        scale = self.optimizer.dynamic_scale if self.kind == kinds.KERAS3 else self.optimizer.loss_scale
        return float(scale.numpy())


def _layers(model, kind: str) -> list:
    """Every layer of `model`, nested ones too (tf-keras's `submodules`, Keras 3's `_flatten_layers`)."""
    if kind == kinds.KERAS3:
        return list(model._flatten_layers(include_self=False))
    return [m for m in model.submodules if isinstance(m, kinds.module(kind).layers.Layer)]


def in_graph(iterator) -> bool:
    """Whether `iterator` can be passed into a `tf.function` (a tf.data or tf.distribute iterator, or one that says
    so: `harness.train.loop.synthetic.OnDeviceBatches`)."""
    return (isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator))
            or getattr(iterator, "in_graph", False))
