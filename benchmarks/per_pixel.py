"""`harness predict` of a run trained on a table export over an image export (per pixel, `Geometry.per_pixel`)
against the model a user converts by hand: each Dense layer rebuilt as a 1x1 Conv2D on `Input((None, None, C))`,
weights copied, over the same export.

  per-pixel   the run (the built-in pixel classifier, `[batch, bands]`, its normalization inside) as `harness
              predict` maps it: each patch's central P x P pixels as rows, the model, the map reshaped back;
  converted   the hand-converted model, a bare `.keras` over the stored patch (P + k), cropped after.
Both are `harness.predict.stream.predict_shards` over every shard (read, decode, model, argmax, write). After one
untimed warm-up pass of each, the two take turns for --repeats runs; prints examples/s (mean, relative spread),
the pixels whose class differs between the two (0 expected: the same weights) and the ratio per-pixel /
converted per run (median and range): the target is >= 1.0.

  python benchmarks/per_pixel.py [--patch-size 256] [--kernel-size 0] [--records 32] [--shards 2] [--batch 8]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))   # predict_support.read_outputs: the tests' reader of the outputs

import harness  # noqa: E402,F401  (environment defaults before TensorFlow)
import numpy as np  # noqa: E402
import tf_keras as keras  # noqa: E402

from harness.data.export import synth  # noqa: E402
from harness.predict.job import prepare  # noqa: E402
from harness.predict.options import PredictOptions  # noqa: E402
from harness.predict.stream import predict_shards  # noqa: E402
from harness.train.model.parts import builtin_model  # noqa: E402
import _smoke as smoke  # noqa: E402  (benchmarks/_smoke.py, beside this script)
from predict_support import read_outputs  # noqa: E402  (tests/predict_support.py)

BANDS = ["B2", "B3", "B4", "B8"]
CLASSES = 4
# --smoke: 4 patches of 16 + 8, one timed run; `make test` runs it (tests/bench/test_benchmarks_start.py)
SMOKE = dict(patch_size=16, kernel_size=8, records=4, shards=2, batch=2, repeats=1)


def converted(model) -> keras.Model:
    """The hand conversion: the same layers over `[batch, H, W, bands]`, each Dense a 1x1 Conv2D."""
    x = image = keras.Input((None, None, len(BANDS)))
    for layer in model.layers[1:]:
        if isinstance(layer, keras.layers.Dense):
            kernel, bias = layer.get_weights()
            conv = keras.layers.Conv2D(layer.units, 1, activation=layer.activation, dtype=layer.dtype)
            x = conv(x)
            conv.set_weights([kernel[None, None], bias])
        else:   # the Normalization (its mean and variance in its config): acts on the last axis as it is
            x = layer.__class__.from_config(layer.get_config())(x)
    return keras.Model(image, x)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--patch-size", type=int, default=256, help="P, pixels")
    p.add_argument("--kernel-size", type=int, default=0, help="k: stored patches of P + k")
    p.add_argument("--records", type=int, default=32, help="patches in the export")
    p.add_argument("--shards", type=int, default=2, help="files of the export")
    p.add_argument("--batch", type=int, default=8, help="patches per model call (both paths)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each path")
    a = smoke.parse(p, argv, SMOKE)
    workdir = tempfile.TemporaryDirectory(prefix="harness-bench-per-pixel-")
    tmp = workdir.name
    data = os.path.join(tmp, "data")
    synth.write_image_export(data, prefix="scene", shards=a.shards, records=a.records, bands=BANDS, label=None,
                             patch_size=a.patch_size, kernel_size=a.kernel_size)
    rng = np.random.default_rng(0)
    model = builtin_model("table", (len(BANDS),), CLASSES, mean=rng.normal(size=len(BANDS)).tolist(),
                          variance=rng.uniform(0.5, 2, size=len(BANDS)).tolist())
    for layer in model.layers:   # trained-like weights: every class appears
        if isinstance(layer, keras.layers.Dense):
            layer.set_weights([w + rng.normal(scale=0.5, size=w.shape) for w in layer.get_weights()])
    run = os.path.join(tmp, "run")
    os.makedirs(run)
    model.save(os.path.join(run, "model.keras"))
    with open(os.path.join(run, "summary.json"), "w") as f:   # the spec `harness train` writes for a table run
        json.dump({"spec": {"kind": "table", "bands": BANDS, "label": "class", "num_classes": CLASSES}}, f)
    converted(model).save(os.path.join(tmp, "converted.keras"))
    jobs = {name: prepare(PredictOptions(model=path, data=(data,), output=os.path.join(tmp, name),
                                         batch_size=a.batch))
            for name, path in (("per-pixel", run), ("converted", os.path.join(tmp, "converted.keras")))}
    for job in jobs.values():
        os.makedirs(job.options.output)

    def predict(job):
        for path in job.outputs:
            if os.path.exists(path):
                os.remove(path)
        for _ in predict_shards(job, list(range(len(job.outputs)))):
            pass

    for job in jobs.values():
        predict(job)  # warm-up: tracing, file cache
    maps = {name: np.concatenate([r["class"] for r in read_outputs(job.outputs)]) for name, job in jobs.items()}
    differ = int(np.sum(maps["per-pixel"] != maps["converted"]))
    secs = {name: [] for name in jobs}
    for _ in range(a.repeats):
        for name, job in jobs.items():
            t0 = time.perf_counter()
            predict(job)
            secs[name].append(time.perf_counter() - t0)
    side = a.patch_size + a.kernel_size
    print(f"{a.records} patches of {side}x{side}x{len(BANDS)} (P={a.patch_size}, k={a.kernel_size}) in {a.shards} "
          f"shards, batch {a.batch}, pixel classifier (64, 64), {a.repeats} timed runs, {os.cpu_count()} cores")
    for name, s in secs.items():
        rates = [a.records / t for t in s]
        print(f"  {name:<10} {statistics.mean(rates):>9.1f} examples/s  spread "
              f"{(max(rates) - min(rates)) / statistics.mean(rates):.1%}")
    print(f"  pixels whose class differs: {differ} of {maps['per-pixel'].size}")
    ratios = [c / p_ for p_, c in zip(secs["per-pixel"], secs["converted"])]
    med = statistics.median(ratios)
    print(f"  per-pixel / converted = {med:.2f} [{min(ratios):.2f}-{max(ratios):.2f}] "
          f"(target >= 1.0: {'ok' if med >= 1.0 else 'MISSED'})")


if __name__ == "__main__":
    main()
