"""The harness training loop against Keras `Model.fit` on one model, precision, batch and dataset: the harness/fit
ratio that `benchmarks/gpu_check.sh` prints for the U-Net with mixed_float16.

Both sides build the built-in model (the U-Net for image exports) and Adam 1e-3 from the run's parts
(`harness.train.model.parts.RunParts`, as `harness train` does) under the same strategy and the policy of --precision, and read the same dataset: the harness's own input
pipeline (`harness.train.inputs.prepare`, as `harness train` builds it). The harness side is `Trainer.fit` at
`steps_per_loop: auto`; the Keras side is `model.compile(..., steps_per_execution=N); model.fit(ds,
steps_per_epoch=S)` at N = 1 and at the K the harness chose. A figure is examples/s from the end of the first
epoch (tracing, cache fill) to the end of the last; variants alternate for --rounds rounds; printed: each figure,
then the ratios of the medians.

  python benchmarks/fit_ratio.py --data DIR [--precision mixed_float16] [--batch 64] [--steps 30] [--epochs 3]
                                 [--rounds 2] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import harness  # noqa: E402,F401  (environment defaults before TensorFlow)
import _smoke as smoke  # noqa: E402  (benchmarks/_smoke.py, beside this script)

# --smoke: one round of 2 epochs of 2 steps of 4; `make test` runs it (tests/bench/test_benchmarks_start.py)
SMOKE = dict(batch=4, steps=2, epochs=2, rounds=1)


def _setup(args):
    from harness.distribute.backend import TrainingBackend
    from harness.distribute.strategy import make_strategy
    from harness.train.inputs import prepare
    from harness.train.model.parts import RunParts
    from harness.train.options import TrainOptions

    strategy, context = make_strategy("auto")
    backend = TrainingBackend(strategy, context)
    options = TrainOptions(data=(args.data,), per_replica_batch_size=args.batch, precision=args.precision,
                           output=os.path.join(args.output, "run"))
    parts = RunParts(options)   # `harness train`'s: Adam at 1e-3, the cross-entropy, the policy of --precision
    policy = parts.apply_policy()
    return backend, policy, parts, prepare(options, backend)


def _model(backend, parts, inputs, *, wrap: bool):
    """The built-in model and the optimizer (wrapped for loss scaling where the policy needs it, unless `wrap` is
    False: Keras `compile` wraps its own), from the run's parts."""
    with backend.scope():
        model = parts.build_builtin(inputs.spec.kind, tuple(inputs.spec.input_shape), inputs.num_classes,
                                    mean=inputs.mean, variance=inputs.variance)
        return model, parts.create_optimizer(wrap=wrap)


def harness_rate(args, backend, parts, inputs) -> tuple[float, int]:
    """(examples/s, the K that auto chose) of the harness's trainer, built as `harness train` builds it."""
    from harness.train.loop import factory
    from harness.train.loop.controller import EpochEnd, Schedule

    model, optimizer = _model(backend, parts, inputs, wrap=True)
    batch = inputs.plan.global_batch_size
    ends = []
    controller = factory.build_run(backend, model, optimizer, inputs.plan,
                                   Schedule(epochs=args.epochs, steps_per_epoch=args.steps), epoch_lines=False,
                                   loss_fn=parts.loss,
                                   actions=[EpochEnd(lambda *_: ends.append(time.perf_counter()))]).controller
    controller.fit(iter(backend.distribute(inputs.dataset_fn(True))))
    k = min(controller.steps_per_loop or 1, args.steps)   # a call never crosses an epoch's end
    return batch * args.steps * (len(ends) - 1) / (ends[-1] - ends[0]), k


def fit_rate(args, backend, parts, inputs, steps_per_execution: int) -> float:
    """examples/s of Keras `fit` (its mixed-precision compile wraps the optimizer itself)."""
    import tensorflow as tf
    import tf_keras as keras

    model, optimizer = _model(backend, parts, inputs, wrap=False)
    with backend.scope():
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)
    ends = []
    dataset = inputs.dataset_fn(True)(tf.distribute.InputContext())
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0,
              callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: ends.append(time.perf_counter()))])
    return inputs.plan.global_batch_size * args.steps * (len(ends) - 1) / (ends[-1] - ends[0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="an image export (or a table export) to train on")
    p.add_argument("--precision", default="mixed_float16")
    p.add_argument("--batch", type=int, default=64, help="per-replica batch")
    p.add_argument("--steps", type=int, default=30, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=3, help="epochs per variant; the first is not timed")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every variant, in alternating order")
    p.add_argument("--output", default="runs/fit_ratio", help="scratch folder")
    p.add_argument("--json", help="write the figures here")
    args = smoke.parse(p, argv, SMOKE)

    backend, policy, parts, inputs = _setup(args)
    rates = {"harness": [], "fit_spe1": [], "fit_speK": []}
    k = 1
    for round_ in range(args.rounds):
        # the harness first in round 1: fit at K needs its K
        order = ("harness", "fit_spe1", "fit_speK") if round_ % 2 == 0 else ("fit_speK", "fit_spe1", "harness")
        for name in order:
            if name == "harness":
                rate, k = harness_rate(args, backend, parts, inputs)
            else:
                rate = fit_rate(args, backend, parts, inputs, 1 if name == "fit_spe1" else k)
            rates[name].append(rate)
            print(f"round {round_ + 1} {name:<9} {rate:10.1f} examples/s" + (f" (K={k})" if name != "fit_spe1"
                                                                                  else ""), flush=True)
    med = {name: statistics.median(r) for name, r in rates.items()}
    result = {"precision": policy, "model": "unet" if inputs.spec.kind == "image" else "pixel_classifier",
              "global_batch": inputs.plan.global_batch_size, "steps_per_loop": k, "examples_per_s": rates,
              "ratio_fit_spe1": med["harness"] / med["fit_spe1"], "ratio_fit_speK": med["harness"] / med["fit_speK"]}
    print(f"harness/fit ratio ({result['model']}, {policy}, batch {result['global_batch']}): "
          f"{result['ratio_fit_spe1']:.2f} against steps_per_execution 1, {result['ratio_fit_speK']:.2f} against "
          f"steps_per_execution {k} (medians of {args.rounds} rounds)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
