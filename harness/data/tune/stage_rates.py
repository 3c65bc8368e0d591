"""The input pipeline's stages probed one at a time on one core (`harness tune` and `harness train --tune`): each
stage's examples/s per core and its output bytes per example, as `harness.data.tune.model.Measured` takes them.

Probes (each on the first `records` records of the shards given, a few hundred, read once into memory where the
stage reads from memory and repeated endlessly before the stage; timed by `rate_per_core` on one iterator: one
pass untimed, then `repeats` windows of at least MIN_PASS_S, the median's process CPU seconds, so no window pays
an iterator's start, which `start_seconds` measures apart): every probe runs on one core (a private thread pool
of one thread, no intra-op parallelism, no autotuning), so its rate is examples/s per core, as Plumber measures
each op's rate per core (Kuchnik et al., MLSys 2022). A stage that only runs after another is timed with it and
without it; its cost is the difference.

  read     the files' bytes (`tf.io.gfile`), examples/s at the files' bytes per record
  inflate  `TFRecordDataset(compression_type="GZIP")` less the read (GZIP exports only): the files holding the
           held records read whole, over and over, in the pipeline's read batches (a file opened once per epoch)
  parse    `tf.io.parse_example` per record, and per read batch (`stages.read_batch_size`), less the in-memory source
  decode   the pipeline's `decode` (bands stacked, cropped, resized; label checked) less the parse
  unbatch  decoded read batches held in memory split into records, less the same records held one by one
  augment  the pipeline's flips, rotations and color jitter on batches held in memory (when the run augments);
           `max_cores`: its wall rate with as many calls in flight as the worker's CPUs on as many threads, a
           prefetch of 2 after, over its one-core rate (`parallel_cores`): flips and rotations of 8x160x160x6
           batches move memory more than they compute, and two cores gave 1.5-2.0x one (three runs here)
  start    a fresh training iterator's first batches less as many more (`start_seconds`): what only a new
           iterator pays, its threads and functions starting (wall seconds, not per core)
  batch    decoded records held in memory, shuffled and batched, one shuffle per epoch as the training pipeline
           runs its epochs (what later epochs run after a cache); one thread (`max_cores` 1), but where a batch
           holds at least PARALLEL_COPY_BYTES, which tf.data copies on every thread of its pool: `max_cores` what
           those threads give, the wall rate on the worker's CPUs, a prefetch of 2 after, over the one-core rate
           (`parallel_cores`). Copies are memory-bound: batches of 8 GZIP patches of 256x256x8 (19 MB) ran 1.1-1.5x
           the one-core rate on 2 threads, and the training pipeline's later epochs ran as fast; the cap of 2
           cores (TensorFlow's rule alone) over-predicted them by 45-54%.

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

from harness.data.tune import model as tune_lib

PROBE_RECORDS = 256
REPEATS = 3
COUNT_BATCH = 64       # examples per counted element of a per-record probe
NEGLIGIBLE = 1e-3      # a derived stage costs at least this fraction of the probe it was derived from
# A timed window of a dataset probe lasts MIN_PASS_S seconds of its clock (CPU for `rate_per_core`, wall for
# `wall_rate`) as sized by one pass, at most MAX_PASSES passes over the held records: a pass of 256 small records
# (the ACES points: 220 B each) lasts about as long as starting an iterator or calling a function.
MIN_PASS_S = 0.2
MAX_PASSES = 256
# The file read (`_read_rate`, Python) reads the held records' files over until MIN_EXAMPLES records or MIN_BYTES
# bytes, whichever comes first (`passes_for`).
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



def on_threads(ds, threads: int):
    """`ds` on a private thread pool of `threads` threads, no intra-op parallelism, no autotuning."""
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False
    return ds.with_options(options)


def one_core(ds):
    """`ds` on one thread (`on_threads(ds, 1)`)."""
    return on_threads(ds, 1)


def _unbatch_rate(serialized: list, spec, read_batch: int, repeats: int) -> float:
    """The unbatch's examples/s per core: decoded read batches held in memory split into records, less the same
    records held one by one (both regrouped by COUNT_BATCH to count them); its caches freed on return."""
    import tensorflow as tf

    from harness.data.input import decode as decode_lib
    from harness.tracing import graph_fn

    source = tf.data.Dataset.from_tensor_slices(serialized)
    records = source.map(graph_fn(lambda r: decode_lib.decode_one(spec, r))).cache().repeat()
    batches = source.batch(read_batch).map(graph_fn(lambda r: decode_lib.decode(spec, r))).cache().repeat()
    per_pass = _elements(len(serialized), COUNT_BATCH)
    return difference(rate_per_core(batches.unbatch().batch(COUNT_BATCH), per_pass, repeats),
                      rate_per_core(records.batch(COUNT_BATCH), per_pass, repeats))


def _elements(records: int, batch: int) -> int:
    """Elements of `batch` that hold one pass of `records` held records (a probe's warm-up)."""
    return max(1, math.ceil(records / batch))


def drain_fn():
    """A tf.function `(iterator, elements) -> examples`: takes `elements` (an int64 scalar tensor: one trace per
    element spec) elements of `iterator` inside TensorFlow (no per-element Python) and counts their examples, the
    leading dimension of each element's first component (int64); the probes' windows and `benchmarks/tune.py`'s
    epochs drain with it."""
    import tensorflow as tf

    from harness.tracing import graph_function

    @graph_function
    def drain(iterator, elements):
        return tf.while_loop(lambda i, n: i < elements,
                             lambda i, n: (i + 1, n + _batch_examples(next(iterator))),
                             (tf.constant(0, tf.int64), tf.constant(0, tf.int64)))[1]
    return drain


def rate_per_core(ds, warmup: int, repeats: int = REPEATS) -> float:
    """Examples per process CPU second of `ds` on one core, its iterator's start left out.

    `ds` is endless: its held records repeated inside, before the stages probed (`source.repeat()`), so one
    iterator runs every timed window. The first `warmup` elements (one pass of the held records: caches filled,
    functions run, the iterator and its threads started) are untimed; one more pass sizes the windows to last
    MIN_PASS_S of CPU (at most MAX_PASSES passes); the rate is the median of `repeats` windows. A fresh iterator
    per window (as `count_examples` makes) paid each stage's start in every window: 50-65 ms for the flips,
    rotations and jitter of a U-Net batch, a quarter of a 96-record pass, which read the augment stage at 390-420
    examples/s per core where 20 passes of one iterator read 500-550 (a run pays the start once: `start_seconds`).

    Raises:
      tf.errors.OutOfRangeError: if `ds` ends (it must be endless).
    """
    return _windows(one_core(ds), warmup, repeats, time.process_time)


def wall_rate(ds, warmup: int, threads: int, repeats: int = REPEATS) -> float:
    """Examples per wall second of endless `ds` on a private pool of `threads` threads (`rate_per_core`'s
    windows, timed by the wall clock): what a stage that runs on several threads gives on them.

    Raises:
      tf.errors.OutOfRangeError: if `ds` ends (it must be endless).
    """
    return _windows(on_threads(ds, threads), warmup, repeats, time.perf_counter)


def _windows(ds, warmup: int, repeats: int, clock) -> float:
    """Examples per `clock` second of endless `ds` (`rate_per_core`): `warmup` elements untimed, one more pass
    sizes the windows to MIN_PASS_S, the median of `repeats` windows, all on one iterator. The element counts
    are int64 tensors, so the drain is traced once, in the warm-up (a Python int traced it again for the windows'
    count, inside the first timed window)."""
    import tensorflow as tf

    drain = drain_fn()
    it = iter(ds)
    per_pass = tf.constant(max(1, warmup), tf.int64)
    drain(it, per_pass)
    c = clock()
    drain(it, per_pass)
    once = clock() - c
    elements = per_pass * max(1, min(MAX_PASSES, math.ceil(MIN_PASS_S / max(once, 1e-6))))
    spent, n = [], 0
    for _ in range(repeats):
        c = clock()
        n = int(drain(it, elements))
        spent.append(clock() - c)
    return n / max(statistics.median(spent), 1e-9)


def parallel_cores(wall: float, per_core: float, cpus: int) -> float:
    """Cores' worth of one-core rate a stage gives on `cpus` threads: `wall` (examples/s, `wall_rate`) over
    `per_core` (examples/s, the same pipeline's `rate_per_core`), within 1 and `cpus`."""
    return min(float(cpus), max(1.0, wall / per_core))


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
    `harness.data.tune.model.Measured.from_probe` takes them (the module docstring); `cpus`: the worker's (the threads
    and calls in flight on which a parallel batch copy and the augmentation are timed for their caps).

    Raises:
      ConfigError: if the shards hold no records.
    """
    import tensorflow as tf

    from harness.data.input import pipeline, decode as decode_lib, stages
    from harness.tracing import graph_fn
    from harness.data.export.shards import read_buffer_bytes
    from harness.data.spec.dataspec import IMAGE
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
    buffer = read_buffer_bytes(paths)
    raw = tf.data.TFRecordDataset(paths, compression_type=compression, buffer_size=buffer)
    serialized = list(raw.take(n).as_numpy_iterator())
    k = passes_for(n, serialized_bytes)
    read = _read_rate(paths, 1.0 / file_bytes, int(k * n * file_bytes), repeats)
    by_count = _elements(n, COUNT_BATCH)
    # The files read whole, over and over, in read batches of one file each, as the pipeline reads them
    # (`pipeline.read_files`): a file opened once per its records, as an epoch opens it. The first n records
    # repeated opened the file every n, and batches of COUNT_BATCH (to count them) cost more than the read: 0.16M
    # examples/s per core on the ACES points' one file of 8,316 records, against 0.9M in read batches of 1,191.
    read_batch = stages.read_batch_size(serialized_bytes)
    files_read = tf.data.Dataset.from_tensor_slices(paths).repeat().flat_map(graph_fn(
        lambda p: tf.data.TFRecordDataset(p, compression_type=compression, buffer_size=buffer).batch(read_batch)))
    reader = rate_per_core(files_read, _elements(n, read_batch), repeats)
    if compression:
        read_stage = S(tune_lib.READ, read, file_bytes)
        inflate = S(tune_lib.INFLATE, difference(reader, read), serialized_bytes)
    else:
        read_stage, inflate = S(tune_lib.READ, reader, file_bytes), None
    parsed_bytes = 4 * sum(spec.values_of(f) for f in spec.features)
    decoded_bytes = pipeline.decoded_record_bytes(spec)
    source = tf.data.Dataset.from_tensor_slices(serialized).repeat()
    by_read = _elements(n, read_batch)
    src_records = rate_per_core(source.batch(COUNT_BATCH), by_count, repeats)
    src_batches = rate_per_core(source.batch(read_batch), by_read, repeats)
    p_rec = rate_per_core(source.map(graph_fn(lambda r: decode_lib.parse(spec, r[None]))).batch(COUNT_BATCH),
                          by_count, repeats)
    pd_rec = rate_per_core(source.map(graph_fn(lambda r: decode_lib.decode_one(spec, r))).batch(COUNT_BATCH),
                           by_count, repeats)
    p_bat = rate_per_core(source.batch(read_batch).map(graph_fn(lambda r: decode_lib.parse(spec, r))), by_read,
                          repeats)
    pd_bat = rate_per_core(source.batch(read_batch).map(graph_fn(lambda r: decode_lib.decode(spec, r))), by_read,
                           repeats)
    parse = {tune_lib.RECORDS: S(tune_lib.PARSE, difference(p_rec, src_records), parsed_bytes),
             tune_lib.BATCHES: S(tune_lib.PARSE, difference(p_bat, src_batches), parsed_bytes)}
    decode = {tune_lib.RECORDS: S(tune_lib.DECODE, difference(pd_rec, p_rec), decoded_bytes),
              tune_lib.BATCHES: S(tune_lib.DECODE, difference(pd_bat, p_bat), decoded_bytes)}
    # After a cache, later epochs shuffle and batch the decoded records: the batch stage is timed on them held
    # in memory (`cache` filled by the untimed first pass), and augment on batches held in memory.
    decoded_records = tf.data.Dataset.from_tensor_slices(serialized).map(
        graph_fn(lambda r: decode_lib.decode_one(spec, r))).cache()
    unbatch = S(tune_lib.UNBATCH, _unbatch_rate(serialized, spec, read_batch, repeats), decoded_bytes, 1)
    # as the training pipeline runs its epochs (`pipeline._epochs`): one shuffle per epoch over the cached records,
    # under a flat_map (~40% more per record than one shuffle over the epochs repeated, on the ACES points), each
    # epoch as long as the export's (the held records repeated), up to EPOCH_RECORDS
    per_epoch = max(1, math.ceil(min(train.records, EPOCH_RECORDS) / n))
    shuffled = tf.data.Dataset.counter().flat_map(graph_fn(
        lambda e: pipeline.shuffle(decoded_records.repeat(per_epoch), n * per_epoch, e, reshuffle_each_iteration=False)
        .batch(batch_size)))
    by_epoch = _elements(n * per_epoch, batch_size)
    batched = rate_per_core(shuffled, by_epoch, repeats)
    copies = 1.0
    if cpus > 1 and batch_size * decoded_bytes >= PARALLEL_COPY_BYTES:   # copied on every thread: as they give
        copies = parallel_cores(wall_rate(shuffled.prefetch(2), by_epoch, cpus, repeats), batched, cpus)
    batch = S(tune_lib.BATCH, batched, decoded_bytes, copies)
    augment_stage = None
    augments = augment and spec.kind == IMAGE
    if augments or brightness or contrast:
        def augmented(threads):
            plan = types.SimpleNamespace(augment=augments, brightness=brightness, contrast=contrast, seed=0,
                                         map_parallelism=threads, deterministic=True)
            return pipeline._augment(held, spec, plan)

        held = decoded_records.batch(batch_size).cache().repeat()
        by_batch = _elements(n, batch_size)
        one = rate_per_core(augmented(1), by_batch, repeats)
        cores = (parallel_cores(wall_rate(augmented(cpus).prefetch(2), by_batch, cpus, repeats), one, cpus)
                 if cpus > 1 else None)
        augment_stage = S(tune_lib.AUGMENT, difference(one, rate_per_core(held, by_batch, repeats)), decoded_bytes,
                          cores)
    start = start_seconds(train, spec, batch_size=batch_size, augment=augments, brightness=brightness,
                          contrast=contrast, cpus=cpus, repeats=repeats)
    return {"read": read_stage, "inflate": inflate, "parse": parse, "decode": decode, "unbatch": unbatch,
            "augment": augment_stage, "batch": batch, "start_s": start, "probed_records": n,
            "probed_files": len(paths)}


def start_seconds(train, spec, *, batch_size: int, augment: bool, brightness: float, contrast: float, cpus: int,
                  repeats: int = REPEATS) -> float:
    """Seconds a fresh training iterator takes beyond its work: the median, over `repeats` fresh iterators of the
    training pipeline (`pipeline.build_dataset`: training mode, no cache, a shuffle buffer of one record, min(files,
    `cpus`) files read at once, `cpus` calls in flight per map, prefetch 2), of the wall time of its first k
    batches less that of the next k. Each window holds at least one read batch and one batch more (k = ceil((read
    batch + batch) / batch), at most half an epoch), so both windows do the same work with the same read-ahead
    (a read batch parsed whole, the maps in flight and the prefetch fill the first window and stay that full
    through the second): what is left is the start alone. The buffer holds one record: a buffer of one batch made
    the first window read a batch more than the second, counted as start (8 GZIP patches of 256x256x8, about half
    of their measured start), and the epoch's model (`model.epoch_rate`) fills the real buffer itself. At least 0;
    0 when an epoch holds fewer than two batches. The iterator is created (and the dataset's graph rewritten)
    before the clock starts, as `benchmarks/tune.py` and the training loop do.

    Measured here (2 vCPUs, a test suite running beside): 44-52 ms on the ACES points (batch 256, k 6), 181-251 ms
    on GZIP 256x256x8 patches (batch 8), 91-128 ms on a GZIP U-Net export with augmentation (batch 8); first batch
    less second, which also counts the read-ahead, gave 45-91, 121-172 and 86-147 ms on a quiet machine.
    """
    from harness.data.input import pipeline, stages

    batches = train.records // batch_size
    read_batch = stages.read_batch_size(train.nbytes() / max(1, train.records))
    k = min(math.ceil((read_batch + batch_size) / batch_size), batches // 2)
    if k < 1:
        return 0.0
    options = stages.PipelineOptions(
        per_replica_batch_size=batch_size, training=True, records_per_epoch=batches * batch_size,
        shuffle_buffer=1, cache="none", augment=augment, brightness=brightness, contrast=contrast, seed=0,
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
