"""Reading an Earth Engine GZIP export vs the same records after `harness reshard` (uncompressed, balanced shards).

Writes a synthetic image export laid out as Earth Engine writes it (few large GZIP shards of float patches, as an
export of a big region comes out), reshards it for --workers workers x --shards-per-worker, then times, on the same
records, the read limit (raw records, parallel reads) and the harness input pipeline (`build_dataset`, evaluation
mode, no cache) for each, with `harness.bench.input.measure` (one warm-up pass, --repeats timed passes).
Prints examples/s, mean and spread, and the gain; target >= 2x examples/s for the harness pipeline.

  python benchmarks/reshard.py [--records 96] [--patch 128] [--bands 8] [--shards 2] [--workers 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import harness  # noqa: E402,F401  (environment defaults before TensorFlow)

from harness.bench.input import measure  # noqa: E402
from harness.data.export import reshard, synth  # noqa: E402
import _smoke as smoke  # noqa: E402  (benchmarks/_smoke.py, beside this script)

# --smoke: 8 patches of 16x16x2, one pass; `make test` runs it (tests/bench/test_benchmarks_start.py)
SMOKE = dict(records=8, patch=16, bands=2, shards=1, workers=2, shards_per_worker=1, batch=4, passes=1, repeats=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--records", type=int, default=96)
    p.add_argument("--patch", type=int, default=128, help="patch side (no margin)")
    p.add_argument("--bands", type=int, default=8)
    p.add_argument("--shards", type=int, default=1, help="GZIP shards in the export (a region that fits one file)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shards-per-worker", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = smoke.parse(p, argv, SMOKE)
    import tensorflow as tf
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores")
    with tempfile.TemporaryDirectory(prefix="harness-reshard-") as tmp:
        src, dst = os.path.join(tmp, "gzip"), os.path.join(tmp, "resharded")
        t = time.perf_counter()
        synth.write_image_export(src, prefix="export", shards=args.shards, records=args.records,
                                 bands=[f"B{i}" for i in range(args.bands)], patch_size=args.patch, compressed=True)
        print(f"wrote {args.records} {args.patch}x{args.patch}x{args.bands} float patches in {args.shards} GZIP "
              f"shards in {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        result = reshard.reshard([src], dst, workers=args.workers, shards_per_worker=args.shards_per_worker)
        print(f"resharded into {len(result['shards'])} uncompressed shards in {time.perf_counter() - t:.1f} s")
        figures = {}
        for name, folder in (("GZIP export", src), ("resharded", dst)):
            figures[name] = measure([folder], batch=args.batch, passes=args.passes, repeats=args.repeats,
                                    which=("read limit", "harness"))
        print(f"\n  {'data':<12} {'pipeline':<11} {'examples/s':>11} {'spread':>7} {'MB/s':>8}")
        for name, fig in figures.items():
            for pipe in ("read limit", "harness"):
                r = fig[pipe]
                print(f"  {name:<12} {pipe:<11} {r['examples_per_s']:>11,.1f} {r['spread']:>6.1%} "
                      f"{r['mb_per_s']:>8.1f}")
        for pipe in ("read limit", "harness"):
            gain = figures["resharded"][pipe]["examples_per_s"] / figures["GZIP export"][pipe]["examples_per_s"]
            target = "  (target >= 2.00: " + ("ok)" if gain >= 2 else "MISSED)") if pipe == "harness" else ""
            print(f"  gain, {pipe}: {gain:.2f}x{target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
