"""Overhead of the step timeline: training throughput with the timeline on vs off, in the same run.

One model and one synthetic on-device batch (as `harness bench train --data synthetic`), trained in alternating
segments of --steps steps: "off" with a timer that records nothing and no sampler, "on" with the profile
session's step timer and its GPU/CPU sampler thread (every --interval s), no tf.profiler trace (a trace window is
opt-in and costs what the profiler costs). Throughput is wall-clock examples/s of each segment, measured outside
the loop; the first segment of each kind is warm-up. Prints the median of each and the median of the adjacent pairs' ratios on/off (target >= 0.98).

  python benchmarks/profile_overhead.py [--pairs 6] [--steps 30] [--patch 32] [--batch 8]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import harness  # noqa: E402,F401  (environment defaults before TensorFlow)
import _smoke as smoke  # noqa: E402  (benchmarks/_smoke.py, beside this script)

# --smoke: one timed pair of 3 steps of 16x16 patches; `make test` runs it (tests/bench/test_benchmarks_start.py)
SMOKE = dict(pairs=2, steps=3, patch=16, batch=2)


class NullTimer:
    """A StepTimer that records nothing: the loop without a timeline."""

    steps: list = []

    def begin(self):
        return None

    def got_input(self, mark):
        pass

    def end(self, mark, step, examples):
        return None

    def end_call(self, mark, first_step, waits_s, durations_s, examples):
        return []

    def summary(self, steps=None):
        return {"examples_per_s": 0.0, "input_stall_share": 0.0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--pairs", type=int, default=6, help="off/on segment pairs (the first pair is warm-up)")
    p.add_argument("--steps", type=int, default=30, help="steps per segment")
    p.add_argument("--patch", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--interval", type=float, default=0.05, help="utilization sampling period, seconds")
    args = smoke.parse(p, argv, SMOKE)

    import tensorflow as tf

    from harness.train.loop.synthetic import Shapes, synthetic_batches
    from harness.distribute.strategy import make_strategy
    from harness.profile.session import ProfileSession
    from harness.train.model.parts import RunParts
    from harness.train.options import TrainOptions
    from harness.distribute.backend import TrainingBackend
    from harness.train.loop import factory
    from harness.train.loop.controller import Schedule

    strategy, context = make_strategy("single")
    backend = TrainingBackend(strategy, context)
    shapes = Shapes("image", (args.patch, args.patch, 4), 4)
    parts = RunParts(TrainOptions(data=("synthetic",), per_replica_batch_size=args.batch))   # Adam 1e-3, float32
    with strategy.scope():
        model = parts.build_builtin(shapes.kind, shapes.input_shape, shapes.num_classes)
        optimizer = parts.create_optimizer()
    run = factory.build_run(backend, model, optimizer, factory.synthetic_batch(backend, args.batch),
                            Schedule(epochs=1, steps_per_epoch=args.steps, warmup_steps=0), epoch_lines=False,
                            loss_fn=parts.loss)
    controller = run.controller
    batches = synthetic_batches(strategy, shapes, args.batch)
    rates = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for mode in (("off", "on") if pair % 2 else ("on", "off")):  # alternate the order: drift cancels
                session = None
                if mode == "on":
                    session = ProfileSession(context=context, strategy=strategy, output=tmp, warmup_steps=0,
                                             interval_s=args.interval)
                    controller.timer = session.timer
                    session.start()
                else:
                    controller.timer = NullTimer()
                t = time.perf_counter()
                controller.fit(batches)
                rate = args.steps * args.batch / (time.perf_counter() - t)
                if session is not None:
                    session.sampler.stop()
                if pair:  # the first pair is warm-up (tracing)
                    rates[mode].append(rate)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores; U-Net {args.patch}x{args.patch}x4, batch "
          f"{args.batch}, {args.pairs - 1} timed pairs of {args.steps} steps, sampling every {args.interval} s")
    for mode, values in rates.items():
        spread = statistics.pstdev(values) / statistics.mean(values)
        print(f"  timeline {mode:<3}  {statistics.median(values):8.1f} examples/s (median; spread {spread:.1%}; "
              f"segments {', '.join(f'{v:.0f}' for v in values)})")
    # Adjacent segments share the machine's load (2 shared cores here): the median of the pairs' ratios is the
    # steadier figure; the ratio of medians is printed beside it.
    pairs = [a / b for a, b in zip(rates["on"], rates["off"])]
    ratio = statistics.median(pairs)
    print(f"  on / off = {ratio:.3f} (median of {len(pairs)} adjacent pairs; ratio of medians {on / off:.3f})  "
          f"(target >= 0.98: {'ok' if ratio >= 0.98 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
