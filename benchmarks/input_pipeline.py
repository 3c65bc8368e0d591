"""Input pipeline throughput: the read limit, the harness pipeline and a per-record parse map, on the same files.

For each dataset (small records: the real Earth Engine point export; large records: 256x256x8 float GZIP
patches written by `harness.data.export.synth` exactly as Earth Engine lays them out) it times, in one run:
  raw-seq/par  TFRecordDataset with the right compression, sequential or with parallel reads (one per core),
               records batched and counted inside TensorFlow, no parsing; the faster one is the read limit;
  harness      harness.data.input.pipeline.build_dataset (evaluation mode: no shuffle, no cache), in the parse order it
               chooses for the record size (small: parse read batches of ~256 kB, then regroup; large: parse per
               record in parallel, then batch);
  harness-alt  the same with the other order (small: parse per record; large: batch, then one parse per batch),
               to show the choice;
  per-record   `TFRecordDataset(files).map(parse_single_example, AUTOTUNE).batch(B)` as users commonly write it
               (Google's Earth Engine UNet demo), with sequential reads as the demo has them.
The builders and the timing are shared with `harness bench input` (harness/bench/input.py).
Every pipeline is consumed by `Dataset.reduce` (no per-batch Python), after one untimed warm-up pass; a run
reads the file list --passes times over; the pipelines take turns for --repeats runs. Prints examples/s (mean,
relative spread, best) and MB/s of the best run (uncompressed serialized records, 10^6 bytes), then the ratios
against the targets: per run, the harness rate over the other pipeline's rate measured just before or after it
(for the read limit, the faster of raw-seq and raw-par in that run), median and range over the runs. Load from
other processes on a shared machine moves whole runs; pairing within a run cancels most of it.

  python benchmarks/input_pipeline.py [--only points|image] [--image-records 48] [--repeats 7]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import harness  # noqa: E402,F401  (environment defaults before TensorFlow)
import tensorflow as tf  # noqa: E402

from harness.bench.input import (harness_dataset, per_record, read_limit, reader_limit,  # noqa: E402
                                 time_round_robin)
from harness.data.export import index, shards as shards_lib, synth  # noqa: E402
from harness.data.input import stages  # noqa: E402
from harness.data.spec import infer as spec_lib  # noqa: E402
import _smoke as smoke  # noqa: E402  (benchmarks/_smoke.py, beside this script)

from _shared import ACES_POINTS as POINTS  # noqa: E402  (benchmarks/_shared.py, beside this script)
# --smoke: one run, 4 image patches read once, the 256 points 4x (one pass, ~50 ms, once printed 0.0 MB/s when its
# reader's start stalled 0.4 s under load); `make test` runs it (tests/bench/test_benchmarks_start.py)
SMOKE = dict(points_batch=64, points_passes=4, image_records=4, image_shards=2, image_batch=2, image_passes=1,
             repeats=1)


def _median_ratio(secs, expected, num, dens):
    """Median and range over the runs of rate(num) / max(rate(d) for d in dens), each run's rates measured
    back to back (machine load shifts between runs, far less within one)."""
    ratios = []
    for r in range(len(secs[num])):
        rate = {k: expected[k] / secs[k][r] for k in [num, *dens]}
        ratios.append(rate[num] / max(rate[d] for d in dens))
    return statistics.median(ratios), min(ratios), max(ratios)


def _line(name, r, target=None):
    verdict = "" if target is None else f"  (target >= {target:.2f}: {'ok' if r[0] >= target else 'MISSED'})"
    return f"  {name:<38} = {r[0]:.2f} [{r[1]:.2f}-{r[2]:.2f}]{verdict}"


def bench(name, shards, spec, batch, passes, repeats):
    stats = index.record_stats(shards)
    records = sum(s.records for s in stats)
    mean_bytes = sum(s.bytes for s in stats) / records
    # Each pass reads the file list `passes` times over (one pipeline, so start-up and autotuning are amortised
    # as in training, where the pipeline repeats forever).
    shards = list(shards) * passes
    # The harness pipelines run in evaluation mode, which keeps every record (its last batch partial); the
    # hand-written per-record pipeline drops the remainder, as Google's demo does.
    whole = (records * passes // batch) * batch
    record_first = stages.parse_per_record(mean_bytes)
    read_batch = 1 if record_first else stages.read_batch_size(mean_bytes)
    order = {True: "parse per record, then batch",
             False: f"parse read batches of {read_batch}, then regroup"}
    alt = {True: "parse per record, then batch", False: f"batch {batch}, then parse"}
    print(f"\n== {name}: {len(shards)} shard(s), {records} records, {mean_bytes / 1e3:.1f} kB/record, "
          f"{shards[0].compression or 'uncompressed'}, batch {batch}, files read {passes}x per run, {repeats} runs; "
          f"harness chooses: {order[record_first]}")
    files, compression = [s.path for s in shards], shards[0].compression
    runs = {
        "raw-seq": read_limit(files, compression, batch, parallel=False),
        "raw-par": read_limit(files, compression, batch, parallel=True),
        "raw-reader": reader_limit(files, compression, batch, mean_bytes),
        "harness": harness_dataset(shards, spec, batch),
        "harness-alt": harness_dataset(shards, spec, batch, record_first=not record_first),
        # sequential reads, as Google's Earth Engine UNet demo does (see harness.bench.input.per_record)
        "per-record": per_record(files, compression, spec, batch, parallel=False),
    }
    notes = {"raw-seq": "TFRecordDataset, sequential", "raw-par": "TFRecordDataset, num_parallel_reads",
             "raw-reader": "the harness's reader, not parsed", "harness": order[record_first],
             "harness-alt": alt[not record_first], "per-record": "map(parse_single_example)"}
    expected = {label: whole if label == "per-record" else records * passes for label in runs}
    secs, cpu = time_round_robin(runs, expected, repeats)
    print(f"  {'pipeline':<12} {'examples/s':>11} {'spread':>7} {'best':>11} {'MB/s':>7} {'CPU us/ex':>10} "
          f"{'cores':>5}  note")
    cpu_per = {}
    for label in runs:
        eps = [expected[label] / s for s in secs[label]]
        mean = statistics.mean(eps)
        spread = statistics.pstdev(eps) / mean if len(eps) > 1 else 0.0
        cpu_per[label] = statistics.median(c / expected[label] for c in cpu[label])
        cores = statistics.median(c / s for c, s in zip(cpu[label], secs[label]))
        print(f"  {label:<12} {mean:>11,.0f} {spread:>6.0%} {max(eps):>11,.0f} {max(eps) * mean_bytes / 1e6:>7.1f} "
              f"{cpu_per[label] * 1e6:>10.1f} {cores:>5.2f}  {notes[label]}")
    need_rec = 1.0 if record_first else 1.5
    result = {
        "read limit": _median_ratio(secs, expected, "harness", ["raw-seq", "raw-par", "raw-reader"]),
        "tfrecorddataset": _median_ratio(secs, expected, "harness", ["raw-seq", "raw-par"]),
        "per-record": _median_ratio(secs, expected, "harness", ["per-record"]),
        "other order": _median_ratio(secs, expected, "harness", ["harness-alt"]),
        "cpu ceiling": cpu_per["raw-reader"] / cpu_per["harness"],
    }
    print(f"  ratios of examples/s, median [min-max] over the {repeats} runs, each run's pipelines back to back:")
    print(_line("harness / read limit (fastest raw read)", result["read limit"], 0.9))
    print(_line("harness / TFRecordDataset (seq or par)", result["tfrecorddataset"]))
    print(_line("harness / per-record", result["per-record"], need_rec))
    print(_line("harness / other order", result["other order"]) +
          f"  ({'the choice holds' if result['other order'][0] >= 1 else 'the other order won'})")
    print(f"  CPU per example: raw-reader / harness = {result['cpu ceiling']:.2f}: with every core busy reading, the "
          "harness can reach at most this fraction of the reader's rate (parsing needs the rest)")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--only", choices=["points", "image"], help="run one dataset only")
    p.add_argument("--points", default=POINTS, help="small-record export (the real point export)")
    p.add_argument("--points-batch", type=int, default=256)
    p.add_argument("--points-passes", type=int, default=10)
    p.add_argument("--image-dir", help="existing image export; default: write a synthetic one to a temp folder")
    p.add_argument("--image-records", type=int, default=32)
    p.add_argument("--image-shards", type=int, default=4)
    p.add_argument("--image-batch", type=int, default=16)
    p.add_argument("--image-passes", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    args = smoke.parse(p, argv, SMOKE)
    logging.basicConfig(level=logging.WARNING)
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores")
    if args.only in (None, "points"):
        found = shards_lib.discover_shards(args.points)
        spec = spec_lib.infer_spec(found)
        bench("small records (Earth Engine point export)", found, spec, args.points_batch, args.points_passes,
              args.repeats)
    if args.only in (None, "image"):
        with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
            folder = args.image_dir
            if not folder:
                folder = tmp
                t = time.perf_counter()
                synth.write_image_export(folder, prefix="bench", shards=args.image_shards,
                                         records=args.image_records, bands=[f"B{i}" for i in range(8)],
                                         classes=4, patch_size=256, kernel_size=0, compressed=True, seed=0)
                print(f"\n(wrote {args.image_records} synthetic 256x256x8 GZIP patches in "
                      f"{time.perf_counter() - t:.0f} s)")
            found = shards_lib.discover_shards(folder)
            spec = spec_lib.infer_spec(found, mixer=shards_lib.find_mixer(found))
            bench("large records (256x256x8 float GZIP patches)", found, spec, args.image_batch,
                  args.image_passes, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
