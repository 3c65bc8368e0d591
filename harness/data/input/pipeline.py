"""The tf.data input pipeline: shards -> (inputs, labels) batches for one input pipeline (worker).

Order (tf.data performance guide, https://www.tensorflow.org/guide/data_performance):
  list files -> shard (harness.distribute.sharding.assign_nonempty) -> interleave (parallel, deterministic) ->
  [record sharding: shard the records] -> [small records: parse each read batch; large records, cached: parse
  each record] -> cache (before any randomness) -> shuffle -> keep `records_per_epoch` -> repeat (training: epoch
  after epoch, each shuffled by the seed and its number, `_epochs`) -> batch [large records, uncached: parse each
  record first] -> augment -> prefetch.

Parse order, by the mean serialized record size (VECTORIZE_MAX_RECORD_BYTES):
  small records (tables, small patches) leave the file readers in read batches of ~256 kB (read_batch_size),
  each parsed by one vectorized `tf.io.parse_example`; the parsed tensors are then cached (in memory, for
  training, as records up to MEMORY_CACHE_MAX_RECORDS; else as read batches), shuffled and regrouped into
  batches. Per-batch costs are paid once per ~1000 records of the point export, and the cache holds parsed tensors, so later epochs parse nothing. Under record sharding the read batches are grouped after
  the shard. A training epoch that keeps every whole batch (one worker) is cut by `batch(drop_remainder=True)`
  alone, with no per-batch keep test: the stages after the cache are then those of a hand-written
  `cache -> shuffle -> batch` pipeline.
  large records (image patches, MB each) are parsed one by one in parallel and then batched, which keeps all
  cores busy on the float-list decoding and does not hold a whole batch of serialized copies. When cached,
  they are parsed before the cache (as a hand-written `map(parse) -> cache` pipeline does): later epochs parse
  nothing, and a parsed float32 patch is no larger than its serialized float list. Uncached, only the records
  an epoch keeps are parsed, after the shuffle.
benchmarks/input_pipeline.py measures both choices against the other order and the raw read.

Every choice above is taken once, without TensorFlow, by `harness.data.input.stages.decide` (`plan_pipeline`
measures and calls it); `apply_plan` then builds the stages it names, one small function each (`_read`, `_parse`,
`_cache`, `_shuffle`, `_keep`, `_batch`, `_augment`, `_prefetch`). What a record is decoded into is
`harness.data.input.decode`'s, the random stages `harness.data.input.augment`'s.
"""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Optional, Sequence, Union

import tensorflow as tf

from harness.data.export import index
from harness.data.export.shards import Shard, read_buffer_bytes
from harness.data.export.source import ShardSet
from harness.data.input import filecache
from harness.data.input import stages as stages_lib
from harness.data.input.augment import augment_batch, color_jitter
from harness.data.input.decode import decode, decode_one
from harness.data.input.stages import PipelineOptions, PipelinePlan
from harness.data.spec.dataspec import IMAGE, DataSpec
from harness.data.spec.validate import validate_shards
from harness.tracing import graph_fn
from harness.distribute import resources as resources_lib
from harness.distribute.sharding import RECORD, ShardAssignment, assign_nonempty
from harness.errors import BatchSizeError, SpecError

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
# Bump whenever a change to this module or to `harness.data.input.decode` changes what a file cache holds (the
# elements' structure, dtypes or values): the version is part of every file cache's name, so an older pipeline's
# caches are not read.
PIPELINE_VERSION = 2


# --- cache -------------------------------------------------------------------------------------------------------
def cache_name(spec: DataSpec, assignment: ShardAssignment, compressions: Sequence[str], *,
               read_batch: Optional[int], training: bool, identities: Optional[dict] = None) -> str:
    """The name of this input pipeline's file cache: a digest of everything the cached elements depend on, so that
    a cache is never read for other data.

    Digested: PIPELINE_VERSION; the spec (`to_config`: bands, dtypes, label, crop, resize, ...); the parse order
    (`read_batch`: records per parsed read batch, None when serialized records are cached); the sharding policy;
    and each assigned file's identity (`index.file_identity`: path, size in bytes, modification time in ns; from
    `identities`, {path: identity} as `ShardSet.identities` took them at discovery, else stat'ed here: a request
    each on gs://) and compression. Files re-exported under the same names, or another spec, give another name: a
    new cache.
    """
    known = identities or {}
    parts = [f"pipeline v{PIPELINE_VERSION}", json.dumps(spec.to_config(), sort_keys=True),
             f"read_batch={read_batch}", f"policy={assignment.policy}",
             *(f"{known.get(p) or index.file_identity(p)}|{c}" for p, c in zip(assignment.files, compressions))]
    digest = hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]
    return (f"harness-{digest}-{'train' if training else 'eval'}-p{assignment.input_pipeline_id}of"
            f"{assignment.num_input_pipelines}")


# --- the pipeline ------------------------------------------------------------------------------------------------
def decoded_record_bytes(spec: DataSpec) -> int:
    """Bytes of one decoded example as delivered (float32 bands, int32 or float32 label; images cropped and
    resized to `output_size`): what a cache of parsed records holds per record."""
    n = spec.output_size ** 2 if spec.kind == IMAGE else 1
    return 4 * n * (len(spec.channels) + (spec.label is not None))


def shuffle(ds: tf.data.Dataset, buffer_size: int, seed, *, reshuffle_each_iteration: bool) -> tf.data.Dataset:
    """`ds.shuffle(buffer_size, seed=seed, ...)` with an int64 tensor `seed` (the epoch's, inside a tf.data
    function) whatever global seed the user's model file set.

    TensorFlow pairs an op seed with the graph's seed (`random_seed.get_seed`) and compares the pair to (0, 0) in
    Python: a tensor seed under a global seed of 0 (`keras.utils.set_random_seed(0)`, `tf.random.set_seed(0)`, as
    model files and the Keras guides write) raised OperatorNotAllowedInGraphError while the pipeline was built.
    Inside a function the graph's seed is left out while the op is made, so the pair is TensorFlow's default graph
    seed and `seed`, as without a global seed: the same order whatever seed the model file sets.
    """
    graph = tf.compat.v1.get_default_graph()
    if tf.executing_eagerly() or graph.seed is None:
        return ds.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=reshuffle_each_iteration)
    saved, graph.seed = graph.seed, None
    try:
        return ds.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=reshuffle_each_iteration)
    finally:
        graph.seed = saved


def read_files(paths: Sequence[str], compressions: Sequence[str], *, deterministic: bool, shuffle_files: bool,
               seed: int, read_batch: Optional[int], parallel_reads: Optional[int] = None) -> tf.data.Dataset:
    """Serialized records (tf.string scalars) of the files, `parallel_reads` files read at once (default
    stages.READERS_PER_CORE x cores, stages.READERS_PER_CORE_REMOTE x cores for gs:// files)
    (a parallel interleave, one element from each file in turn); with `read_batch`, elements are tf.string
    [<= read_batch] read batches of one file each (small records: every interleave element costs microseconds).

    Args:
      compressions: per file, "GZIP" or "" (uncompressed), as sniffed by shards.discover_shards.
      shuffle_files: shuffle the file order each epoch (seeded with `seed`).
      parallel_reads: the interleave cycle (1: the files one after the other).
    """
    files = tf.data.Dataset.from_tensor_slices((list(paths), list(compressions)))
    if shuffle_files and len(paths) > 1:
        files = shuffle(files, len(paths), seed, reshuffle_each_iteration=True)  # seed: int or int64 tensor

    buffer = read_buffer_bytes(paths)

    def read(path, compression):
        ds = tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=buffer)
        return ds.batch(read_batch) if read_batch else ds

    cycle = parallel_reads or stages_lib.decide_parallel_reads(paths)
    if cycle == 1:
        return files.flat_map(graph_fn(read))
    return files.interleave(graph_fn(read), cycle_length=cycle, block_length=1, num_parallel_calls=cycle,
                            deterministic=deterministic)


def build_dataset(data: Union[ShardSet, Sequence[Shard]], spec: DataSpec, options: PipelineOptions, *,
                  input_pipeline_id: int = 0, num_input_pipelines: int = 1,
                  assignment: Optional[ShardAssignment] = None) -> tf.data.Dataset:
    """The dataset of one input pipeline, yielding `(inputs, labels)` batches of `options.per_replica_batch_size`:
    `apply_plan(plan_pipeline(...))`.

    Shapes and dtypes (B = per_replica_batch_size; H = W = spec.output_size; C = bands):
      image: inputs float32 [B, H, W, C]; with band groups a dict {group: [B, H, W, Cg]} or, for
        group_delivery "time", [B, T, H, W, Cg]; labels int32 [B, H, W] (float32 for regression).
      table: inputs float32 [B, C] (dict / [B, T, Cg] with groups); labels int32 [B].
    Training batches always have exactly B examples (drop_remainder=True); an evaluation pass keeps its last,
    partial batch (every record scored once).

    Args and Raises: as `plan_pipeline`, and CacheInUseError if another live process is filling the same file
    cache (filecache.claim).
    """
    plan = plan_pipeline(data, spec, options, input_pipeline_id=input_pipeline_id,
                         num_input_pipelines=num_input_pipelines, assignment=assignment)
    return apply_plan(plan, spec)


def plan_pipeline(data: Union[ShardSet, Sequence[Shard]], spec: DataSpec, options: PipelineOptions, *,
                  input_pipeline_id: int = 0, num_input_pipelines: int = 1,
                  assignment: Optional[ShardAssignment] = None, resources=None) -> PipelinePlan:
    """Measure one input pipeline's share (records, serialized and decoded bytes) and decide its stages
    (`stages.decide`): what `apply_plan` builds, the job logs and the profile reports.

    Args:
      data: the dataset's `ShardSet` (counted once: `source.open_shards`), or its shards in order (counted here
        through the record index); zero-record shards are skipped.
      spec: the feature spec; it must have a label.
      options: `PipelineOptions`.
      input_pipeline_id / num_input_pipelines: this pipeline among all (usually the worker index and count);
        files (or records) are split by assign_nonempty (zero-record files skipped).
      assignment: this pipeline's files as the epoch plan assigned them (`Plan.assignments[id]`); computed from
        the pipeline id and count when None.
      resources: this worker's `harness.distribute.resources.Resources` (its CPUs set the parallel reads, its
        memory the cache="auto" decision); measured now (`resources.for_this_process`) when None.

    Raises:
      SpecError: if the spec has no label.
      BatchSizeError: if records_per_epoch exceeds this pipeline's records or is below one batch, or an
        evaluation pass would yield no batch.
      ConfigError: from assign_nonempty (bad pipeline id or count, no files) or for a bad cache mode.
      and the errors of validate.validate_spec (declared features vs records) and index.record_stats (bad or
        truncated shards), raised before any batch is produced.
    """
    if spec.label is None:
        raise SpecError("the spec has no label: declare `label:` to build a training or evaluation dataset")
    if options.per_replica_batch_size < 1:
        raise BatchSizeError(f"per_replica_batch_size must be >= 1, got {options.per_replica_batch_size}")
    if not isinstance(data, ShardSet):
        shards, keys = tuple(data), index.identities(data)
        data = ShardSet(shards=shards, stats=tuple(index.record_stats(shards, keys=keys)), mixer=None, sources=(),
                        identities=tuple(keys))
    if options.validate:
        _validate_once(spec, data)
    holding = data.files_with_records
    if len(holding) < len(data.shards):
        log.info("skipping %d zero-record shard(s)", len(data.shards) - len(holding))
    if not holding:
        raise BatchSizeError("every shard holds zero records")
    if assignment is None:
        assignment = assign_nonempty(data.counts, num_input_pipelines, input_pipeline_id)
    compression = {s.path: s.compression for s in data.shards}
    compressions = [compression[p] for p in assignment.files]
    identities = dict(zip((s.path for s in data.shards), data.identities))
    mean_bytes = data.nbytes() / data.records  # zero-record shards hold zero bytes
    plan = stages_lib.decide(
        options, files=assignment.files, compressions=compressions,
        records=assignment.records(dict(data.counts)),
        mean_record_bytes=mean_bytes, decoded_record_bytes=decoded_record_bytes(spec), image=spec.kind == IMAGE,
        record_sharding=assignment.policy == RECORD, input_pipeline_id=assignment.input_pipeline_id,
        num_input_pipelines=assignment.num_input_pipelines,
        cpu_count=resources.cpus if resources else None,
        available_memory=resources.memory_bytes if resources else None,
        thread_limit=resources_lib.quota_threads(resources or resources_lib.for_this_process()),
        cache_name=lambda read_batch: cache_name(spec, assignment, compressions, read_batch=read_batch,
                                                 training=options.training, identities=identities))
    log.info("%s", plan.describe())   # shown with -v; the training one is printed once by the job
    return plan


def apply_plan(plan: PipelinePlan, spec: DataSpec) -> tf.data.Dataset:
    """Build the stages `plan` names, in order (see the module docstring); shapes as `build_dataset`.

    Raises:
      CacheInUseError: if another live process is filling the same file cache (filecache.claim).
    """
    if plan.repeat:
        ds = _epochs(plan, spec)
    else:
        ds = _cache(_parse_before_cache(_read(plan), spec, plan), plan)
        ds = _keep(_shuffle(ds, plan), plan)
    ds = _batch(ds, spec, plan)
    ds = _augment(ds, spec, plan)
    return _prefetch(ds, plan)


EPOCH_SEED_STRIDE = 1_000_003  # epoch e of seed s is shuffled with seed s * stride + e (< 2**62 for s < 2**31)


def _epochs(plan: PipelinePlan, spec: DataSpec) -> tf.data.Dataset:
    """Training: epoch after epoch from `plan.first_epoch`, each the shuffled and kept records (or batches) of one
    pass, shuffled with the seed `plan.seed * EPOCH_SEED_STRIDE + epoch` (`reshuffle_each_iteration=False`), so
    that an epoch's order is a function of the seed and its number alone, not of how many epochs this process
    ran before: a run resumed in the middle of epoch e reads epoch e in the order the interrupted run read it,
    and skips its first `plan.skip_batches` batches (read and dropped: at most one epoch's reading), which that
    run trained on. The reads are deterministic (`plan.deterministic`). A cache is filled in a fixed file order
    by the first pass and read by the later ones; without one each epoch reads its files in its own seeded order.
    """
    def seed_of(epoch):
        return tf.cast(plan.seed, tf.int64) * EPOCH_SEED_STRIDE + epoch

    def shuffled(ds, epoch):
        ds = shuffle(ds, plan.shuffle_buffer, seed_of(epoch), reshuffle_each_iteration=False)
        return _keep(ds, plan, repeat=False)

    if plan.cache.kind != "none":
        upstream = _cache(_parse_before_cache(_read(plan, shuffle_files=False), spec, plan), plan)

        def one_epoch(epoch):
            return shuffled(upstream, epoch)
    else:
        def one_epoch(epoch):
            return shuffled(_cache(_parse_before_cache(_read(plan, seed=seed_of(epoch)), spec, plan), plan), epoch)
    ds = tf.data.Dataset.range(plan.first_epoch, 2 ** 62).flat_map(graph_fn(one_epoch))
    if plan.skip_batches:
        per_batch = 1 if plan.batch == stages_lib.BATCHED_BY_KEEP else plan.batch_size  # batches or records
        ds = ds.skip(plan.skip_batches * per_batch)
    return ds


def _read(plan: PipelinePlan, *, seed=None, shuffle_files: bool = True) -> tf.data.Dataset:
    """Serialized records, or read batches of `plan.read_batch` (record sharding: sharded first, then grouped);
    `seed`: the file order's (default `plan.seed`), `shuffle_files` False: the files in their order."""
    ds = read_files(plan.files, plan.compressions, deterministic=plan.deterministic,
                    shuffle_files=plan.shuffle_files and shuffle_files,
                    seed=plan.seed if seed is None else seed, parallel_reads=plan.parallel_reads,
                    read_batch=None if plan.record_sharding else plan.read_batch)
    if plan.record_sharding:
        ds = ds.shard(plan.num_input_pipelines, plan.input_pipeline_id)
        if plan.read_batch:
            ds = ds.batch(plan.read_batch)
    return ds


def _parse_records(ds: tf.data.Dataset, spec: DataSpec, plan: PipelinePlan) -> tf.data.Dataset:
    return ds.map(graph_fn(lambda r: decode_one(spec, r)), num_parallel_calls=plan.map_parallelism or AUTOTUNE,
                  deterministic=plan.deterministic)


def _parse_before_cache(ds: tf.data.Dataset, spec: DataSpec, plan: PipelinePlan) -> tf.data.Dataset:
    """Read batches parsed as they come (small records), or single records parsed into the cache (large)."""
    if plan.parse == stages_lib.PARSE_READ_BATCHES:
        return ds.map(graph_fn(lambda r: decode(spec, r)), num_parallel_calls=plan.map_parallelism or AUTOTUNE,
                      deterministic=plan.deterministic)
    if plan.parse == stages_lib.PARSE_BEFORE_CACHE:
        return _parse_records(ds, spec, plan)
    return ds


def _cache(ds: tf.data.Dataset, plan: PipelinePlan) -> tf.data.Dataset:
    """The cache of `plan.cache` (before any randomness), holding records or read batches; read batches are split
    into records after it when the shuffle and the keep need records."""
    if plan.cache_holds_records and plan.read_batch:
        ds = ds.unbatch()  # records cached: no unbatch per epoch
    if plan.cache.kind == "memory":
        ds = ds.cache()
    elif plan.cache.kind == "file":
        tf.io.gfile.makedirs(plan.cache_dir)
        filecache.claim(plan.cache.path)  # one live filler; a dead one's lockfile and partial files are cleared
        ds = ds.cache(plan.cache.path)
    return ds.unbatch() if plan.unbatch_after_cache else ds


def _shuffle(ds: tf.data.Dataset, plan: PipelinePlan) -> tf.data.Dataset:
    if plan.shuffle_buffer is None:
        return ds
    return ds.shuffle(plan.shuffle_buffer, seed=plan.seed, reshuffle_each_iteration=True)


def _keep(ds: tf.data.Dataset, plan: PipelinePlan, *, repeat: bool = True) -> tf.data.Dataset:
    """The first `records_per_epoch` records of each epoch (as batches when parsed and a whole number of
    batches), then `repeat` (where the plan repeats and `repeat`)."""
    if plan.keep == stages_lib.KEEP_BATCHES:
        # Parsed records: batch each epoch's shuffled stream, then keep its first batches: the same batches
        # as keeping the first records and batching after `repeat`, at no per-record cost.
        ds = _keep_first_batches(ds, plan.records_per_epoch, plan.batch_size, filtered=plan.keep_filter)
    elif plan.keep == stages_lib.KEEP_RECORDS:
        ds = _keep_first(ds, plan.records_per_epoch)
    return ds.repeat() if plan.repeat and repeat else ds


def _batch(ds: tf.data.Dataset, spec: DataSpec, plan: PipelinePlan) -> tf.data.Dataset:
    """Batches of `batch_size` (`drop_remainder` but for a whole evaluation pass, whose last batch is partial);
    large uncached records are parsed here, only those kept."""
    if plan.dropped:
        log.info("evaluation drops the last %d records (drop_remainder)", plan.dropped)
    if plan.batch == stages_lib.BATCHED_BY_KEEP:
        return ds
    if plan.batch == stages_lib.REBATCH:  # evaluation: regroup the parsed read batches across file boundaries
        return ds.rebatch(plan.batch_size, drop_remainder=plan.drop_remainder)
    if plan.parse == stages_lib.PARSE_KEPT:  # large records, not cached: parse each record kept, in parallel
        ds = _parse_records(ds, spec, plan)
    return ds.batch(plan.batch_size, drop_remainder=plan.drop_remainder)


def _augment(ds: tf.data.Dataset, spec: DataSpec, plan: PipelinePlan) -> tf.data.Dataset:
    """Flips and rotations of image and mask together, then color jitter of the inputs (training only)."""
    if plan.augment:
        seeds = tf.data.Dataset.random(seed=plan.seed).batch(2, drop_remainder=True)
        ds = tf.data.Dataset.zip((ds, seeds)).map(
            graph_fn(lambda batch, s: augment_batch(spec, batch[0], batch[1], s)),
            num_parallel_calls=plan.map_parallelism or AUTOTUNE, deterministic=plan.deterministic)
    if plan.brightness or plan.contrast:
        seeds = tf.data.Dataset.random(seed=plan.seed + 1).batch(2, drop_remainder=True)
        ds = tf.data.Dataset.zip((ds, seeds)).map(
            graph_fn(lambda batch, s: (color_jitter(batch[0], s, brightness=plan.brightness,
                                                    contrast=plan.contrast), batch[1])),
            num_parallel_calls=plan.map_parallelism or AUTOTUNE, deterministic=plan.deterministic)
    return ds


def _prefetch(ds: tf.data.Dataset, plan: PipelinePlan) -> tf.data.Dataset:
    ds = ds.prefetch(plan.prefetch_depth or AUTOTUNE)
    options = tf.data.Options()
    if plan.cpu_budget:  # autotuning plans for this worker's CPUs, not every core of the host
        options.autotune.cpu_budget = plan.cpu_budget
    if plan.thread_limit:
        # The budget alone does not bound an AUTOTUNE map: it ran one call per schedulable core (2 at once with
        # cpu_budget=1 on 2 cores; tensorflow/tensorflow#62821), past a pod's CPU limit. A private pool of the
        # worker's CPUs does, for every map and parallel batch (the interleaved reads and the prefetch run on
        # threads of their own).
        options.threading.private_threadpool_size = plan.thread_limit
    # The harness shards by itself (assign_files); tf.distribute must not shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def _keep_first_batches(ds: tf.data.Dataset, keep: int, batch: int, *, filtered: bool) -> tf.data.Dataset:
    """Batches of `batch` holding the first `keep` records (a multiple of `batch`) of each pass of `ds` (one
    epoch of a shuffled stream, repeated after).

    When `keep` is every whole batch of the pass (one worker: the epoch drops only the last `available % batch`
    records; `filtered` False), `batch(drop_remainder=True)` does it alone, as a hand-written pipeline does. Else
    the batches past `keep` are read and dropped by `_keep_first` (enumerate + filter: ~70 µs more per batch on 2
    busy cores, which ran the ACES points at 320k examples/s against 480k without it; a per-record keep ran at
    22k).
    """
    ds = ds.batch(batch, drop_remainder=True)
    return _keep_first(ds, keep, per_element=batch) if filtered else ds

_VALIDATED: set = set()


def _validate_once(spec: DataSpec, data: ShardSet) -> None:
    """validate_shards (every shard's first record, one parallel pass), once per process for a given spec and
    shard list (build_dataset runs once per input pipeline, and the training job builds several datasets on the
    same shards)."""
    key = (repr(spec), tuple(data.shards))
    if key not in _VALIDATED:
        validate_shards(spec, data)
        _VALIDATED.add(key)


def _keep_first(ds: tf.data.Dataset, keep: int, *, per_element: int = 1) -> tf.data.Dataset:
    """Keep the first `keep` records of each pass and drop the rest with enumerate + filter (not take), so the
    upstream is still read to its end and a cache before it completes during the first epoch (the counts were
    checked by `stages.check_keep`).

    Args:
      per_element: records per element of `ds` (1: records; B: batches of B, `keep` a multiple of B)."""
    def first(i, _):
        return i < keep // per_element

    def record(_, r):
        return r

    return ds.enumerate().filter(graph_fn(first)).map(graph_fn(record))
