"""`harness bench input`: the input pipeline alone on your shards, against the read limit and a per-record pipeline.

  read limit  TFRecordDataset with parallel reads (one per file, up to the cores), records counted, no parsing;
  harness     `harness.data.pipeline.build_dataset` in evaluation mode (no shuffle, no cache);
  per-record  `map(parse_single_example, AUTOTUNE).batch(B)`, as users commonly write it.
Each pipeline is consumed inside TensorFlow (`Dataset.reduce`), one untimed warm-up pass, then `--repeats` timed
passes over the files read `--passes` times. (benchmarks/input_pipeline.py does the same on the reference
exports, with both parse orders.)
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Sequence


def _count(element):
    import tensorflow as tf

    first = tf.nest.flatten(element)[0]
    return tf.shape(first, out_type=tf.int64)[0]


def time_passes(ds, repeats: int) -> tuple[int, list[float]]:
    """(examples per pass, seconds of each timed pass) after one warm-up pass."""
    import tensorflow as tf

    def count():
        return int(ds.reduce(tf.constant(0, tf.int64), lambda acc, e: acc + _count(e)))

    n = count()
    secs = []
    for _ in range(repeats):
        t = time.perf_counter()
        count()
        secs.append(time.perf_counter() - t)
    return n, secs


def read_limit(paths: Sequence[str], compression: str, batch: int):
    import tensorflow as tf

    from harness.data import pipeline

    reads = min(len(paths), os.cpu_count() or 1)
    return tf.data.TFRecordDataset(list(paths), compression_type=compression, num_parallel_reads=reads,
                                   buffer_size=pipeline.READ_BUFFER_BYTES).batch(batch)


def per_record(paths: Sequence[str], compression: str, spec, batch: int):
    import tensorflow as tf

    from harness.data import pipeline

    desc = pipeline.feature_description(spec)

    def parse(record):
        return _parse_one(tf, spec, desc, record)

    reads = min(len(paths), os.cpu_count() or 1)
    ds = tf.data.TFRecordDataset(list(paths), compression_type=compression, num_parallel_reads=reads)
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(batch, drop_remainder=True)


def _parse_one(tf, spec, desc, record):
    f = tf.io.parse_single_example(record, desc)
    x = tf.stack([tf.cast(f[b], tf.float32) for b in spec.bands], axis=-1)
    if spec.kind == "image":
        s = spec.stored_size
        return tf.reshape(x, [s, s, len(spec.bands)]), tf.reshape(tf.cast(f[spec.label], tf.int32), [s, s])
    return x, tf.cast(f[spec.label], tf.int32)


def measure(paths: Sequence[str], *, batch: int, passes: int = 1, repeats: int = 3, label=None,
            which: Sequence[str] = ("read limit", "harness", "per-record")) -> dict:
    """examples/s of each pipeline: `{name: {"examples_per_s", "spread", "mb_per_s"}}` plus `"records"`,
    `"mean_record_bytes"` and `"compression"`."""
    from harness.data import index, pipeline, spec as spec_lib
    from harness.data.shards import discover_shards, find_mixer

    shards = discover_shards(list(paths))
    spec = spec_lib.infer_spec(shards, mixer=find_mixer(shards), label=label)
    stats = index.record_stats(shards)
    records = sum(s.records for s in stats)
    mean_bytes = sum(s.bytes for s in stats) / max(records, 1)
    compression = shards[0].compression
    files = [s.path for s in shards] * passes
    builders = {
        "read limit": lambda: read_limit(files, compression, batch),
        "harness": lambda: pipeline.build_dataset(list(shards) * passes, spec, per_replica_batch_size=batch,
                                                  training=False, cache="none"),
        "per-record": lambda: per_record(files, compression, spec, batch),
    }
    out = {"records": records * passes, "mean_record_bytes": mean_bytes, "compression": compression or "none"}
    for name in which:
        n, secs = time_passes(builders[name](), repeats)
        rates = [n / s for s in secs]
        mean = statistics.mean(rates)
        out[name] = {"examples_per_s": mean, "spread": statistics.pstdev(rates) / mean if len(rates) > 1 else 0.0,
                     "mb_per_s": mean * mean_bytes / 1e6, "examples": n}
    return out


def main(args) -> int:
    """`harness bench input --data PATH [--batch B] [--passes P] [--repeats R]`."""
    result = measure(args.data, batch=args.batch, passes=args.passes, repeats=args.repeats, label=args.label)
    print(f"{result['records']} records per pass ({result['mean_record_bytes'] / 1e3:.1f} kB each, "
          f"{result['compression']}), batch {args.batch}, {args.repeats} timed passes")
    print(f"  {'pipeline':<11} {'examples/s':>12} {'spread':>7} {'MB/s':>8}")
    for name in ("read limit", "harness", "per-record"):
        r = result[name]
        print(f"  {name:<11} {r['examples_per_s']:>12,.0f} {r['spread']:>6.1%} {r['mb_per_s']:>8.1f}")
    h = result["harness"]["examples_per_s"]
    print(f"  harness / read limit = {h / result['read limit']['examples_per_s']:.2f}, "
          f"harness / per-record = {h / result['per-record']['examples_per_s']:.2f}")
    return 0
