"""`harness predict` throughput against the compute ceiling, on a synthetic image export with a kernel margin.

  predict     `harness.predict.stream.predict_shards` over every shard of the export, as `harness predict` runs it:
              read each shard in order, decode, the model, crop, argmax, serialize one Example per patch and
              write the file (under its temporary name, renamed when whole);
  ceiling     the same model's `predict_on_batch` over the same patches already decoded in memory, in batches
              of the same size (no reading, no writing): what the model alone allows.
The model is the built-in U-Net (`harness.train.model.parts.builtin_model`) on the stored patch (P + k), saved and loaded as
`harness predict` loads a run. After one untimed warm-up pass of each, the two take turns for --repeats runs;
prints examples/s (mean, relative spread) and the ratio predict / ceiling per run (median and range): the
target is >= 0.9.

  python benchmarks/predict.py [--patch-size 128] [--kernel-size 8] [--records 64] [--shards 4] [--batch 16]
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

from harness.data.export import synth  # noqa: E402
from harness.predict.job import prepare  # noqa: E402
from harness.predict.options import PredictOptions  # noqa: E402
from harness.predict.reader import ordered_batches  # noqa: E402
from harness.predict.stream import predict_shards  # noqa: E402
from harness.train.model.parts import builtin_model  # noqa: E402

BANDS = ["B2", "B3", "B4", "B8"]
# --smoke: 4 patches of 16 + 8, one timed run; `make test` runs it (tests/bench/test_benchmarks_start.py)
SMOKE = dict(patch_size=16, kernel_size=8, records=4, shards=2, batch=2, repeats=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--patch-size", type=int, default=128, help="P, pixels")
    p.add_argument("--kernel-size", type=int, default=8, help="k: stored patches of P + k")
    p.add_argument("--records", type=int, default=64, help="patches in the export")
    p.add_argument("--shards", type=int, default=4, help="files of the export")
    p.add_argument("--batch", type=int, default=16, help="patches per model call (both paths)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs of each path")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): checks that the benchmark runs; "
                   "its figures mean nothing (flags given explicitly still apply)")
    a = p.parse_args()
    if a.smoke:
        p.set_defaults(**SMOKE)
        a = p.parse_args()
    workdir = tempfile.TemporaryDirectory(prefix="harness-bench-predict-")   # deleted at exit (was left in /tmp)
    tmp = workdir.name
    data = os.path.join(tmp, "data")
    synth.write_image_export(data, prefix="scene", shards=a.shards, records=a.records, bands=BANDS, label=None,
                             patch_size=a.patch_size, kernel_size=a.kernel_size)
    side = a.patch_size + a.kernel_size
    model_path = os.path.join(tmp, "unet.keras")
    builtin_model("image", (side, side, len(BANDS)), 4).save(model_path)
    job = prepare(PredictOptions(model=model_path, data=(data,), output=os.path.join(tmp, "out"),
                                 batch_size=a.batch))
    os.makedirs(job.options.output)
    model = job.loaded.model
    everything = list(range(len(job.outputs)))
    batches = [inputs.numpy() for _, inputs, _ in ordered_batches(job.shards.shards, job.spec, a.batch, {})]

    def predict():
        for _ in predict_shards(job, everything):
            pass

    def ceiling():
        for b in batches:
            model.predict_on_batch(b)

    paths = {"predict": predict, "ceiling": ceiling}
    for fn in paths.values():
        fn()  # warm-up: tracing, file cache
    secs = {k: [] for k in paths}
    for _ in range(a.repeats):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn()
            secs[name].append(time.perf_counter() - t0)
    print(f"{a.records} patches of {side}x{side}x{len(BANDS)} (P={a.patch_size}, k={a.kernel_size}) in "
          f"{a.shards} shards, batch {a.batch}, U-Net, {a.repeats} timed runs, {os.cpu_count()} cores")
    for name, s in secs.items():
        rates = [a.records / t for t in s]
        print(f"  {name:<8} {statistics.mean(rates):>9.1f} examples/s  spread "
              f"{(max(rates) - min(rates)) / statistics.mean(rates):.1%}")
    ratios = [c / p_ for p_, c in zip(secs["predict"], secs["ceiling"])]
    med = statistics.median(ratios)
    print(f"  predict / ceiling = {med:.2f} [{min(ratios):.2f}-{max(ratios):.2f}] "
          f"(target >= 0.90: {'ok' if med >= 0.9 else 'MISSED'})")


if __name__ == "__main__":
    main()
