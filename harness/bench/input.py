"""`harness bench input`: the input pipeline alone on your shards, against the read limit and a per-record pipeline.

  read limit  the harness's own reader (`pipeline.read_files`), records counted, not parsed: harness / read limit
              is what parsing costs on this machine;
  harness     `harness.data.input.pipeline.build_dataset` in evaluation mode (no shuffle, no cache);
  per-record  `map(parse_single_example, AUTOTUNE).batch(B)`, as users commonly write it (parallel reads here).
Each pipeline is consumed inside TensorFlow (`Dataset.reduce`), one untimed warm-up pass, then `--repeats` timed
passes over the files read `--passes` times. Rates are examples/s; MB/s counts uncompressed serialized records
(10^6 bytes); CPU us/ex is process CPU time (all threads) per example, and cores = CPU time / wall time.

This module is also the home of the dataset builders and the counting/timing helpers that
benchmarks/input_pipeline.py uses on the reference exports (sequential and parallel raw reads, both parse orders,
the sequential per-record baseline, pipelines timed in turns).
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

# moved down a layer; used here and by benchmarks/
from harness.data.tune.stage_rates import count_examples, time_passes  # noqa: F401
from harness.distribute import resources


def time_round_robin(runs: dict, expected: dict, repeats: int) -> tuple[dict, dict]:
    """Wall-clock and process CPU seconds of each timed full pass per pipeline (`{label: [s, ...]}` each), after
    one warm-up pass each (tracing, page cache). CPU seconds are `time.process_time` (all threads of this
    process): wall / CPU tells how many cores a pipeline kept busy.

    Pipelines take turns (run 1 of each, then run 2 of each, ...) so a change in machine load hits all alike.
    Raises AssertionError if a pass counts other than `expected[label]` examples.
    """
    for ds in runs.values():
        count_examples(ds)
    secs = {label: [] for label in runs}
    cpu = {label: [] for label in runs}
    for _ in range(repeats):
        for label, ds in runs.items():
            c, t = time.process_time(), time.perf_counter()
            n = count_examples(ds)
            secs[label].append(time.perf_counter() - t)
            cpu[label].append(time.process_time() - c)
            if n != expected[label]:
                raise AssertionError(f"{label}: counted {n} examples, expected {expected[label]}")
    return secs, cpu


def _reads(paths: Sequence[str], parallel: bool):
    """`num_parallel_reads`: one per file up to this worker's CPUs (`resources.for_this_process`), or None
    (sequential, file after file)."""
    return min(len(paths), resources.for_this_process().cpus) if parallel else None


def read_limit(paths: Sequence[str], compression: str, batch: int, *, parallel: bool):
    """Raw records, batched, no parsing: a read limit. TFRecordDataset with the files' compression and the
    pipeline's read buffer (`shards.read_buffer_bytes`), sequential reads or TensorFlow's parallel reads over
    the files (`num_parallel_reads`: one per file, up to the cores)."""
    import tensorflow as tf

    from harness.data.export.shards import read_buffer_bytes

    return tf.data.TFRecordDataset(list(paths), compression_type=compression,
                                   num_parallel_reads=_reads(paths, parallel),
                                   buffer_size=read_buffer_bytes(paths)).batch(batch)


def reader_limit(paths: Sequence[str], compression: str, batch: int, mean_record_bytes: float, *,
                 parallel_reads: int | None = None):
    """Raw records read exactly as the harness reads them, not parsed: `pipeline.read_files` (one TFRecordDataset
    per file, interleaved in parallel, deterministic; small records in read batches of
    `stages.read_batch_size`), regrouped into batches of `batch`. harness / this = the cost of parsing alone.
    `parallel_reads`: the interleave cycle (default: the pipeline's, `stages.decide_parallel_reads`)."""
    from harness.data.input import pipeline, stages as stages_lib

    read_batch = None if stages_lib.parse_per_record(mean_record_bytes) else \
        stages_lib.read_batch_size(mean_record_bytes)
    ds = pipeline.read_files(list(paths), [compression] * len(paths), deterministic=True, shuffle_files=False,
                              seed=0, read_batch=read_batch, parallel_reads=parallel_reads)
    return ds.rebatch(batch) if read_batch else ds.batch(batch)


def per_record(paths: Sequence[str], compression: str, spec, batch: int, *, parallel: bool):
    """What users commonly write, after Google's Earth Engine UNet demo (google/earthengine-community,
    guides/linked/UNET_regression_demo.ipynb): `TFRecordDataset(files, compression_type='GZIP')`,
    `map(parse_single_example ...)` in parallel (AUTOTUNE), then shape, then `batch(B, drop_remainder=True)`.

    `parallel=False` reads the files sequentially, as the demo does (benchmarks/input_pipeline.py);
    `parallel=True` reads one file per core, as `harness bench input` compares it."""
    import tensorflow as tf

    from harness.data.input import decode

    desc = decode.feature_description(spec)

    def parse(record):
        f = tf.io.parse_single_example(record, desc)
        x = tf.stack([tf.cast(f[b], tf.float32) for b in spec.bands], axis=-1)
        if spec.kind == "image":
            s = spec.stored_size
            return tf.reshape(x, [s, s, len(spec.bands)]), tf.reshape(tf.cast(f[spec.label], tf.int32), [s, s])
        return x, tf.cast(f[spec.label], tf.int32)

    ds = tf.data.TFRecordDataset(list(paths), compression_type=compression,
                                 num_parallel_reads=_reads(paths, parallel))
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(batch, drop_remainder=True)


def harness_dataset(shards, spec, batch: int, *, record_first: bool | None = None,
                    parallel_reads: int | None = None):
    """`pipeline.build_dataset` in evaluation mode (no shuffle, no cache); `parallel_reads` as the pipeline option.

    `record_first=None` keeps the parse order the pipeline chooses for the record size; True forces a parse per
    record, then batch; False forces batch-then-parse: read batches of `batch` records, one vectorized parse each.
    """
    from harness.data.input import pipeline, stages

    def build():
        options = stages.PipelineOptions(per_replica_batch_size=batch, training=False, cache="none",
                                         parallel_reads=parallel_reads)
        return pipeline.build_dataset(list(shards), spec, options)

    if record_first is None:
        return build()
    saved = stages.VECTORIZE_MAX_RECORD_BYTES, stages.READ_BATCH_BYTES, stages.READ_BATCH_MAX
    if record_first:
        stages.VECTORIZE_MAX_RECORD_BYTES = -1
    else:
        stages.VECTORIZE_MAX_RECORD_BYTES = float("inf")
        stages.READ_BATCH_BYTES, stages.READ_BATCH_MAX = float("inf"), batch
    try:
        return build()
    finally:
        stages.VECTORIZE_MAX_RECORD_BYTES, stages.READ_BATCH_BYTES, stages.READ_BATCH_MAX = saved


def measure(paths: Sequence[str], *, batch: int, passes: int = 1, repeats: int = 3, label=None,
            which: Sequence[str] = ("read limit", "harness", "per-record")) -> dict:
    """Each pipeline's rate: `{name: {"examples_per_s", "spread", "mb_per_s", "cpu_us_per_example", "cores",
    "examples"}}` (mean over the timed passes; spread = relative standard deviation) plus `"records"`,
    `"mean_record_bytes"` and `"compression"`.

    Raises:
      the named error of harness.data.export.scan.first_bad_record (file, record, feature) when a record fails to parse,
      and the errors of discover_shards / infer_spec / build_dataset."""
    import tensorflow as tf

    from harness.data.export import index
    from harness.data.spec import dataspec as spec_lib, infer
    from harness.data.export.shards import discover_shards, find_mixer

    shards = discover_shards(list(paths))
    spec = infer.infer_spec(shards, mixer=find_mixer(shards), label=label)
    stats = index.record_stats(shards)
    records = sum(s.records for s in stats)
    mean_bytes = sum(s.bytes for s in stats) / max(records, 1)
    compression = shards[0].compression
    files = [s.path for s in shards] * passes
    builders = {
        "read limit": lambda: reader_limit(files, compression, batch, mean_bytes),
        "harness": lambda: harness_dataset(list(shards) * passes, spec, batch),
        "per-record": lambda: per_record(files, compression, spec, batch, parallel=True),
    }
    out = {"records": records * passes, "mean_record_bytes": mean_bytes, "compression": compression or "none"}
    for name in which:
        try:
            n, secs, cpu = time_passes(builders[name](), repeats)
        except tf.errors.InvalidArgumentError:
            from harness.data.export import scan
            bad = scan.first_bad_record(spec, shards)  # name the file, record and feature the parse failed on
            if bad is None and spec.task == spec_lib.CLASSIFICATION:
                bad = scan.bad_label_error(spec, shards, spec.num_classes)
            if bad is None:
                raise
            raise bad from None
        rates = [n / s for s in secs]
        mean = statistics.mean(rates)
        out[name] = {"examples_per_s": mean, "spread": statistics.pstdev(rates) / mean if len(rates) > 1 else 0.0,
                     "mb_per_s": mean * mean_bytes / 1e6, "examples": n,
                     "cpu_us_per_example": statistics.median(cpu) / n * 1e6,
                     "cores": statistics.median(c / w for c, w in zip(cpu, secs))}
    return out
