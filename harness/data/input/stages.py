"""The input pipeline's stages, decided once and without TensorFlow: `PipelinePlan` (`decide`).

`harness.data.input.pipeline.build_dataset` measures (records, serialized and decoded bytes per record), calls `decide`
and applies the plan as named stages, in this order (tf.data performance guide,
https://www.tensorflow.org/guide/data_performance; the Model Garden's official/core/input_reader.py, whose
`_shard_files_then_read` reads the same way):

  read (files, order, parallel reads) -> [record sharding] -> parse (read batches, or records before the cache)
  -> cache -> shuffle -> keep `records_per_epoch` -> repeat (training) -> batch [records parsed here when large
  and uncached] -> augment -> prefetch.

Every choice of the pipeline is a field here, taken once from the options, the epoch's assignment and the
measured sizes; the job's log line, the profile's facts and the report print `PipelinePlan.describe()`, and the
cache they name is the one the pipeline applied (`harness.train.inputs.Inputs.worker_facts`).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
from typing import Callable, Optional, Sequence

from harness.choices import CACHE_MODES, PARSE_PLACEMENTS
from harness.data.export import gcs as gcs_lib
from harness.distribute import resources as resources_lib
from harness.errors import BatchSizeError, ConfigError

log = logging.getLogger(__name__)

# Mean serialized record size above which records are parsed one by one (then batched); below, batch then parse.
VECTORIZE_MAX_RECORD_BYTES = 64 * 1024
# The shuffle buffer holds serialized records; its default is sized to about this many bytes.
SHUFFLE_BUFFER_BYTES = 256 * 1024 * 1024
MAX_DEFAULT_SHUFFLE = 16384
# "auto" caches in memory when this pipeline's records take at most this fraction of the available memory.
MEMORY_CACHE_FRACTION = 0.5
# Files read at once (interleave cycle), per core.
READERS_PER_CORE = 1
# Cloud Storage files are read READERS_PER_CORE_REMOTE per core: a reader waits for each block of a gs:// file to
# arrive (TensorFlow's GCS file system fetches one read buffer at a time, blocking), so one reader a core
# leaves the core idle meanwhile. Measured (benchmarks/gcs_read.py, the client on one core, the bucket on another):
# 1 reader 59, 2 readers 100, 4 readers 100 examples/s of 256x256x8 float GZIP patches.
READERS_PER_CORE_REMOTE = 2
# Small records travel from the file readers in read batches of about this many serialized bytes, at most
# READ_BATCH_MAX records, and are parsed one read batch at a time (see read_batch_size).
READ_BATCH_BYTES = 256 * 1024
READ_BATCH_MAX = 4096
# A memory cache of parsed small records holds records (each epoch then reads them as a hand-written
# `map(parse) -> cache -> shuffle` does) up to this many per pipeline; above, read batches, unbatched after the cache
# each epoch, since each cached element costs ~100-200 bytes of tensor bookkeeping beside its values. The unbatch
# per epoch cost the ACES points' training pipeline ~17% of its in-graph rate (522k against 626k examples/s).
MEMORY_CACHE_MAX_RECORDS = 1_000_000

# Where records are parsed (`PipelinePlan.parse`).
PARSE_READ_BATCHES = "read batches"      # small records: one vectorized parse per read batch, right after the read
PARSE_BEFORE_CACHE = "records, before the cache"  # large records, cached: parsed once, into the cache
PARSE_KEPT = "records kept, before the batch"     # large records, uncached: only the records an epoch keeps
# What the records per epoch are kept as (`PipelinePlan.keep`).
KEEP_ALL, KEEP_BATCHES, KEEP_RECORDS = "all", "batches", "records"
# How the batches of `batch_size` are formed (`PipelinePlan.batch`).
BATCHED_BY_KEEP = "by the keep"  # the keep batched each epoch's shuffled stream already
REBATCH = "rebatch"              # parsed read batches regrouped across file boundaries (evaluation)
BATCH = "batch"                  # parsed records batched


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """How one input pipeline reads its shards (the `DataConfig` of tf-models' input_reader, frozen).

    Attributes:
      per_replica_batch_size: examples per batch delivered to one replica.
      training: True: shuffle, keep records_per_epoch, repeat forever (epoch by epoch, each epoch's order a function
        of the seed and the epoch's number), optional augmentation. False: one pass, no shuffle or augmentation.
      records_per_epoch: keep exactly the first this-many records of each epoch of this pipeline's shuffled
        stream and drop the rest (read, not parsed), so every worker runs the same number of steps.
      shuffle_buffer: records in the shuffle buffer; default min(records, ~256 MB of records, 16384).
      cache: "auto" (memory when the pipeline's records fit in half the available memory, else files under
        cache_dir, else none), "memory", "file" (needs cache_dir) or "none". The cache is filled before any
        randomness, with parsed tensors (sized as decoded float32: `decoded_record_bytes`): read batches for
        small records, single records for large ones.
      cache_dir: folder of the file cache. Its name (cache_name) changes with the files, spec and pipeline version;
        one process at a time fills it, and what a killed run left is cleared (harness.data.input.filecache).
      augment: random flips and 90-degree rotations of image and mask together (training images only).
      brightness, contrast: maximum relative change of `color_jitter` (training only; 0: none).
      seed: seeds file order, shuffle and augmentation; None for a random seed.
      validate: check the spec against the first record of every shard first (validate.validate_spec; one record
        read per shard, once per process). False when the caller validated already (the training job).
      first_epoch: training: the 0-based number of the first epoch delivered (a resumed run's), which seeds its
        order; skip_batches: batches of that first epoch already trained on, skipped (a resume in the middle of an
        epoch: the epoch goes on with the batches not yet trained on).
      parse: "auto" (by the record size: VECTORIZE_MAX_RECORD_BYTES), "records" (one by one) or "batches" (read
        batches, one vectorized parse each); parallel_reads: files read at once (default READERS_PER_CORE per
        CPU, READERS_PER_CORE_REMOTE for gs:// files, at most the files); map_parallelism: calls in flight of every parallel map (default AUTOTUNE);
        prefetch: batches prefetched (default AUTOTUNE). `harness tune` decides them (`harness.data.tune.levers`).
    """

    per_replica_batch_size: int
    training: bool
    records_per_epoch: Optional[int] = None
    shuffle_buffer: Optional[int] = None
    cache: str = "auto"
    cache_dir: Optional[str] = None
    augment: bool = False
    seed: Optional[int] = None
    validate: bool = True
    brightness: float = 0.0
    contrast: float = 0.0
    first_epoch: int = 0
    skip_batches: int = 0
    parse: str = "auto"
    parallel_reads: Optional[int] = None
    map_parallelism: Optional[int] = None
    prefetch: Optional[int] = None


# --- cache -------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CacheChoice:
    """Where the parsed records are cached: kind "memory" | "file" | "none", the file (for "file") and why."""

    kind: str
    path: Optional[str]
    reason: str


def _available_memory() -> int:
    """This worker's share of the memory available to its process (cgroup limit, host), measured now."""
    return resources_lib.for_this_process().memory_bytes


def _gb(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def choose_cache(mode: str, nbytes: int, *, cache_dir: Optional[str], name: str,
                 available: Optional[int] = None) -> CacheChoice:
    """Decide the cache for `nbytes` of cached elements (the pipeline passes the decoded size: parsed tensors).

    Args:
      available: bytes of memory available to this worker (default: measured now, `resources.for_this_process`:
        the cgroup limit and the host's available memory, divided among the workers on the host).
    Raises:
      ConfigError: for an unknown mode, or mode "file" without cache_dir.
    """
    path = os.path.join(cache_dir, name) if cache_dir else None
    if mode == "none":
        return CacheChoice("none", None, "cache='none'")
    if mode == "memory":
        return CacheChoice("memory", None, "cache='memory'")
    if mode == "file":
        if not cache_dir:
            raise ConfigError("cache='file' needs cache_dir")
        return CacheChoice("file", path, "cache='file'")
    if mode != "auto":
        raise ConfigError(f"cache must be one of {', '.join(CACHE_MODES)}, got {mode!r}")
    available = _available_memory() if available is None else available
    budget = int(available * MEMORY_CACHE_FRACTION)
    if nbytes <= budget:
        return CacheChoice("memory", None, f"{_gb(nbytes)} of records fit in {MEMORY_CACHE_FRACTION:.0%} of the "
                                           f"{_gb(available)} available memory")
    if path:
        return CacheChoice("file", path, f"{_gb(nbytes)} of records exceed {_gb(budget)} of memory: cached in files")
    return CacheChoice("none", None, f"{_gb(nbytes)} of records exceed {_gb(budget)} of memory and no --cache-dir "
                                     "was given: not cached")


# --- parse order -------------------------------------------------------------------------------------------------
def parse_per_record(mean_record_bytes: float) -> bool:
    """True when records are large enough to parse one by one (in parallel) rather than in batches."""
    return mean_record_bytes > VECTORIZE_MAX_RECORD_BYTES


def default_shuffle_buffer(records: int, mean_record_bytes: float, given: Optional[int] = None) -> int:
    """Records in a training shuffle buffer: `given` (the user's shuffle_buffer) when set, else
    min(records, SHUFFLE_BUFFER_BYTES of records at `mean_record_bytes` each, MAX_DEFAULT_SHUFFLE), at least 1."""
    return given or max(1, min(records, int(SHUFFLE_BUFFER_BYTES // max(mean_record_bytes, 1)), MAX_DEFAULT_SHUFFLE))


def read_batch_size(mean_record_bytes: float) -> int:
    """Records per read batch for small records: about READ_BATCH_BYTES of serialized records, 1 to
    READ_BATCH_MAX. Every element of a tf.data stage and every `parse_example` call has a fixed cost of tens of
    microseconds; on the point export (220 bytes per record) parsing read batches of ~1000 records, then
    regrouping the parsed tensors, ran at 0.99-1.08x the raw read against 0.77-0.92x for batches of 256
    (benchmarks/input_pipeline.py, 2 cores)."""
    return int(max(1, min(READ_BATCH_MAX, READ_BATCH_BYTES // max(mean_record_bytes, 1))))


def decide_parallel_reads(files: Sequence[str], cpu_count: Optional[int] = None) -> int:
    """Of the paths `files`, how many are read at once (the interleave cycle): READERS_PER_CORE per core,
    READERS_PER_CORE_REMOTE where any is a `gs://` object (each reader waits on the network between blocks), at
    most the files, at least 1.

    Args:
      cpu_count: this worker's CPUs (default: `resources.for_this_process().cpus`: affinity mask and cgroup
        quota, divided among the workers on the host).
    """
    cpus = resources_lib.for_this_process().cpus if cpu_count is None else cpu_count
    per_core = READERS_PER_CORE_REMOTE if any(map(gcs_lib.is_gcs, files)) else READERS_PER_CORE
    return max(1, min(len(files), int(per_core * cpus)))


def check_keep(keep: int, available: int, batch: int) -> None:
    """Keeping `keep` of `available` records per pass in batches of `batch`: refuse what yields no step, log
    what is dropped.

    Raises:
      BatchSizeError: if keep > available or keep < batch.
    """
    if keep > available:
        raise BatchSizeError(f"records_per_epoch {keep} exceeds the {available} records of this input pipeline")
    if keep < batch:
        raise BatchSizeError(f"records_per_epoch {keep} < per-replica batch {batch}: an epoch would have no step")
    if keep < available:
        log.info("records_per_epoch %d: %d of this input pipeline's %d records are read and dropped each epoch",
                 keep, available - keep, available)


# --- the plan ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """Every stage of one input pipeline, decided once (`decide`); `pipeline.apply_plan` builds it.

    Attributes (by stage):
      identity: `training`; `input_pipeline_id` of `num_input_pipelines`; `records` read per pass (this
        pipeline's share); `mean_record_bytes` (serialized, uncompressed) and `decoded_record_bytes` (as
        delivered: float32 bands and label) per record; `seed`.
      read: `files` and their `compressions` ("GZIP" or ""), `shuffle_files` (file order reshuffled each epoch),
        `parallel_reads` (files read at once: the interleave cycle; 1 reads them one after the other),
        `deterministic` (one order, always: a record-sharded pipeline's workers must see one order, and an epoch's
        order must be the same when a resumed run reads it again, so that it skips the batches trained on),
        `record_sharding` (every pipeline reads every file and keeps every n-th record).
      parse: `read_batch` (records per read batch, parsed by one vectorized parse; None: records parsed one by
        one) and `parse`, where: PARSE_READ_BATCHES, PARSE_BEFORE_CACHE or PARSE_KEPT.
      cache: `cache` (`CacheChoice`: kind, file, why; decided on `records * decoded_record_bytes`, what the cache
        holds), `cache_holds_records` (True: single records are cached; False: parsed read batches) and
        `unbatch_after_cache` (read batches split into records after the cache, each epoch).
      shuffle: `shuffle_buffer` records (None: no shuffle, evaluation); records, not files, are shuffled in it.
      keep: `keep` (KEEP_ALL, KEEP_BATCHES: each epoch's stream batched, then its first batches kept, or
        KEEP_RECORDS) of `records_per_epoch`; `keep_filter` (an enumerate + filter drops the rest; False when the
        keep is every whole batch, which `drop_remainder` alone does); `repeat` (training: forever, one epoch
        after the other from `first_epoch`, each shuffled with a seed of `seed` and the epoch's number, and the
        first `skip_batches` batches of the first epoch skipped).
      batch: `batch_size` (per-replica batch), `batch` (BATCHED_BY_KEEP, REBATCH or BATCH), `drop_remainder`
        (True but for a whole evaluation pass, whose last batch is partial so that every record is scored once);
        `dropped` records per pass left out by it (an evaluation of the first `records_per_epoch` records).
      augment: `augment` (flips and rotations, training images), `brightness`, `contrast` (color jitter).
      prefetch: AUTOTUNE, or `prefetch_depth` batches; `map_parallelism`: calls in flight of every parallel map
        (None: AUTOTUNE); `thread_limit`: a private pool of this many threads for the maps and parallel
        batches, set under a pod's CPU limit (`resources.quota_threads`), None: tf.data's shared pool;
        `cpu_budget`: the CPUs tf.data's autotuning plans for (the parallel maps and
        the prefetch; `tf.data.Options().autotune.cpu_budget`, whose default is every schedulable core of the
        host): this worker's CPUs (`harness.distribute.resources`). None: TensorFlow's default.
    """

    training: bool
    input_pipeline_id: int
    num_input_pipelines: int
    records: int
    mean_record_bytes: float
    decoded_record_bytes: int
    seed: int
    files: tuple[str, ...]
    compressions: tuple[str, ...]
    shuffle_files: bool
    parallel_reads: int
    deterministic: bool
    record_sharding: bool
    read_batch: Optional[int]
    parse: str
    cache: CacheChoice
    cache_dir: Optional[str]
    cache_holds_records: bool
    unbatch_after_cache: bool
    shuffle_buffer: Optional[int]
    keep: str
    records_per_epoch: Optional[int]
    keep_filter: bool
    repeat: bool
    batch_size: int
    batch: str
    dropped: int
    augment: bool
    brightness: float
    contrast: float
    drop_remainder: bool = True
    prefetch: str = "autotune"
    first_epoch: int = 0
    skip_batches: int = 0
    cpu_budget: Optional[int] = None
    thread_limit: Optional[int] = None
    map_parallelism: Optional[int] = None
    prefetch_depth: Optional[int] = None

    @property
    def cached_bytes(self) -> int:
        """Bytes the cache holds (or would hold): records x decoded bytes per record."""
        return self.records * self.decoded_record_bytes

    def describe(self) -> str:
        """One line naming every stage: what the job logs and the profile report prints."""
        reads = (f"every file, record-sharded {self.input_pipeline_id}/{self.num_input_pipelines}"
                 if self.record_sharding else f"{self.parallel_reads} file(s) at once")
        # a cache holds the first pass's file order (pipeline._epochs): the files are reshuffled only without one
        order = ", file order reshuffled each epoch" if self.shuffle_files and self.cache.kind == "none" else ""
        parse = (f"read batches of {self.read_batch} records (vectorized)" if self.parse == PARSE_READ_BATCHES
                 else self.parse) + (f", {self.map_parallelism} calls in flight" if self.map_parallelism else "")
        holds = "records" if self.cache_holds_records else "read batches"
        cache = f"cache: {self.cache.kind} ({self.cache.reason})" + (
            f", holding parsed {holds}" + (", unbatched each epoch" if self.unbatch_after_cache else "")
            if self.cache.kind != "none" else "")
        if self.cache.path:
            cache += f" in {self.cache.path}"
        parts = [f"input pipeline {self.input_pipeline_id}/{self.num_input_pipelines}: {len(self.files)} files, "
                 f"{self.records} records ({self.mean_record_bytes:.0f} B serialized, {self.decoded_record_bytes} B "
                 "decoded each)",
                 f"read: {reads}{order}", f"parse: {parse}", cache,
                 f"shuffle: records, buffer {self.shuffle_buffer}" if self.shuffle_buffer else "shuffle: none"]
        if self.keep != KEEP_ALL:
            parts.append(f"keep: the first {self.records_per_epoch} records per epoch as {self.keep}"
                         + ("" if self.keep_filter else " (every whole batch: drop_remainder alone)"))
        if self.repeat:
            parts.append(f"repeat: epochs from {self.first_epoch + 1}, each in its own seeded order"
                         + (f" (the first {self.skip_batches} batches skipped: trained on before the resume)"
                            if self.skip_batches else ""))
        parts.append(f"batch: {self.batch_size} per replica ({self.batch}), "
                     + ("drop_remainder" if self.drop_remainder else "the last batch partial")
                     + (f" (drops {self.dropped} records per pass)" if self.dropped else ""))
        augment = [name for name, on in (("flips/rotations", self.augment),
                                         (f"brightness {self.brightness:g}", self.brightness),
                                         (f"contrast {self.contrast:g}", self.contrast)) if on]
        parts.append(f"augment: {', '.join(augment) if augment else 'none'}")
        budget = (f", tf.data autotuning within {self.cpu_budget} CPU{'s' if self.cpu_budget != 1 else ''}"
                  if self.cpu_budget else "")
        if self.thread_limit:
            budget += f" on a pool of {self.thread_limit} thread{'s' if self.thread_limit != 1 else ''} (CPU limit)"
        prefetch = f"{self.prefetch_depth} batches" if self.prefetch_depth else self.prefetch
        parts.append(f"prefetch: {prefetch}{budget}")
        return "; ".join(parts)


def decide(options: PipelineOptions, *, files: Sequence[str], compressions: Sequence[str], records: int,
           mean_record_bytes: float, decoded_record_bytes: int, image: bool, record_sharding: bool = False,
           input_pipeline_id: int = 0, num_input_pipelines: int = 1, cpu_count: Optional[int] = None,
           available_memory: Optional[int] = None, thread_limit: Optional[int] = None,
           cache_name: Callable[[Optional[int]], str] = lambda read_batch: "cache") -> PipelinePlan:
    """The stages of one input pipeline from its options, its files and the measured sizes (no TensorFlow).

    Args:
      files, compressions: the files this pipeline reads, in shard order, and their compression.
      records: records this pipeline reads per pass (its share, after record sharding).
      mean_record_bytes: mean serialized record size (uncompressed): sets the parse order and the shuffle buffer.
      decoded_record_bytes: bytes of one parsed record as delivered (`pipeline.decoded_record_bytes`): sizes the
        cache, which holds parsed tensors.
      image: the records are image patches (augmentation applies to images only).
      record_sharding: the assignment shards records, not files (`sharding.RECORD`).
      cpu_count: this worker's CPUs, for the parallel reads (default: `resources.for_this_process().cpus`).
      thread_limit: the plan's `thread_limit` (a pod's CPU limit; default None).
      available_memory: this worker's bytes of memory for cache="auto" (default: measured now,
        `resources.for_this_process().memory_bytes`).
      cache_name: `fn(read_batch) -> str`, the file cache's name (digest of the files and spec; called only when
        the file cache is chosen).
    Raises:
      BatchSizeError: per_replica_batch_size < 1, records_per_epoch above the records or below one batch, or an
        evaluation pass with no whole batch.
      ConfigError: a bad cache mode, or cache "file" without cache_dir.
    """
    o, batch_size = options, options.per_replica_batch_size
    if batch_size < 1:
        raise BatchSizeError(f"per_replica_batch_size must be >= 1, got {batch_size}")
    training, keep_n = o.training, o.records_per_epoch
    seed = random.randrange(2 ** 31) if o.seed is None else o.seed
    cpus = resources_lib.for_this_process().cpus if cpu_count is None else cpu_count
    if o.parse not in PARSE_PLACEMENTS:
        raise ConfigError(f"parse must be one of {', '.join(PARSE_PLACEMENTS)}, got {o.parse!r}")
    per_record = parse_per_record(mean_record_bytes) if o.parse == "auto" else o.parse == "records"
    read_batch = None if per_record else read_batch_size(mean_record_bytes)
    cache = choose_cache(o.cache, records * decoded_record_bytes, cache_dir=o.cache_dir, name="",
                         available=available_memory)
    if cache.kind == "file":
        cache = dataclasses.replace(cache, path=os.path.join(o.cache_dir, cache_name(read_batch)))
    cached = cache.kind != "none"
    parse = PARSE_READ_BATCHES if not per_record else PARSE_BEFORE_CACHE if cached else PARSE_KEPT
    parsed = parse != PARSE_KEPT  # records are parsed before the shuffle and the keep
    # Read batches become records for the shuffle and the keep; a memory cache of few enough records holds
    # records (no unbatch per epoch), else the read batches are split after the cache.
    by_record = read_batch is not None and (training or keep_n is not None)
    records_cached = by_record and cache.kind == "memory" and records <= MEMORY_CACHE_MAX_RECORDS
    keep, keep_filter, dropped = KEEP_ALL, False, 0
    if training:
        buffer = default_shuffle_buffer(records, mean_record_bytes, o.shuffle_buffer)
        if keep_n is not None:
            check_keep(keep_n, records, batch_size)
            keep = KEEP_BATCHES if parsed and keep_n % batch_size == 0 else KEEP_RECORDS
            keep_filter = keep == KEEP_RECORDS or keep_n // batch_size != records // batch_size
    else:
        buffer = None
        per_pass = records if keep_n is None else min(keep_n, records)
        if keep_n is not None and keep_n < records:
            check_keep(keep_n, records, batch_size)
            keep, keep_filter = KEEP_RECORDS, True
        if keep_n is not None:  # a pass of the first records, in whole batches (equal steps)
            if per_pass < batch_size:
                raise BatchSizeError(f"{per_pass} records < per-replica batch {batch_size}: no batch")
            dropped = per_pass % batch_size
        # else the whole pass: the last batch partial, every record scored once (harness.train.loop.evaluator)
    batch = (BATCHED_BY_KEEP if keep == KEEP_BATCHES else
             REBATCH if read_batch is not None and not by_record else BATCH)
    augment = o.augment and training
    if augment and not image:
        log.warning("augment ignored: flips and rotations apply to image patches, not tables")
    return PipelinePlan(
        training=training, input_pipeline_id=input_pipeline_id, num_input_pipelines=num_input_pipelines,
        records=records, mean_record_bytes=mean_record_bytes, decoded_record_bytes=decoded_record_bytes, seed=seed,
        files=tuple(files), compressions=tuple(compressions),
        shuffle_files=training and not record_sharding and len(files) > 1,
        parallel_reads=(max(1, min(len(files), o.parallel_reads)) if o.parallel_reads
                        else decide_parallel_reads(files, cpus)), cpu_budget=cpus,
        thread_limit=thread_limit, map_parallelism=o.map_parallelism, prefetch_depth=o.prefetch,
        deterministic=True, record_sharding=record_sharding,
        read_batch=read_batch, parse=parse, cache=cache, cache_dir=o.cache_dir,
        cache_holds_records=records_cached or (per_record and cached),
        unbatch_after_cache=by_record and not records_cached, shuffle_buffer=buffer, keep=keep,
        records_per_epoch=keep_n if keep != KEEP_ALL else None, keep_filter=keep_filter, repeat=training,
        batch_size=batch_size, batch=batch, dropped=dropped, drop_remainder=training or keep_n is not None,
        augment=augment and image,
        brightness=o.brightness if training else 0.0, contrast=o.contrast if training else 0.0,
        first_epoch=o.first_epoch if training else 0, skip_batches=o.skip_batches if training else 0)
