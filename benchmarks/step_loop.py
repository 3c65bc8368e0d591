"""Training throughput of the harness loop against Keras `Model.fit`, and the per-step overhead of each.

1. The ACES points (`--data`, label `class`, the pixel classifier, global batch 64, Adam 1e-3, float32, one CPU
   replica): the harness Trainer fed by the harness pipeline (`harness.train.inputs.prepare`, as `harness train`
   builds it, without the per-epoch backup) against `model.compile(...); model.fit(ds)` on a hand-written
   `TFRecordDataset -> map(parse) -> cache -> shuffle -> batch` pipeline, at `steps_per_execution` 1 and the
   best of 8, 32 and 128 (Keras docs: `Model.compile(steps_per_execution=...)`). The same model builder,
   optimizer and batch on both sides.
   Beside them, to tell the loop from the input: the harness loop fed by the hand-written pipeline, each
   pipeline drawn alone (no training), and fit at 128 under the harness's OneDeviceStrategy (fit's own figures
   run under the default strategy).
2. The per-step overhead: a model with one weight on batches of one example from a cached in-memory dataset,
   where a step's compute is negligible: µs per step of the harness loop and of Keras fit.

Each variant is a fresh model and pipeline trained for --epochs epochs; its figure is examples/s (wall clock from
the end of the first epoch, which traces and fills the cache, to the end of the last). Variants run in
alternating order for --rounds rounds (2 cores shared with other work: figures are noisy); printed: the median
and range over rounds, and the ratios of medians harness / Keras (targets: >= 1.0 at steps_per_execution 1,
>= 0.9 of the best).

  python benchmarks/step_loop.py [--rounds 3] [--epochs 5] [--data .../training.tfrecord.gz]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import harness  # noqa: E402,F401  (environment defaults before TensorFlow)

ACES = os.path.join(os.environ.get("HARNESS_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data")),
                    "gee-aces-points", "training.tfrecord.gz")
KERAS_SPE = (1, 8, 32, 128)


class EpochClock:
    """Wall-clock time at each epoch end (seconds, `time.perf_counter`)."""

    def __init__(self):
        self.ends = []

    def mark(self, *_):
        self.ends.append(time.perf_counter())

    def examples_per_s(self, examples_per_epoch: int) -> float:
        """Examples/s from the end of epoch 1 to the end of the last."""
        return examples_per_epoch * (len(self.ends) - 1) / (self.ends[-1] - self.ends[0])


def harness_aces(data: str, batch: int, epochs: int, steps_per_loop, strategy, backend) -> float:
    """examples/s of the harness Trainer on the harness pipeline (what `harness train` runs)."""
    import tf_keras as keras

    from harness.train import inputs as inputs_lib, models
    from harness.train.loop import LoopConfig, Trainer
    from harness.train.options import TrainOptions

    with tempfile.TemporaryDirectory() as out:
        options = TrainOptions(data=(data,), epochs=epochs, global_batch_size=batch, output=out,
                               steps_per_loop=steps_per_loop)
        inputs = inputs_lib.prepare(options, backend, data_config={"label": "class"}, say=lambda *_: None,
                                    on_plan=lambda *_: None)
        train_ds, _ = inputs.datasets(backend)
        with strategy.scope():
            model = models.builtin_model("table", inputs.spec.input_shape, inputs.num_classes, mean=inputs.mean,
                                         variance=inputs.variance)
            optimizer = keras.optimizers.Adam(1e-3)
        plan = inputs.plan
        config = LoopConfig(epochs=epochs, steps_per_epoch=plan.steps_per_epoch, global_batch_size=batch,
                            loss_divisor=batch, steps_per_loop=options.loop_steps)
        trainer = Trainer(model=model, optimizer=optimizer, strategy=strategy, context=backend.context,
                          config=config)
        clock = EpochClock()
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.fit(iter(train_ds), on_epoch_end=[clock.mark])
        return clock.examples_per_s(plan.steps_per_epoch * batch), inputs


def hand_written_pipeline(data: str, batch: int, bands, label: str = "class"):
    """`TFRecordDataset -> map(parse) -> cache -> shuffle -> batch`, repeated: what a Keras user writes."""
    import tensorflow as tf

    bands = list(bands)
    schema = {name: tf.io.FixedLenFeature([1], tf.float32) for name in bands + [label]}

    def parse(record):
        f = tf.io.parse_single_example(record, schema)
        return tf.concat([f[b] for b in bands], 0), tf.cast(f[label][0], tf.int32)

    return (tf.data.TFRecordDataset(data, compression_type="GZIP").map(parse, num_parallel_calls=tf.data.AUTOTUNE)
            .cache().shuffle(8192, seed=0).batch(batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE))


def harness_loop_on_hand_written(data: str, batch: int, epochs: int, strategy, context, inputs) -> float:
    """examples/s of the harness Trainer (auto steps per loop) fed by the hand-written pipeline: the loop alone,
    without the harness pipeline."""
    import tf_keras as keras

    from harness.train import models
    from harness.train.loop import LoopConfig, Trainer

    with strategy.scope():
        model = models.builtin_model("table", inputs.spec.input_shape, inputs.num_classes, mean=inputs.mean,
                                     variance=inputs.variance)
        optimizer = keras.optimizers.Adam(1e-3)
    steps = inputs.plan.steps_per_epoch
    config = LoopConfig(epochs=epochs, steps_per_epoch=steps, global_batch_size=batch, loss_divisor=batch)
    trainer = Trainer(model=model, optimizer=optimizer, strategy=strategy, context=context, config=config)
    clock = EpochClock()
    ds = strategy.experimental_distribute_dataset(hand_written_pipeline(data, batch, inputs.spec.bands))
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(iter(ds), on_epoch_end=[clock.mark])
    return clock.examples_per_s(steps * batch)


def pipeline_alone(dataset, steps: int, epochs: int, batch: int) -> float:
    """examples/s of drawing `epochs` x `steps` batches from `dataset` (first epoch untimed), no training."""
    it, clock = iter(dataset), EpochClock()
    for _ in range(epochs):
        for _ in range(steps):
            next(it)
        clock.mark()
    return clock.examples_per_s(steps * batch)


def harness_aces_dataset(data: str, batch: int, backend):
    """The harness training pipeline of the ACES points, distributed as `harness train` does."""
    from harness.train import inputs as inputs_lib
    from harness.train.options import TrainOptions

    with tempfile.TemporaryDirectory() as out:
        options = TrainOptions(data=(data,), global_batch_size=batch, output=out)
        inputs = inputs_lib.prepare(options, backend, data_config={"label": "class"}, say=lambda *_: None,
                                    on_plan=lambda *_: None)
        return inputs.datasets(backend)[0]


def keras_aces(data: str, batch: int, epochs: int, spe: int, inputs, strategy=None) -> float:
    """examples/s of `Model.fit` on a hand-written pipeline of the same file (same model, optimizer, batch), under
    the default strategy, or `strategy` (the harness's OneDeviceStrategy) when given."""
    import tensorflow as tf
    import tf_keras as keras

    from harness.train import models

    ds = hand_written_pipeline(data, batch, inputs.spec.bands)
    with (strategy or tf.distribute.get_strategy()).scope():
        model = models.builtin_model("table", inputs.spec.input_shape, inputs.num_classes, mean=inputs.mean,
                                     variance=inputs.variance)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=spe)
    clock = EpochClock()
    steps = inputs.plan.steps_per_epoch
    model.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0,
              callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=clock.mark)])
    return clock.examples_per_s(steps * batch)


def one_weight_model():
    """Logits `[x w, -x w]` of a `[batch, 1]` input: one trainable weight, next to no compute."""
    import tensorflow as tf
    import tf_keras as keras

    class Scale(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight("w", [], initializer="ones")

        def call(self, x):
            return tf.concat([x * self.w, -x * self.w], -1)

    inputs = keras.Input([1])
    return keras.Model(inputs, Scale()(inputs))


def _tiny_dataset():
    import tensorflow as tf

    x = tf.random.stateless_uniform([1024, 1], seed=[1, 2])
    y = tf.cast(x[:, 0] > 0.5, tf.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).cache().repeat().batch(1).prefetch(tf.data.AUTOTUNE)


def harness_overhead_us(steps: int, epochs: int, steps_per_loop, strategy, context) -> float:
    """µs per step of the harness loop on the one-weight model, batch 1."""
    import tf_keras as keras

    from harness.train.loop import LoopConfig, Trainer

    with strategy.scope():
        model, optimizer = one_weight_model(), keras.optimizers.SGD(0.01)
    config = LoopConfig(epochs=epochs, steps_per_epoch=steps, global_batch_size=1, loss_divisor=1,
                        steps_per_loop=steps_per_loop)
    trainer = Trainer(model=model, optimizer=optimizer, strategy=strategy, context=context, config=config)
    clock = EpochClock()
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(iter(strategy.experimental_distribute_dataset(_tiny_dataset())), on_epoch_end=[clock.mark])
    return 1e6 / clock.examples_per_s(steps)


def keras_overhead_us(steps: int, epochs: int, spe: int) -> float:
    """µs per step of `Model.fit` on the one-weight model, batch 1."""
    import tf_keras as keras

    model = one_weight_model()
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=spe)
    clock = EpochClock()
    model.fit(_tiny_dataset(), epochs=epochs, steps_per_epoch=steps, verbose=0,
              callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=clock.mark)])
    return 1e6 / clock.examples_per_s(steps)


def _rounds(variants: dict, rounds: int) -> dict:
    """Run every variant once per round, the order rotated each round; {name: [figure per round]}."""
    names, figures = list(variants), {name: [] for name in variants}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            figures[name].append(variants[name]())
    return figures


def _line(name: str, values: list, unit: str) -> str:
    return (f"  {name:<28} {statistics.median(values):10.1f} {unit} (median; range {min(values):.1f}-"
            f"{max(values):.1f}; rounds {', '.join(f'{v:.0f}' for v in values)})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default=ACES, help="the ACES points' training file (label `class`)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every variant, in alternating order")
    p.add_argument("--epochs", type=int, default=5, help="epochs per variant; the first is not timed")
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--overhead-steps", type=int, default=2000, help="steps per epoch of the one-weight model")
    args = p.parse_args(argv)

    import tensorflow as tf

    from harness.distribute.backend import make_backend

    backend = make_backend("tf", strategy="single", cpu_replicas=1)
    strategy, context = backend.strategy, backend.context
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores, {strategy.__class__.__name__}; "
          f"{args.rounds} rounds, {args.epochs} epochs per variant (the first untimed)")
    if not os.path.exists(args.data):
        print(f"no ACES points at {args.data}: skipping the ACES comparison")
    else:
        _, inputs = harness_aces(args.data, args.batch, 2, 1, strategy, backend)  # warm the record index
        print(f"ACES points: {sum(inputs.plan.records)} records, {inputs.plan.steps_per_epoch} steps of "
              f"{args.batch} per epoch, pixel classifier, Adam 1e-3")
        variants = {"harness auto": lambda: harness_aces(args.data, args.batch, args.epochs, "auto", strategy,
                                                         backend)[0],
                    "harness steps_per_loop=1": lambda: harness_aces(args.data, args.batch, args.epochs, 1,
                                                                     strategy, backend)[0]}
        for spe in KERAS_SPE:
            variants[f"keras fit spe={spe}"] = (lambda spe=spe: keras_aces(args.data, args.batch, args.epochs, spe,
                                                                          inputs))
        variants["keras fit spe=128, OneDevice"] = lambda: keras_aces(args.data, args.batch, args.epochs, 128,
                                                                      inputs, strategy)
        variants["harness loop, hand-written input"] = lambda: harness_loop_on_hand_written(
            args.data, args.batch, args.epochs, strategy, context, inputs)
        steps = inputs.plan.steps_per_epoch
        variants["harness pipeline alone"] = lambda: pipeline_alone(
            harness_aces_dataset(args.data, args.batch, backend), steps, args.epochs, args.batch)
        variants["hand-written pipeline alone"] = lambda: pipeline_alone(
            hand_written_pipeline(args.data, args.batch, inputs.spec.bands), steps, args.epochs, args.batch)
        figures = _rounds(variants, args.rounds)
        for name, values in figures.items():
            print(_line(name, values, "examples/s"))
        med = {name: statistics.median(v) for name, v in figures.items()}
        best = max((f"keras fit spe={spe}" for spe in KERAS_SPE), key=med.get)  # the default strategy's
        for mine in ("harness auto", "harness steps_per_loop=1", "harness loop, hand-written input"):
            print(f"  {mine} / keras fit spe=1 = {med[mine] / med['keras fit spe=1']:.2f} (target >= 1.0); "
                  f"/ best ({best}) = {med[mine] / med[best]:.2f} (target >= 0.9)")

    steps, epochs = args.overhead_steps, 3
    variants = {"harness auto": lambda: harness_overhead_us(steps, epochs, None, strategy, context),
                "harness steps_per_loop=1": lambda: harness_overhead_us(steps, epochs, 1, strategy, context),
                "keras fit spe=1": lambda: keras_overhead_us(steps, epochs, 1),
                "keras fit spe=128": lambda: keras_overhead_us(steps, epochs, 128)}
    print(f"per-step overhead: one-weight model, batch 1, {steps} steps per epoch, {epochs} epochs (first untimed)")
    for name, values in _rounds(variants, args.rounds).items():
        print(_line(name, values, "µs/step"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
