"""Training throughput of the harness loop against Keras `Model.fit`, and the per-step overhead of each.

Cases (`--cases`, comma-separated; default all):
  points    the ACES points (`--data`, label `class`), the pixel classifier, global batch 64, one CPU device (the
            default strategy): the harness Trainer fed by the harness pipeline (`harness.train.inputs.prepare`, as
            `harness train` builds it, without the per-epoch backup) against `model.compile(...); model.fit(ds)`
            on a hand-written `TFRecordDataset -> map(parse) -> cache -> shuffle -> batch` pipeline, at
            `steps_per_execution` 1 and the best of 1, 8, 32, 128 (targets: >= 1.0 and >= 0.9). Beside them, to
            tell the loop from the input: the harness loop on the hand-written pipeline, and each pipeline drawn
            alone (a plain Python `next()` per batch, no training); and the harness under `OneDeviceStrategy`,
            what one device ran under before.
  unet      64x64x8 float GZIP patches written by `harness.data.export.synth` (`--unet-records`, `--unet-size`, 4
            classes), the built-in U-Net, global batch 16, one device: harness against fit at spe=1 (target >=
            1.0); the same U-Net built in Keras 3: the harness against Keras 3's fit at spe=1 (target >= 1.0), and
            against the tf-keras one, without BatchNormalization (the step: target >= 0.95) and with it (target >= 0.95:
            Keras 3's BatchNormalization, two unfused ops on TensorFlow, is trained on the fused kernel tf-keras
            uses, `harness.train.model.keras3_batch_norm`: 87.7 -> 72.7 ms per step here, tf-keras 71.9).
  mirrored  both cases above under `MirroredStrategy` over 2 logical CPU devices (`make_strategy("mirrored",
            num_cpu_replicas=2)`), the same global batches, harness against fit under the same strategy object
            (target >= 1.0). Run in a child process: logical devices are fixed before TensorFlow starts.
  horovod   the points under `horovodrun -np 2 --gloo` (global batch 64: 32 per rank), examples/s per rank and in
            all, against the tf backend on one device at the same global batch (printed, no target).
  overhead  a model with one weight on batches of one example from a cached in-memory dataset, where a step's
            compute is negligible: µs per step of the harness loop and of fit.
The same model builder, Adam 1e-3 (SGD 0.01 for the one-weight model), batch, data and epochs on both sides.

Each variant is a fresh model and pipeline trained for --epochs epochs; its figure is examples/s (wall clock from
the end of the first epoch, which traces and fills the cache, to the end of the last). Variants run in
alternating order for --rounds rounds (2 cores shared with other work: figures are noisy); printed: the median
and range over rounds and the ratios of medians, with the load average before and after.

  python benchmarks/step_loop.py [--cases points,unet,mirrored,horovod,overhead] [--rounds 3] [--epochs 5]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import harness  # noqa: E402,F401  (environment defaults before TensorFlow)
import _smoke as smoke  # noqa: E402  (benchmarks/_smoke.py, beside this script)

from _shared import ACES_POINTS as ACES  # noqa: E402  (benchmarks/_shared.py, beside this script)
KERAS_SPE = (1, 8, 32, 128)
KERAS3_ROW, KERAS3_FIT = "harness auto, Keras 3 model", "fit spe=1, Keras 3 model"   # the U-Net's Keras 3 rows
NO_BN_ROW, KERAS3_NO_BN_ROW = "harness auto, no BatchNorm", "harness auto, Keras 3, no BatchNorm"
CASES = ("points", "unet", "mirrored", "horovod", "overhead")
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
CHILD_TIMEOUT_S = 1200  # the mirrored child and each horovodrun launch: killed (process group) past this
# --smoke: every case, one round of 2 epochs, 16 U-Net patches of 16x16 (1 step of 16), 20 overhead steps, fit at
# spe 1 and 8 only (the best-of code path; 32 and 128 run the same code with other numbers); `make test` runs it
# (tests/bench/test_benchmarks_start.py)
SMOKE = dict(rounds=1, epochs=2, unet_epochs=2, unet_records=16, unet_size=16, overhead_steps=20, fit_spe="1,8")


@dataclasses.dataclass(frozen=True)
class Case:
    """One training comparison: data (a file or an export folder), its label, global batch and epochs."""

    name: str
    data: str
    label: str
    batch: int
    epochs: int


class EpochClock:
    """Wall-clock time at each epoch end (seconds, `time.perf_counter`)."""

    def __init__(self):
        self.ends = []

    def mark(self, *_):
        self.ends.append(time.perf_counter())

    def examples_per_s(self, examples_per_epoch: int) -> float:
        """Examples/s from the end of epoch 1 to the end of the last."""
        return examples_per_epoch * (len(self.ends) - 1) / (self.ends[-1] - self.ends[0])


# --- the harness side --------------------------------------------------------------------------------------------
def prepare(case: Case, backend, epochs: int = 1, steps_per_loop="auto"):
    """`harness.train.inputs.prepare` for the case (counting, spec, plan, statistics), as `harness train` does."""
    from harness.train import inputs as inputs_lib
    from harness.train.options import TrainOptions

    with tempfile.TemporaryDirectory() as out:
        options = TrainOptions(data=(case.data,), epochs=epochs, global_batch_size=case.batch, output=out,
                               steps_per_loop=steps_per_loop)
        return inputs_lib.prepare(options, backend, data_config={"label": case.label}, say=lambda *_: None)


def build_model(inputs, strategy, kind: str = "tf_keras", batch_norm: bool = True):
    """The built-in model of the data (pixel classifier or U-Net, without BatchNormalization if told) and the run's
    optimizer (Adam 1e-3: `harness train`'s defaults) in the Keras `kind` (`harness.keras_kinds`: the same layers in
    tf-keras or Keras 3), from the run's parts (`harness.train.model.parts.RunParts`), under the strategy's scope."""
    from harness.train.model.parts import RunParts

    parts = RunParts(inputs.options)
    with strategy.scope():
        model = parts.build_builtin(inputs.spec.kind, inputs.spec.input_shape, inputs.num_classes, mean=inputs.mean,
                                    variance=inputs.variance, keras_kind=kind, batch_norm=batch_norm)
        return model, parts.create_optimizer(kind=kind)


def sgd(learning_rate: float = 0.01, kind: str = "tf_keras"):
    """Plain SGD at `learning_rate` (the per-step overhead's optimizer), from the parts of a run that names it."""
    from harness.train.model.parts import RunParts
    from harness.train.options import TrainOptions

    return RunParts(TrainOptions(data=("synthetic",), optimizer="sgd", learning_rate=learning_rate)).create_optimizer(
        kind=kind)


def harness_run(case: Case, backend, steps_per_loop="auto", train_iterator=None, kind: str = "tf_keras",
                batch_norm: bool = True) -> float:
    """examples/s (global) of the harness's trainer (built by `harness.train.loop.factory`, as `harness train` builds
    it) on the harness pipeline (what `harness train` runs), or on `train_iterator(inputs)` when given; the model
    in the Keras `kind`."""
    from harness.train.loop import factory
    from harness.train.loop.controller import EpochEnd, Schedule

    inputs = prepare(case, backend, case.epochs, steps_per_loop)
    plan = inputs.plan
    model, optimizer = build_model(inputs, backend.strategy, kind, batch_norm)
    clock = EpochClock()
    controller = factory.build_run(backend, model, optimizer, plan,
                                   Schedule(epochs=case.epochs, steps_per_epoch=plan.steps_per_epoch,
                                            steps_per_loop=inputs.options.loop_steps),
                                   actions=[EpochEnd(clock.mark)], epoch_lines=False).controller
    iterator = train_iterator(inputs) if train_iterator else iter(inputs.datasets(backend)[0])
    controller.fit(iterator)
    return clock.examples_per_s(plan.steps_per_epoch * plan.global_batch_size)


# --- the Keras side ----------------------------------------------------------------------------------------------
def data_files(path: str) -> list[str]:
    """The TFRecord files of a file or an export folder (the mixer left out)."""
    if os.path.isfile(path):
        return [path]
    return sorted(os.path.join(path, f) for f in os.listdir(path) if ".tfrecord" in f)


def hand_written_pipeline(case: Case, spec, batch: int):
    """`TFRecordDataset -> map(parse_single_example) -> cache -> shuffle -> batch`, repeated: what a Keras user
    writes. Table rows -> float32 `[bands]`, int32 label; patches -> float32 `[S, S, bands]`, int32 `[S, S]`."""
    import tensorflow as tf

    bands, label = list(spec.bands), case.label
    n = spec.values_per_feature()
    image = spec.kind == "image"
    schema = {name: tf.io.FixedLenFeature([n] if image else [1], tf.float32) for name in bands + [label]}

    def parse(record):
        f = tf.io.parse_single_example(record, schema)
        if not image:
            return tf.concat([f[b] for b in bands], 0), tf.cast(f[label][0], tf.int32)
        s = spec.stored_size
        x = tf.reshape(tf.stack([f[b] for b in bands], -1), [s, s, len(bands)])
        return x, tf.cast(tf.reshape(f[label], [s, s]), tf.int32)

    files = data_files(case.data)
    return (tf.data.TFRecordDataset(files, compression_type="GZIP").map(parse, num_parallel_calls=tf.data.AUTOTUNE)
            .cache().shuffle(8192, seed=0).batch(batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE))


def keras_run(case: Case, inputs, spe: int, strategy, kind: str = "tf_keras") -> float:
    """examples/s of `Model.fit` (model and optimizer built and compiled under `strategy`, in the Keras `kind`) on
    the hand-written pipeline of the same data, same model, optimizer, global batch and epochs."""
    from harness import keras_kinds

    keras = keras_kinds.module(kind)
    model, optimizer = build_model(inputs, strategy, kind)
    with strategy.scope():
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=spe)
    clock = EpochClock()
    steps = inputs.plan.steps_per_epoch
    model.fit(hand_written_pipeline(case, inputs.spec, case.batch), epochs=case.epochs, steps_per_epoch=steps,
              verbose=0, callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=clock.mark)])
    return clock.examples_per_s(steps * case.batch)


def pipeline_alone(dataset, steps: int, epochs: int, batch: int) -> float:
    """examples/s of drawing `epochs` x `steps` batches from `dataset` (first epoch untimed), no training."""
    it, clock = iter(dataset), EpochClock()
    for _ in range(epochs):
        for _ in range(steps):
            next(it)
        clock.mark()
    return clock.examples_per_s(steps * batch)


# --- per-step overhead -------------------------------------------------------------------------------------------
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


def harness_overhead_us(steps: int, epochs: int, steps_per_loop, backend) -> float:
    """µs per step of the harness loop on the one-weight model, batch 1."""
    from harness.train.loop import factory
    from harness.train.loop.controller import EpochEnd, Schedule

    strategy = backend.strategy
    with strategy.scope():
        model, optimizer = one_weight_model(), sgd(0.01)
    clock = EpochClock()
    controller = factory.build_run(backend, model, optimizer, factory.synthetic_batch(backend, 1),
                                   Schedule(epochs=epochs, steps_per_epoch=steps, steps_per_loop=steps_per_loop),
                                   actions=[EpochEnd(clock.mark)], epoch_lines=False).controller
    controller.fit(iter(strategy.experimental_distribute_dataset(_tiny_dataset())))
    return 1e6 / clock.examples_per_s(steps)


def keras_overhead_us(steps: int, epochs: int, spe: int) -> float:
    """µs per step of `Model.fit` on the one-weight model, batch 1."""
    import tf_keras as keras

    model = one_weight_model()
    model.compile(optimizer=sgd(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=spe)
    clock = EpochClock()
    model.fit(_tiny_dataset(), epochs=epochs, steps_per_epoch=steps, verbose=0,
              callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=clock.mark)])
    return 1e6 / clock.examples_per_s(steps)


# --- rounds and printing -----------------------------------------------------------------------------------------
def _rounds(variants: dict, rounds: int) -> dict:
    """Run every variant once per round, the order rotated each round; {name: [figure per round]}."""
    names, figures = list(variants), {name: [] for name in variants}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            figures[name].append(variants[name]())
    return figures


def _line(name: str, values: list, unit: str) -> str:
    return (f"  {name:<34} {statistics.median(values):10.1f} {unit} (median; range {min(values):.1f}-"
            f"{max(values):.1f}; rounds {', '.join(f'{v:.0f}' for v in values)})")


def _ratio(med: dict, mine: str, theirs: str, target: float | None = None) -> str:
    r = med[mine] / med[theirs]
    verdict = "" if target is None else f" (target >= {target}: {'met' if r >= target else 'MISSED'})"
    return f"  {mine} / {theirs} = {r:.2f}{verdict}"


def _load() -> str:
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def _report(title: str, figures: dict, unit: str = "examples/s") -> dict:
    print(f"{title} [{_load()}]")
    for name, values in figures.items():
        print(_line(name, values, unit))
    return {name: statistics.median(v) for name, v in figures.items()}


# --- cases -------------------------------------------------------------------------------------------------------
def points_case(case: Case, backend, rounds: int, fit_spe=KERAS_SPE) -> None:
    """Harness auto and K=1 against fit at every spe of `fit_spe`, the loop on the hand-written input, the pipelines
    alone."""
    inputs = prepare(case, backend)
    steps = inputs.plan.steps_per_epoch
    strategy = backend.strategy
    print(f"\n== points: {sum(inputs.plan.records)} records, {steps} steps of {case.batch} per epoch, pixel "
          f"classifier, {case.epochs} epochs, one device ({strategy_name(strategy)})")
    variants = {"harness auto": lambda: harness_run(case, backend, "auto"),
                "harness steps_per_loop=1": lambda: harness_run(case, backend, 1)}
    for spe in fit_spe:
        variants[f"fit spe={spe}"] = lambda spe=spe: keras_run(case, inputs, spe, strategy)
    variants["harness auto, OneDeviceStrategy"] = lambda: harness_run(case, one_device_backend(), "auto")
    variants["harness loop, hand-written input"] = lambda: harness_run(
        case, backend, "auto", train_iterator=lambda i: iter(hand_written_pipeline(case, i.spec, case.batch)))
    variants["harness pipeline alone"] = lambda: pipeline_alone(
        prepare(case, backend).datasets(backend)[0], steps, case.epochs, case.batch)
    variants["hand-written pipeline alone"] = lambda: pipeline_alone(
        hand_written_pipeline(case, inputs.spec, case.batch), steps, case.epochs, case.batch)
    med = _report("examples/s", _rounds(variants, rounds))
    best = max((f"fit spe={spe}" for spe in fit_spe), key=med.get)
    print(_ratio(med, "harness auto", "fit spe=1", 1.0))
    print(_ratio(med, "harness auto", best, 0.9) + "  (the best fit)")
    print(_ratio(med, "harness steps_per_loop=1", "fit spe=1"))
    print(_ratio(med, "harness auto", "harness auto, OneDeviceStrategy") + "  (the default strategy's gain)")
    print(_ratio(med, "harness loop, hand-written input", best))
    print(_ratio(med, "harness pipeline alone", "hand-written pipeline alone"))


def fit_case(case: Case, backend, rounds: int, what: str) -> None:
    """Harness auto against fit at spe=1 under the same strategy (target >= 1.0); for the U-Net also the same
    model written in Keras 3 through the harness's step against the tf-keras one (target >= 0.95: the Keras 3 step
    adds the harness's own gradient sum, issue 43)."""
    inputs = prepare(case, backend)
    strategy = backend.strategy
    print(f"\n== {what}: {sum(inputs.plan.records)} records, {inputs.plan.steps_per_epoch} steps of global batch "
          f"{case.batch} per epoch, {case.epochs} epochs, {strategy_name(strategy)} with "
          f"{strategy.num_replicas_in_sync} replica(s)")
    variants = {"harness auto": lambda: harness_run(case, backend, "auto"),
                "fit spe=1": lambda: keras_run(case, inputs, 1, strategy)}
    if case.name == "unet":
        variants.update({
            KERAS3_ROW: lambda: harness_run(case, backend, "auto", kind="keras3"),
            KERAS3_FIT: lambda: keras_run(case, inputs, 1, strategy, kind="keras3"),
            NO_BN_ROW: lambda: harness_run(case, backend, "auto", batch_norm=False),
            KERAS3_NO_BN_ROW: lambda: harness_run(case, backend, "auto", kind="keras3", batch_norm=False)})
    med = _report("examples/s", _rounds(variants, rounds))
    print(_ratio(med, "harness auto", "fit spe=1", 1.0))
    if case.name == "unet":
        print(_ratio(med, KERAS3_ROW, KERAS3_FIT, 1.0) + "  (a Keras 3 model: the harness against Keras 3's fit)")
        print(_ratio(med, KERAS3_NO_BN_ROW, NO_BN_ROW, 0.95) + "  (the step: one U-Net in both Keras, no BatchNorm)")
        print(_ratio(med, KERAS3_ROW, "harness auto", 0.95) + "  (with BatchNormalization: Keras 3's trained on "
              "TensorFlow's fused kernel, as tf-keras's: harness/train/model/keras3_batch_norm.py)")


def overhead_case(backend, steps: int, rounds: int) -> None:
    epochs = 3
    variants = {"harness auto": lambda: harness_overhead_us(steps, epochs, None, backend),
                "harness steps_per_loop=1": lambda: harness_overhead_us(steps, epochs, 1, backend),
                "fit spe=1": lambda: keras_overhead_us(steps, epochs, 1),
                "fit spe=128": lambda: keras_overhead_us(steps, epochs, 128)}
    print(f"\n== per-step overhead: one-weight model, batch 1, {steps} steps per epoch, {epochs} epochs (first "
          f"untimed), one device ({strategy_name(backend.strategy)})")
    _report("µs/step", _rounds(variants, rounds), "µs/step")


def horovod_launch(args, timeout_s: float = CHILD_TIMEOUT_S) -> list[dict]:
    """One `horovodrun -np 2 --gloo` run of this script's `--horovod-rank` mode; each rank's result."""
    with tempfile.TemporaryDirectory() as folder:
        cmd = [HOROVODRUN, "-np", "2", "-H", "localhost:2",
               "--gloo", sys.executable, os.path.abspath(__file__), "--horovod-rank", folder, "--data", args.data,
               "--epochs", str(args.epochs)]
        out = _run_group(cmd, timeout_s)
        found = [json.loads(open(os.path.join(folder, f)).read()) for f in sorted(os.listdir(folder))]
    if len(found) != 2:
        raise RuntimeError(f"expected 2 ranks' results from horovodrun, got {len(found)}:\n{out[-3000:]}")
    return found


def _run_group(cmd: list, timeout_s: float) -> str:
    """Run `cmd` in its own process group, on the CPU (no GPU visible: the replicas and ranks compared here are
    CPU ones), and return its stdout; on timeout kill the group (every rank) and raise, with stderr's tail."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise RuntimeError(f"timed out after {timeout_s:.0f} s: {' '.join(cmd)}\n{err[-3000:]}") from None
    if proc.returncode:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{out[-2000:]}\n{err[-3000:]}")
    return out


def horovod_case(case: Case, args, backend) -> None:
    """Horovod, 2 ranks of 32, against the tf backend on one device at global batch 64 (no target)."""
    print(f"\n== horovod: points, 2 ranks (horovodrun --gloo, {case.batch // 2} per rank) against the tf backend "
          f"on one device, global batch {case.batch}, {case.epochs} epochs; launch time not counted")
    per_rank = {}

    def launch():
        results = horovod_launch(args)
        for r in results:
            per_rank.setdefault(r["rank"], []).append(r["examples_per_s"] / 2)
        return statistics.mean(r["examples_per_s"] for r in results)  # each rank times the same global steps

    variants = {"horovod 2 ranks, all": launch, "tf one device": lambda: harness_run(case, backend, "auto")}
    figures = _rounds(variants, args.rounds)
    figures.update({f"horovod rank {r}": v for r, v in sorted(per_rank.items())})
    med = _report("examples/s (global; per rank: its share)", figures)
    print(_ratio(med, "horovod 2 ranks, all", "tf one device"))


def one_device_backend():
    """The tf backend under `OneDeviceStrategy("/cpu:0")`, what one device ran under before the default strategy."""
    import tensorflow as tf

    from harness.distribute.backend import make_backend
    from harness.distribute.context import WorkerContext

    return make_backend("tf", distribution=(tf.distribute.OneDeviceStrategy("/cpu:0"), WorkerContext.single()))


def strategy_name(strategy) -> str:
    from harness.distribute.strategy import strategy_name as name

    return name(strategy)


def write_patches(folder: str, records: int, size: int = 64) -> str:
    """`size`x`size`x8 (64x64x8) float GZIP patches, 4 classes, label `landcover`, 4 shards (`harness synth`'s
    writer)."""
    from harness.data.export import synth

    synth.write_image_export(folder, prefix="patches", shards=4, records=records,
                             bands=[f"B{i}" for i in range(8)], classes=4, patch_size=size, compressed=True, seed=0)
    return folder


def run_cases(args, cases: list, backend, patches: str | None) -> None:
    points = Case("points", args.data, "class", 64, args.epochs)
    unet = Case("unet", patches, "landcover", 16, args.unet_epochs) if patches else None
    mirrored = backend.context.replicas_in_sync > 1
    if "points" in cases or "mirrored" in cases:
        if not os.path.exists(args.data):
            print(f"no ACES points at {args.data}: skipping the points")
        elif mirrored:
            fit_case(points, backend, args.rounds, "mirrored, points")
        else:
            points_case(points, backend, args.rounds, tuple(int(v) for v in args.fit_spe.split(",")))
    if unet is not None:
        fit_case(unet, backend, args.rounds, "mirrored, U-Net" if mirrored else "U-Net")
    if "horovod" in cases and os.path.exists(args.data):
        if os.path.exists(HOROVODRUN):
            horovod_case(points, args, backend)
        else:
            print(f"\nno {HOROVODRUN} (Horovod not installed: tools/install_horovod.sh): skipping horovod")
    if "overhead" in cases:
        overhead_case(backend, args.overhead_steps, args.rounds)


def horovod_rank(args) -> int:
    """One rank under horovodrun: the points case's harness run; its result as JSON in the given folder."""
    from harness.distribute.backend import make_backend

    backend = make_backend("horovod")
    eps = harness_run(Case("points", args.data, "class", 64, args.epochs), backend, "auto")
    with open(os.path.join(args.horovod_rank, f"rank{backend.context.rank}.json"), "w") as f:
        json.dump({"rank": backend.context.rank, "examples_per_s": eps}, f)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--data", default=ACES, help="the ACES points' training file (label `class`)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every variant, in alternating order")
    p.add_argument("--epochs", type=int, default=20,
                   help="epochs per points variant (~0.2 s each at fit speed); the first is not timed")
    p.add_argument("--unet-epochs", type=int, default=3, help="epochs per U-Net variant; the first is not timed")
    p.add_argument("--unet-records", type=int, default=256, help="64x64x8 patches written for the U-Net case")
    p.add_argument("--unet-size", type=int, default=64, help="the U-Net case's patch size (pixels)")
    p.add_argument("--fit-spe", default=",".join(map(str, KERAS_SPE)),
                   help="steps_per_execution values of fit in the points case (comma-separated; the best one "
                        "compared)")
    p.add_argument("--overhead-steps", type=int, default=2000, help="steps per epoch of the one-weight model")
    p.add_argument("--mirrored-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--horovod-rank", help=argparse.SUPPRESS)  # a folder for this rank's result
    args = smoke.parse(p, argv, SMOKE)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(cases) - set(CASES)
    if unknown:
        p.error(f"unknown case(s) {sorted(unknown)}: of {', '.join(CASES)}")
    if args.horovod_rank:
        return horovod_rank(args)

    from harness.distribute.backend import make_backend

    if args.mirrored_child:  # 2 logical CPUs, before any other TensorFlow op; both cases
        backend, cases = make_backend("tf", strategy="mirrored", cpu_replicas=2), ["points", "unet"]
    else:
        backend = make_backend("tf", strategy="single")
        import tensorflow as tf
        print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores; cases {', '.join(cases)}; {args.rounds} "
              f"rounds; {_load()}")
    here = [c for c in cases if c != "mirrored"]
    if here:
        with tempfile.TemporaryDirectory(prefix="harness-step-loop-") as tmp:
            patches = write_patches(tmp, args.unet_records, args.unet_size) if "unet" in here else None
            run_cases(args, here, backend, patches)
    if "mirrored" in cases:
        sys.stdout.flush()
        print(_run_group([sys.executable, os.path.abspath(__file__), "--mirrored-child", "--data", args.data,
                          "--rounds", str(args.rounds), "--epochs", str(args.epochs), "--unet-epochs",
                          str(args.unet_epochs), "--unet-records", str(args.unet_records), "--unet-size",
                          str(args.unet_size)], CHILD_TIMEOUT_S).rstrip())
    if not args.mirrored_child:
        print(f"done [{_load()}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
