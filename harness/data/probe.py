"""The input pipeline's stages probed one at a time on one core (`harness tune` and `harness train --tune`): each
stage's examples/s per core and its output bytes per example, as `harness.data.tune.Measured` takes them.

Probes (each on the first `records` records of the shards given, a few hundred, read once into memory where the
stage reads from memory, and run over them `passes_for` times; timed by `time_passes`: one warm-up pass, then
`repeats` passes, the median's process CPU seconds): every probe runs on one core (a private thread pool of one
thread, no intra-op parallelism, no autotuning), so its rate is examples/s per core, as Plumber measures each op's
rate per core (Kuchnik et al., MLSys 2022). A stage that only runs after another is timed with it and without it;
its cost is the difference.

  read     the files' bytes (`tf.io.gfile`), examples/s at the files' bytes per record
  inflate  `TFRecordDataset(compression_type="GZIP")` less the read (GZIP exports only)
  parse    `tf.io.parse_example` per record, and per read batch (`stages.read_batch_size`), less the in-memory source
  decode   the pipeline's `decode` (bands stacked, cropped, resized; label checked) less the parse
  unbatch  decoded read batches held in memory split into records, less the same records held one by one
  augment  the pipeline's flips, rotations and color jitter on batches held in memory (when the run augments)
  start    a fresh training iterator's first batches less as many more (`start_seconds`): what only a new
           iterator pays, its threads and functions starting (wall seconds, not per core)
  batch    decoded records held in memory, shuffled and batched, one shuffle per epoch as the training pipeline
           runs its epochs (what later epochs run after a cache); one thread (`max_cores` 1), but where a batch
           holds at least PARALLEL_COPY_BYTES, which tf.data copies on every thread of its pool: `max_cores` the
           worker's CPUs. (Timing the batch on a pool of 2 threads here gave 1.09-1.26 cores of wall rate, where
           the training pipeline's later epochs kept 1.53 busy and ran 1.3-2.1x the one-core rate: this shared
           machine's wall rates on 2 threads read low, so the cap is TensorFlow's rule, not a wall-clock probe.)

Moved here from `harness.bench` (with `count_examples` and `time_passes`) so that the train layer, which may not
import bench, probes with the same code.
"""
from __future__ import annotations

import math
import os
import shutil
import statistics
import time
import types
from typing import Optional

from harness.data import tune as tune_lib

PROBE_RECORDS = 256
REPEATS = 3
COUNT_BATCH = 64       # examples per counted element of a per-record probe
NEGLIGIBLE = 1e-3      # a derived stage costs at least this fraction of the probe it was derived from
# Each probe runs over the held records as many times as it takes to pass MIN_EXAMPLES examples or MIN_BYTES
# serialized bytes, whichever comes first: a pass of 256 small records (the ACES points: 220 B each) lasts about
# as long as starting an iterator, which made every per-example rate of small records a per-pass figure (the
# batch stage at 15k examples/s per core, where the pipeline after the cache ran at 620k).
MIN_PASS_S = 0.2        # CPU seconds one timed pass of a dataset probe lasts at least (rate_per_core)
MAX_PASSES = 256
MIN_EXAMPLES = 16384
MIN_BYTES = 32_000_000
# tf.data copies a batch of at least this many bytes on every thread of its pool (`CopyBatch`,
# tensorflow/core/data/dataset_utils.cc, under `parallel_batch`, on by default:
# tf.data.experimental.OptimizationOptions).
PARALLEL_COPY_BYTES = 1 << 20
# The batch probe's epochs hold the export's records per epoch, at most this many (the held records repeated).
EPOCH_RECORDS = 8192


def passes_for(records: int, serialized_bytes: float) -> int:
    """Passes over `records` held records of `serialized_bytes` each that one probe runs (at least 1)."""
    return max(1, min(math.ceil(MIN_EXAMPLES / records), math.ceil(MIN_BYTES / (records * serialized_bytes))))


def _batch_examples(element):
    """Examples in one dataset element: the leading dimension of its first component (int64 tensor)."""
    import tensorflow as tf

    first = tf.nest.flatten(element)[0]
    return tf.shape(first, out_type=tf.int64)[0]


def count_examples(ds) -> int:
    """Examples in one full pass over `ds` (a dataset of batches), counted inside TensorFlow (`Dataset.reduce`,
    no per-batch Python)."""
    import tensorflow as tf

    return int(ds.reduce(tf.constant(0, tf.int64), lambda acc, e: acc + _batch_examples(e)))


def time_passes(ds, repeats: int) -> tuple[int, list[float], list[float]]:
    """(examples per pass, wall seconds of each timed pass, process CPU seconds of each) after one warm-up
    pass."""
    n = count_examples(ds)
    secs, cpu = [], []
    for _ in range(repeats):
        c, t = time.process_time(), time.perf_counter()
        count_examples(ds)
        secs.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return n, secs, cpu



def one_core(ds):
    """`ds` on one thread: a private thread pool of 1, no intra-op parallelism, no autotuning."""
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False
    return ds.with_options(options)


def _unbatch_rate(serialized: list, spec, read_batch: int, k: int, repeats: int) -> float:
    """The unbatch's examples/s per core: decoded read batches held in memory split into records, less the same
    records held one by one (both regrouped by COUNT_BATCH to count them); its caches freed on return."""
    import tensorflow as tf

    from harness.data import pipeline

    source = tf.data.Dataset.from_tensor_slices(serialized)
    records = source.map(lambda r: pipeline.decode_one(spec, r)).cache().repeat(k)
    batches = source.batch(read_batch).map(lambda r: pipeline.decode(spec, r)).cache().repeat(k)
    return difference(rate_per_core(batches.unbatch().batch(COUNT_BATCH), repeats),
                      rate_per_core(records.batch(COUNT_BATCH), repeats))


def rate_per_core(ds, repeats: int = REPEATS) -> float:
    """Examples per process CPU second of `ds` on one core: after a warm-up pass and one pass timed to size the
    probe, the median of `repeats` timed passes over `ds.repeat(k)`, k the passes that last MIN_PASS_S of CPU
    (at most MAX_PASSES): a pass that lasts about as long as starting an iterator measures the start, not the
    stage (a cache read of 64 patches: 2k examples/s in one pass, where the pipeline ran at 8k)."""
    ds = one_core(ds)
    n = count_examples(ds)
    c = time.process_time()
    count_examples(ds)
    once = time.process_time() - c
    k = max(1, min(MAX_PASSES, math.ceil(MIN_PASS_S / max(once, 1e-6))))
    m, _, cpu = time_passes(ds.repeat(k), repeats)   # m == n * k
    return m / max(statistics.median(cpu), 1e-9)


def difference(with_stage: float, without: float) -> float:
    """The rate of a stage from a probe with it (`with_stage` examples/s per core) and one without: the costs
    subtract (1/r = 1/with - 1/without), at least NEGLIGIBLE of the probe's."""
    cost = max(1.0 / with_stage - 1.0 / without, NEGLIGIBLE / with_stage)
    return 1.0 / cost


def _read_rate(paths, records_per_byte: float, budget: int, repeats: int) -> float:
    """Examples per CPU second of reading the files' bytes (at most `budget` bytes), 1 MB at a time."""
    import tensorflow as tf

    def once():
        left = budget
        while left > 0:   # the files over again until the budget is read
            before = left
            for path in paths:
                with tf.io.gfile.GFile(path, "rb") as f:
                    while left > 0:
                        chunk = f.read(min(left, 1 << 20))
                        if not chunk:
                            break
                        left -= len(chunk)
            if left == before:
                break
        return budget - left

    once()
    cpu = []
    for _ in range(repeats):
        c = time.process_time()
        nbytes = once()
        cpu.append(time.process_time() - c)
    return nbytes * records_per_byte / max(statistics.median(cpu), 1e-9)


def probe(train, spec, *, batch_size: int, augment: bool, brightness: float, contrast: float, cpus: int = 1,
          records: int = PROBE_RECORDS, repeats: int = REPEATS) -> dict:
    """Each stage's `StageRate` on the first `records` records of `train` (a `ShardSet`): `{"read", "inflate",
    "parse", "decode", "unbatch", "augment", "batch"}`, and `"start_s"` (`start_seconds`, on all of `train`), as
    `harness.data.tune.Measured.from_probe` takes them (the module docstring); `cpus`: the worker's (tf.data's
    pool: the cores a parallel batch copy may use).

    Raises:
      ConfigError: if the shards hold no records.
    """
    import tensorflow as tf

    from harness.data import pipeline, stages
    from harness.data.shards import read_buffer_bytes
    from harness.data.spec import IMAGE
    from harness.errors import ConfigError

    S = tune_lib.StageRate
    held = [(s, st) for s, st in zip(train.shards, train.stats) if st.records > 0]
    if not held:
        raise ConfigError("tune: every shard holds zero records")
    files, taken = [], 0
    for shard, st in held:
        files.append((shard, st))
        taken += st.records
        if taken >= records:
            break
    paths = [s.path for s, _ in files]
    compression = files[0][0].compression
    sizes = [tf.io.gfile.stat(p).length for p in paths]
    file_bytes = sum(sizes) / taken                    # stored bytes per record
    serialized_bytes = sum(st.bytes for _, st in files) / taken
    n = min(records, taken)
    raw = tf.data.TFRecordDataset(paths, compression_type=compression, buffer_size=read_buffer_bytes(paths))
    serialized = list(raw.take(n).as_numpy_iterator())
    k = passes_for(n, serialized_bytes)
    read = _read_rate(paths, 1.0 / file_bytes, int(k * n * file_bytes), repeats)
    reader = rate_per_core(raw.take(n).repeat(k).batch(COUNT_BATCH), repeats)
    if compression:
        read_stage = S(tune_lib.READ, read, file_bytes)
        inflate = S(tune_lib.INFLATE, difference(reader, read), serialized_bytes)
    else:
        read_stage, inflate = S(tune_lib.READ, reader, file_bytes), None
    desc = pipeline.feature_description(spec)
    values = spec.values_per_feature() if spec.kind == IMAGE else 1
    parsed_bytes = 4 * values * len(spec.features)
    decoded_bytes = pipeline.decoded_record_bytes(spec)
    source = tf.data.Dataset.from_tensor_slices(serialized).repeat(k)
    read_batch = stages.read_batch_size(serialized_bytes)
    src_records = rate_per_core(source.batch(COUNT_BATCH), repeats)
    src_batches = rate_per_core(source.batch(read_batch), repeats)
    p_rec = rate_per_core(source.map(lambda r: tf.io.parse_example(r[None], desc)).batch(COUNT_BATCH), repeats)
    pd_rec = rate_per_core(source.map(lambda r: pipeline.decode_one(spec, r)).batch(COUNT_BATCH), repeats)
    p_bat = rate_per_core(source.batch(read_batch).map(lambda r: tf.io.parse_example(r, desc)), repeats)
    pd_bat = rate_per_core(source.batch(read_batch).map(lambda r: pipeline.decode(spec, r)), repeats)
    parse = {tune_lib.RECORDS: S(tune_lib.PARSE, difference(p_rec, src_records), parsed_bytes),
             tune_lib.BATCHES: S(tune_lib.PARSE, difference(p_bat, src_batches), parsed_bytes)}
    decode = {tune_lib.RECORDS: S(tune_lib.DECODE, difference(pd_rec, p_rec), decoded_bytes),
              tune_lib.BATCHES: S(tune_lib.DECODE, difference(pd_bat, p_bat), decoded_bytes)}
    # After a cache, later epochs shuffle and batch the decoded records: the batch stage is timed on them held
    # in memory (`cache` filled by the untimed first pass), and augment on batches held in memory.
    decoded_records = tf.data.Dataset.from_tensor_slices(serialized).map(
        lambda r: pipeline.decode_one(spec, r)).cache()
    unbatch = S(tune_lib.UNBATCH, _unbatch_rate(serialized, spec, read_batch, k, repeats), decoded_bytes, 1)
    # as the training pipeline runs its epochs (`pipeline._epochs`): one shuffle per epoch over the cached records,
    # under a flat_map (~40% more per record than one shuffle over the epochs repeated, on the ACES points), each
    # epoch as long as the export's (the held records repeated), up to EPOCH_RECORDS
    per_epoch = max(1, math.ceil(min(train.records, EPOCH_RECORDS) / n))
    shuffled = tf.data.Dataset.range(max(1, math.ceil(k / per_epoch))).flat_map(
        lambda e: decoded_records.repeat(per_epoch).shuffle(n * per_epoch, seed=e, reshuffle_each_iteration=False)
        .batch(batch_size))
    copies = max(1, cpus) if batch_size * decoded_bytes >= PARALLEL_COPY_BYTES else 1
    batch = S(tune_lib.BATCH, rate_per_core(shuffled, repeats), decoded_bytes, copies)
    augment_stage = None
    augments = augment and spec.kind == IMAGE
    if augments or brightness or contrast:
        plan = types.SimpleNamespace(augment=augments, brightness=brightness, contrast=contrast, seed=0,
                                     map_parallelism=1, deterministic=True)
        held = decoded_records.batch(batch_size).cache().repeat(k)
        augmented = rate_per_core(pipeline._augment(held, spec, plan), repeats)
        augment_stage = S(tune_lib.AUGMENT, difference(augmented, rate_per_core(held, repeats)), decoded_bytes)
    start = start_seconds(train, spec, batch_size=batch_size, augment=augments, brightness=brightness,
                          contrast=contrast, cpus=cpus, repeats=repeats)
    return {"read": read_stage, "inflate": inflate, "parse": parse, "decode": decode, "unbatch": unbatch,
            "augment": augment_stage, "batch": batch, "start_s": start, "probed_records": n,
            "probed_files": len(paths)}


def start_seconds(train, spec, *, batch_size: int, augment: bool, brightness: float, contrast: float, cpus: int,
                  repeats: int = REPEATS) -> float:
    """Seconds a fresh training iterator takes beyond its work: the median, over `repeats` fresh iterators of the
    training pipeline (`pipeline.build_dataset`: training mode, no cache, a shuffle buffer of one batch, min(files,
    `cpus`) files read at once, `cpus` calls in flight per map, prefetch 2), of the wall time of its first k
    batches less that of the next k. Each window holds at least one read batch and one batch more (k = ceil((read
    batch + batch) / batch), at most half an epoch), so both windows do the same work with the same read-ahead
    (the shuffle buffer's fill, a read batch parsed whole, the maps in flight and the prefetch fill the first
    window and stay that full through the second): what is left is the start alone. At least 0; 0 when an epoch
    holds fewer than two batches. The iterator is created (and the dataset's graph rewritten) before the clock
    starts, as `benchmarks/tune.py` and the training loop do.

    Measured here (2 vCPUs, a test suite running beside): 44-52 ms on the ACES points (batch 256, k 6), 181-251 ms
    on GZIP 256x256x8 patches (batch 8), 91-128 ms on a GZIP U-Net export with augmentation (batch 8); first batch
    less second, which also counts the read-ahead, gave 45-91, 121-172 and 86-147 ms on a quiet machine.
    """
    from harness.data import pipeline, stages

    batches = train.records // batch_size
    read_batch = stages.read_batch_size(train.nbytes() / max(1, train.records))
    k = min(math.ceil((read_batch + batch_size) / batch_size), batches // 2)
    if k < 1:
        return 0.0
    options = pipeline.PipelineOptions(
        per_replica_batch_size=batch_size, training=True, records_per_epoch=batches * batch_size,
        shuffle_buffer=batch_size, cache="none", augment=augment, brightness=brightness, contrast=contrast, seed=0,
        validate=False, parallel_reads=max(1, min(len(train.files_with_records), cpus)),
        map_parallelism=max(1, cpus), prefetch=2)
    ds = pipeline.build_dataset(train, spec, options)
    starts = []
    for _ in range(repeats):
        it = iter(ds)
        t0 = time.perf_counter()
        for _ in range(k):
            next(it)
        t1 = time.perf_counter()
        for _ in range(k):
            next(it)
        starts.append(max(0.0, (t1 - t0) - (time.perf_counter() - t1)))
        del it
    return statistics.median(starts)


def free_disk(path: Optional[str]) -> Optional[int]:
    """Free bytes of the file system of `path` (its nearest existing folder); None without a path."""
    if not path:
        return None
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free
