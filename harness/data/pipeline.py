"""The tf.data input pipeline: shards -> (inputs, labels) batches for one input pipeline (worker).

Order (tf.data performance guide, https://www.tensorflow.org/guide/data_performance):
  list files -> shard (harness.distribute.sharding.assign_nonempty) -> interleave (parallel; deterministic only for
  evaluation or record-level sharding) -> [record sharding: shard the records] -> [small records: parse each read
  batch; large records, cached: parse each record] -> cache (before any randomness) -> shuffle -> keep
  `records_per_epoch` -> repeat (training) -> batch [large records, uncached: parse each record first] -> augment
  -> prefetch.

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
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
from typing import Optional, Sequence, Union

import tensorflow as tf

from harness.choices import CACHE_MODES
from harness.data import filecache, index
from harness.data.labels import LABEL_CHECK_MESSAGE, deliver, is_label_value
from harness.data.records import BYTES, INT64
from harness.data.shards import Shard
from harness.data.source import ShardSet
from harness.data.spec import IMAGE, TIME, DataSpec, validate_spec
from harness.distribute.sharding import RECORD, ShardAssignment, assign_nonempty
from harness.errors import BatchSizeError, ConfigError, SpecError

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
# Mean serialized record size above which records are parsed one by one (then batched); below, batch then parse.
VECTORIZE_MAX_RECORD_BYTES = 64 * 1024
# The shuffle buffer holds serialized records; its default is sized to about this many bytes.
SHUFFLE_BUFFER_BYTES = 256 * 1024 * 1024
MAX_DEFAULT_SHUFFLE = 16384
# "auto" caches in memory when this pipeline's records take at most this fraction of the available memory.
MEMORY_CACHE_FRACTION = 0.5
READ_BUFFER_BYTES = 4 * 1024 * 1024
# Files read at once (interleave cycle), per core.
READERS_PER_CORE = 1
# Small records travel from the file readers in read batches of about this many serialized bytes, at most
# READ_BATCH_MAX records, and are parsed one read batch at a time (see read_batch_size).
READ_BATCH_BYTES = 256 * 1024
READ_BATCH_MAX = 4096
# A memory cache of parsed small records holds records (each epoch then reads them as a hand-written
# `map(parse) -> cache -> shuffle` does) up to this many per pipeline; above, read batches, unbatched after the cache
# each epoch, since each cached element costs ~100-200 bytes of tensor bookkeeping beside its values. The unbatch
# per epoch cost the ACES points' training pipeline ~17% of its in-graph rate (522k against 626k examples/s).
MEMORY_CACHE_MAX_RECORDS = 1_000_000
# Bump whenever a change to this module changes what a file cache holds (the elements' structure, dtypes or
# values): the version is part of every file cache's name, so an older pipeline's caches are not read.
PIPELINE_VERSION = 2


# --- parsing -----------------------------------------------------------------------------------------------------
def feature_description(spec: DataSpec) -> dict:
    """`tf.io.parse_example` features for the spec: fixed-length lists of S*S (image) or scalars (table)."""
    n = spec.values_per_feature()
    shape = [n] if spec.kind == IMAGE else []
    out = {}
    for name in spec.features:
        dt = spec.dtype_of(name)
        if dt == BYTES:
            out[name] = tf.io.FixedLenFeature([], tf.string)
        else:
            out[name] = tf.io.FixedLenFeature(shape, tf.int64 if dt == INT64 else tf.float32)
    return out


def _band(spec: DataSpec, name: str, value: tf.Tensor) -> tf.Tensor:
    """One parsed band as float32 [N, S*S] (image) or [N] (table)."""
    if spec.dtype_of(name) == BYTES:
        value = tf.io.decode_raw(value, tf.uint8)
    return tf.cast(value, tf.float32)


def _spatial(spec: DataSpec, x: tf.Tensor, *, mask: bool) -> tf.Tensor:
    """[N, S, S, C] (or [N, S, S] for a mask) -> cropped and/or resized to the delivered size."""
    if spec.crop_margin and spec.kernel_margin:
        a = spec.kernel_margin // 2
        x = x[:, a:a + spec.patch_size, a:a + spec.patch_size]
    if spec.resize and spec.resize != spec.output_size_before_resize:
        size = [spec.resize, spec.resize]
        if mask:
            x = tf.image.resize(x[..., None], size, method="nearest")[..., 0]
        else:
            x = tf.image.resize(x, size, method="bilinear")
    return x


def _stack(spec: DataSpec, parsed: dict, bands: Sequence[str]) -> tf.Tensor:
    """Bands [N, S*S] (image) or [N] (table) -> channels-last float32 [N, H, W, C] or [N, C].

    Image bands are stacked band-major ([N, C, S*S]) and transposed: `tf.stack(axis=-1)` is a concat whose inner
    size is one value, copied value by value (1.5 ms against 0.6 ms per 256x256x8 record here). Table bands are
    stacked on the last axis, which measured faster than the transpose for [256, 8].
    """
    cols = [_band(spec, b, parsed[b]) for b in bands]
    if spec.kind != IMAGE:
        return tf.stack(cols, axis=-1)  # [N, C]
    s = spec.stored_size
    x = tf.transpose(tf.reshape(tf.stack(cols, axis=1), [-1, len(bands), s, s]), [0, 2, 3, 1])
    return _spatial(spec, x, mask=False)


def stack_bands(spec: DataSpec, parsed: dict):
    """Per-band tensors -> the model's inputs as the spec delivers them (one source of truth for training, predict
    and the SavedModel's serving signature).

    Args:
      parsed: band name -> float [N, S*S] (image, row-major) or [N] (table), as `tf.io.parse_example` returns them
        (a bytes band: uint8 raw bytes, per `spec.dtypes`).
    Returns:
      float32 [N, H, W, C] or [N, C]; with band groups, group_delivery "dict": {group: [N, H, W, Cg] or [N, Cg]}
      in the groups' order, "time": the groups stacked on axis 1, [N, T, H, W, Cg] or [N, T, Cg].
    """
    if not spec.band_groups:
        return _stack(spec, parsed, spec.bands)
    groups = {g: _stack(spec, parsed, b) for g, b in spec.band_groups.items()}
    return tf.stack(list(groups.values()), axis=1) if spec.group_delivery == TIME else groups


def decode(spec: DataSpec, serialized: tf.Tensor):
    """Serialized Examples [N] -> (inputs, labels) per the spec (see build_dataset for shapes and dtypes).

    Raises (when the dataset is iterated):
      tf.errors.InvalidArgumentError: from `tf.io.parse_example` for a record that lacks a feature or holds
        another number of values; with LABEL_CHECK_MESSAGE for a classification label that is negative,
        fractional, NaN or >= spec.num_classes, or a regression label that is NaN or infinite (and not the
        ignore_label). harness.data.scan finds the file and record.
    """
    parsed = tf.io.parse_example(serialized, feature_description(spec))
    inputs = stack_bands(spec, parsed)
    if spec.label is None:
        return inputs
    label = parsed[spec.label]
    # Earth Engine stores class ids as floats (3.0): cast (GEE_FORMAT.md), after checking that every value keeps
    # the label rule (a class id, a finite regression value, or the nodata value; harness.data.labels); a failing
    # batch is traced to its record by harness.data.scan.
    check = tf.debugging.Assert(tf.reduce_all(is_label_value(label, spec.task, spec.num_classes, spec.ignore_label)),
                                [LABEL_CHECK_MESSAGE])
    with tf.control_dependencies([check]):
        label = deliver(label, spec.task, spec.ignore_label)
    if spec.kind == IMAGE:
        s = spec.stored_size
        label = _spatial(spec, tf.reshape(label, [-1, s, s]), mask=True)
    return inputs, label


def decode_one(spec: DataSpec, serialized: tf.Tensor):
    """One serialized Example (scalar) -> one element (no batch axis)."""
    return tf.nest.map_structure(lambda t: t[0], decode(spec, serialized[None]))


# --- augmentation ------------------------------------------------------------------------------------------------
def _where(flag: tf.Tensor, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    return tf.where(tf.reshape(flag, [-1] + [1] * (a.shape.rank - 1)), a, b)


def _dihedral(x: tf.Tensor, flags: tf.Tensor, h_axis: int) -> tf.Tensor:
    """Per example: optional transpose, vertical flip, horizontal flip (together the 8 flips/90-degree rotations)."""
    perm = list(range(x.shape.rank))
    perm[h_axis], perm[h_axis + 1] = perm[h_axis + 1], perm[h_axis]
    x = _where(flags[:, 0], tf.transpose(x, perm), x)
    x = _where(flags[:, 1], tf.reverse(x, [h_axis]), x)
    return _where(flags[:, 2], tf.reverse(x, [h_axis + 1]), x)


def augment_batch(spec: DataSpec, inputs, labels, seed: tf.Tensor):
    """Random flips and 90-degree rotations, the same for an example's bands (any number, any group) and mask.

    Args:
      seed: int64 [2], a stateless random seed (tf.random.stateless_uniform).
    """
    batch = tf.shape(labels)[0]
    flags = tf.random.stateless_uniform([batch, 3], seed=seed) < 0.5
    h_axis = 2 if (spec.band_groups and spec.group_delivery == TIME) else 1
    inputs = tf.nest.map_structure(lambda t: _dihedral(t, flags, h_axis), inputs)
    return inputs, _dihedral(labels, flags, 1)


def color_jitter(inputs, seed: tf.Tensor, *, brightness: float = 0.0, contrast: float = 0.0):
    """Random brightness and contrast of the input bands only (never the labels), per example, scale-free for
    bands of any units: brightness multiplies an example's every band by b ~ U(1 − brightness, 1 + brightness);
    contrast moves each band of an image around its spatial mean, `mean + c·(x − mean)` with
    c ~ U(1 − contrast, 1 + contrast) (as tf.image.adjust_contrast, per channel). Band groups get the same
    factors (one scene).

    Args:
      inputs: `[batch, ..., bands]` float32 tensors (a dict of them with band groups).
      seed: int64 [2], a stateless random seed.
    """
    def jitter(x):
        batch = tf.shape(x)[0]
        shape = tf.concat([[batch], tf.ones([x.shape.rank - 1], tf.int32)], 0)
        factors = tf.random.stateless_uniform([batch, 2], seed=seed, minval=-1.0, maxval=1.0)
        b = tf.reshape(1.0 + brightness * factors[:, 0], shape)
        c = tf.reshape(1.0 + contrast * factors[:, 1], shape)
        x = x * b
        if contrast and x.shape.rank >= 4:  # images: mean over the two spatial axes before the bands
            mean = tf.reduce_mean(x, axis=[x.shape.rank - 3, x.shape.rank - 2], keepdims=True)
            x = mean + c * (x - mean)
        return x
    return tf.nest.map_structure(jitter, inputs)


# --- cache -------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CacheChoice:
    """Where the raw records are cached: kind "memory" | "file" | "none", the file (for "file") and why."""

    kind: str
    path: Optional[str]
    reason: str


def _available_memory() -> int:
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil is a dependency; keep the pipeline usable without it
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def choose_cache(mode: str, nbytes: int, *, cache_dir: Optional[str], name: str,
                 available: Optional[int] = None) -> CacheChoice:
    """Decide the cache for `nbytes` of serialized records (the index's counted bytes, about the decoded size).

    Raises:
      ConfigError: for an unknown mode, or mode "file" without cache_dir.
    """
    def gb(b: int) -> str:
        return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"

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
        return CacheChoice("memory", None, f"{gb(nbytes)} of records fit in {MEMORY_CACHE_FRACTION:.0%} of the "
                                           f"{gb(available)} available memory")
    if path:
        return CacheChoice("file", path, f"{gb(nbytes)} of records exceed {gb(budget)} of memory: cached in files")
    return CacheChoice("none", None, f"{gb(nbytes)} of records exceed {gb(budget)} of memory and no --cache-dir "
                                     "was given: not cached")


def cache_name(spec: DataSpec, assignment: ShardAssignment, compressions: Sequence[str], *,
               read_batch: Optional[int], training: bool) -> str:
    """The name of this input pipeline's file cache: a digest of everything the cached elements depend on, so that
    a cache is never read for other data.

    Digested: PIPELINE_VERSION; the spec (`to_config`: bands, dtypes, label, crop, resize, ...); the parse order
    (`read_batch`: records per parsed read batch, None when serialized records are cached); the sharding policy;
    and each assigned file's identity (`index.file_identity`: path, size in bytes, modification time in ns) and
    compression. Files re-exported under the same names, or another spec, give another name: a new cache.
    """
    parts = [f"pipeline v{PIPELINE_VERSION}", json.dumps(spec.to_config(), sort_keys=True),
             f"read_batch={read_batch}", f"policy={assignment.policy}",
             *(f"{index.file_identity(p)}|{c}" for p, c in zip(assignment.files, compressions))]
    digest = hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]
    return (f"harness-{digest}-{'train' if training else 'eval'}-p{assignment.input_pipeline_id}of"
            f"{assignment.num_input_pipelines}")


# --- the pipeline ------------------------------------------------------------------------------------------------
def parse_per_record(mean_record_bytes: float) -> bool:
    """True when records are large enough to parse one by one (in parallel) rather than in batches."""
    return mean_record_bytes > VECTORIZE_MAX_RECORD_BYTES


def read_batch_size(mean_record_bytes: float) -> int:
    """Records per read batch for small records: about READ_BATCH_BYTES of serialized records, 1 to
    READ_BATCH_MAX. Every element of a tf.data stage and every `parse_example` call has a fixed cost of tens of
    microseconds; on the point export (220 bytes per record) parsing read batches of ~1000 records, then
    regrouping the parsed tensors, ran at 0.99-1.08x the raw read against 0.77-0.92x for batches of 256
    (benchmarks/input_pipeline.py, 2 cores)."""
    return int(max(1, min(READ_BATCH_MAX, READ_BATCH_BYTES // max(mean_record_bytes, 1))))


def decoded_record_bytes(spec: DataSpec) -> int:
    """Bytes of one decoded example as delivered (float32 bands, int32 or float32 label; images cropped and
    resized to `output_size`): what a cache of parsed records holds per record."""
    n = spec.output_size ** 2 if spec.kind == IMAGE else 1
    return 4 * n * (len(spec.bands) + (spec.label is not None))


def read_files(paths: Sequence[str], compressions: Sequence[str], *, deterministic: bool, shuffle_files: bool,
               seed: int, read_batch: Optional[int]) -> tf.data.Dataset:
    """Serialized records (tf.string scalars) of the files, READERS_PER_CORE x cores files read at once
    (a parallel interleave, one element from each file in turn); with `read_batch`, elements are tf.string
    [<= read_batch] read batches of one file each (small records: every interleave element costs microseconds).

    Args:
      compressions: per file, "GZIP" or "" (uncompressed), as sniffed by shards.discover_shards.
      shuffle_files: shuffle the file order each epoch (seeded with `seed`).
    """
    files = tf.data.Dataset.from_tensor_slices((list(paths), list(compressions)))
    if shuffle_files and len(paths) > 1:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)

    def read(path, compression):
        ds = tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=READ_BUFFER_BYTES)
        return ds.batch(read_batch) if read_batch else ds

    cycle = max(1, min(len(paths), int(READERS_PER_CORE * (os.cpu_count() or 4))))
    if cycle == 1:
        return files.flat_map(read)
    return files.interleave(read, cycle_length=cycle, block_length=1, num_parallel_calls=cycle,
                            deterministic=deterministic)


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """How one input pipeline reads its shards (the `DataConfig` of tf-models' input_reader, frozen).

    Attributes:
      per_replica_batch_size: examples per batch delivered to one replica.
      training: True: read order not deterministic, shuffle, keep records_per_epoch, repeat forever, optional
        augmentation. False: one deterministic pass, no shuffle or augmentation.
      records_per_epoch: keep exactly the first this-many records of each epoch of this pipeline's shuffled
        stream and drop the rest (read, not parsed), so every worker runs the same number of steps.
      shuffle_buffer: records in the shuffle buffer; default min(records, ~256 MB of records, 16384).
      cache: "auto" (memory when the pipeline's records fit in half the available memory, else files under
        cache_dir, else none), "memory", "file" (needs cache_dir) or "none". The cache is filled before any
        randomness, with parsed tensors (sized as decoded float32: `decoded_record_bytes`): read batches for
        small records, single records for large ones.
      cache_dir: folder of the file cache. Its name (cache_name) changes with the files, spec and pipeline version;
        one process at a time fills it, and what a killed run left is cleared (harness.data.filecache).
      augment: random flips and 90-degree rotations of image and mask together (training images only).
      brightness, contrast: maximum relative change of `color_jitter` (training only; 0: none).
      seed: seeds file order, shuffle and augmentation; None for a random seed.
      validate: check the spec against the first record of every shard first (spec.validate_spec; one record
        read per shard, once per process). False when the caller validated already (the training job).
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


def build_dataset(data: Union[ShardSet, Sequence[Shard]], spec: DataSpec, options: PipelineOptions, *,
                  input_pipeline_id: int = 0, num_input_pipelines: int = 1,
                  assignment: Optional[ShardAssignment] = None) -> tf.data.Dataset:
    """The dataset of one input pipeline, yielding `(inputs, labels)` batches of `options.per_replica_batch_size`.

    Shapes and dtypes (B = per_replica_batch_size; H = W = spec.output_size; C = bands):
      image: inputs float32 [B, H, W, C]; with band groups a dict {group: [B, H, W, Cg]} or, for
        group_delivery "time", [B, T, H, W, Cg]; labels int32 [B, H, W] (float32 for regression).
      table: inputs float32 [B, C] (dict / [B, T, Cg] with groups); labels int32 [B].
    Batches always have exactly B examples (drop_remainder=True); records left over are logged.

    Args:
      data: the dataset's `ShardSet` (counted once: `source.open_shards`), or its shards in order (counted here
        through the record index); zero-record shards are skipped.
      spec: the feature spec; it must have a label.
      options: `PipelineOptions`.
      input_pipeline_id / num_input_pipelines: this pipeline among all (usually the worker index and count);
        files (or records) are split by assign_nonempty (zero-record files skipped).
      assignment: this pipeline's files as the epoch plan assigned them (`Plan.assignments[id]`); computed from
        the pipeline id and count when None.

    Raises:
      SpecError: if the spec has no label.
      BatchSizeError: if records_per_epoch exceeds this pipeline's records or is below one batch, or an
        evaluation pass would yield no batch.
      ConfigError: from assign_nonempty (bad pipeline id or count, no files) or for a bad cache mode.
      CacheInUseError: if another live process is filling the same file cache (filecache.claim).
      and the errors of spec.validate_spec (declared features vs records) and index.record_stats (bad or
        truncated shards), raised before any batch is produced.
    """
    o = options
    per_replica_batch_size, training, records_per_epoch = o.per_replica_batch_size, o.training, o.records_per_epoch
    if spec.label is None:
        raise SpecError("the spec has no label: declare `label:` to build a training or evaluation dataset")
    if per_replica_batch_size < 1:
        raise BatchSizeError(f"per_replica_batch_size must be >= 1, got {per_replica_batch_size}")
    seed = random.randrange(2 ** 31) if o.seed is None else o.seed
    shards = data.shards if isinstance(data, ShardSet) else tuple(data)
    if o.validate:
        _validate_once(spec, shards)
    stats = data.stats if isinstance(data, ShardSet) else index.record_stats(shards)
    nonempty = [(s, st) for s, st in zip(shards, stats) if st.records > 0]
    if len(nonempty) < len(shards):
        log.info("skipping %d zero-record shard(s)", len(shards) - len(nonempty))
    if not nonempty:
        raise BatchSizeError("every shard holds zero records")
    if assignment is None:
        assignment = assign_nonempty([(s.path, st.records) for s, st in zip(shards, stats)], num_input_pipelines,
                                     input_pipeline_id)
    input_pipeline_id, num_input_pipelines = assignment.input_pipeline_id, assignment.num_input_pipelines
    by_path = {s.path: (s, st) for s, st in nonempty}
    my_records = assignment.records({p: st.records for p, (_, st) in by_path.items()})
    total_bytes = sum(st.bytes for _, st in nonempty)
    mean_bytes = total_bytes / sum(st.records for _, st in nonempty)
    my_bytes = int(my_records * mean_bytes)

    deterministic = not training or assignment.policy == RECORD  # record sharding needs one order on all workers
    per_record = parse_per_record(mean_bytes)
    # Small records: read batches, parsed as they come, so every later stage (cache, shuffle, batch) moves parsed
    # tensors. Record sharding takes single records from the readers, shards them, then groups read batches.
    read_batched = not per_record
    compressions = [by_path[p][0].compression for p in assignment.files]
    read_batch = read_batch_size(mean_bytes) if read_batched else None
    ds = read_files(assignment.files, compressions, deterministic=deterministic,
                    shuffle_files=training and assignment.policy != RECORD, seed=seed,
                    read_batch=None if assignment.policy == RECORD else read_batch)
    if assignment.policy == RECORD:
        ds = ds.shard(num_input_pipelines, input_pipeline_id)
        if read_batched:
            ds = ds.batch(read_batch)
    if read_batched:
        ds = ds.map(lambda r: decode(spec, r), num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    my_bytes = my_records * decoded_record_bytes(spec)  # a cache holds parsed tensors

    may_use_files = o.cache_dir and o.cache in ("file", "auto")  # the name stats every file: only when needed
    name = cache_name(spec, assignment, compressions, read_batch=read_batch, training=training) if may_use_files \
        else "unused"
    choice = choose_cache(o.cache, my_bytes, cache_dir=o.cache_dir, name=name)
    log.info("input pipeline %d/%d: %d files, %d records, cache: %s (%s)", input_pipeline_id,
             num_input_pipelines, len(assignment.files), my_records, choice.kind, choice.reason)
    parsed = read_batched
    if per_record and choice.kind != "none":  # parse once, into the cache (uncached: only the records kept)
        ds = ds.map(lambda r: decode_one(spec, r), num_parallel_calls=AUTOTUNE, deterministic=deterministic)
        parsed = True
    batched = read_batched  # elements are read batches (parsed), not records
    by_record = batched and (training or records_per_epoch is not None)  # shuffle and the keep work on records
    if by_record and choice.kind == "memory" and my_records <= MEMORY_CACHE_MAX_RECORDS:
        ds, batched = ds.unbatch(), False  # records cached: no unbatch per epoch
    if choice.kind == "memory":
        ds = ds.cache()
    elif choice.kind == "file":
        tf.io.gfile.makedirs(o.cache_dir)
        filecache.claim(choice.path)  # one live filler; a dead one's lockfile and partial files are cleared
        ds = ds.cache(choice.path)

    if batched and by_record:
        ds, batched = ds.unbatch(), False
    if training:
        buffer = o.shuffle_buffer or max(1, min(my_records, int(SHUFFLE_BUFFER_BYTES // max(mean_bytes, 1)),
                                              MAX_DEFAULT_SHUFFLE))
        ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
        if records_per_epoch is not None and parsed and records_per_epoch % per_replica_batch_size == 0:
            # Parsed records: batch each epoch's shuffled stream, then keep its first batches: the same batches
            # as keeping the first records and batching after `repeat`, at no per-record cost.
            ds = _keep_first_batches(ds, records_per_epoch, my_records, per_replica_batch_size)
            batched = True
        elif records_per_epoch is not None:
            ds = _keep_first(ds, records_per_epoch, my_records, per_replica_batch_size)
        ds = ds.repeat()
    else:
        per_pass = my_records if records_per_epoch is None else min(records_per_epoch, my_records)
        if records_per_epoch is not None and records_per_epoch < my_records:
            ds = _keep_first(ds, records_per_epoch, my_records, per_replica_batch_size)
        if per_pass < per_replica_batch_size:
            raise BatchSizeError(f"{per_pass} records < per-replica batch {per_replica_batch_size}: no batch")
        if per_pass % per_replica_batch_size:
            log.info("evaluation drops the last %d records (drop_remainder)", per_pass % per_replica_batch_size)

    if batched and training:  # batched per epoch above
        pass
    elif batched:  # evaluation: regroup the parsed read batches across file boundaries
        ds = ds.rebatch(per_replica_batch_size, drop_remainder=True)
    elif parsed:
        ds = ds.batch(per_replica_batch_size, drop_remainder=True)
    else:  # large records, not cached: parse each record kept, in parallel, then batch
        ds = ds.map(lambda r: decode_one(spec, r), num_parallel_calls=AUTOTUNE, deterministic=deterministic)
        ds = ds.batch(per_replica_batch_size, drop_remainder=True)

    if o.augment and training:
        if spec.kind != IMAGE:
            log.warning("augment ignored: flips and rotations apply to image patches, not tables")
        else:
            seeds = tf.data.Dataset.random(seed=seed).batch(2, drop_remainder=True)
            ds = tf.data.Dataset.zip((ds, seeds)).map(
                lambda batch, s: augment_batch(spec, batch[0], batch[1], s), num_parallel_calls=AUTOTUNE,
                deterministic=deterministic)
    if (o.brightness or o.contrast) and training:
        seeds = tf.data.Dataset.random(seed=seed + 1).batch(2, drop_remainder=True)
        ds = tf.data.Dataset.zip((ds, seeds)).map(
            lambda batch, s: (color_jitter(batch[0], s, brightness=o.brightness, contrast=o.contrast), batch[1]),
            num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    ds = ds.prefetch(AUTOTUNE)
    options = tf.data.Options()
    # The harness shards by itself (assign_files); tf.distribute must not shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def _check_keep(keep: int, available: int, batch: int) -> None:
    """Keeping `keep` of `available` records per pass in batches of `batch`: refuse what yields no step, log
    what is dropped."""
    if keep > available:
        raise BatchSizeError(f"records_per_epoch {keep} exceeds the {available} records of this input pipeline")
    if keep < batch:
        raise BatchSizeError(f"records_per_epoch {keep} < per-replica batch {batch}: an epoch would have no step")
    if keep < available:
        log.info("records_per_epoch %d: %d of this input pipeline's %d records are read and dropped each epoch",
                 keep, available - keep, available)


def _keep_first_batches(ds: tf.data.Dataset, keep: int, available: int, batch: int) -> tf.data.Dataset:
    """Batches of `batch` holding the first `keep` records (a multiple of `batch`) of each pass over the
    `available` records of `ds` (one epoch of a shuffled stream, repeated after).

    When `keep` is every whole batch of the pass (one worker: the epoch drops only the last `available % batch`
    records), `batch(drop_remainder=True)` does it alone, as a hand-written pipeline does. Else the batches past
    `keep` are read and dropped by `_keep_first` (enumerate + filter: ~70 µs more per batch on 2 busy cores,
    which ran the ACES points at 320k examples/s against 480k without it; a per-record keep ran at 22k).

    Raises:
      BatchSizeError: if keep > available or keep < batch.
    """
    ds = ds.batch(batch, drop_remainder=True)
    if keep // batch == available // batch:
        _check_keep(keep, available, batch)
        return ds
    return _keep_first(ds, keep, available, batch, per_element=batch)


_VALIDATED: set = set()


def _validate_once(spec: DataSpec, shards: Sequence[Shard]) -> None:
    """validate_spec, once per process for a given spec and shard list (build_dataset runs once per input
    pipeline, and the training job builds several datasets on the same shards)."""
    key = (repr(spec), tuple(shards))
    if key not in _VALIDATED:
        validate_spec(spec, shards)
        _VALIDATED.add(key)


def _keep_first(ds: tf.data.Dataset, keep: int, available: int, batch: int, *, per_element: int = 1
                ) -> tf.data.Dataset:
    """Keep the first `keep` records of each pass and drop the rest with enumerate + filter (not take), so the
    upstream is still read to its end and a cache before it completes during the first epoch.

    Args:
      per_element: records per element of `ds` (1: records; B: batches of B, `keep` a multiple of B)."""
    _check_keep(keep, available, batch)

    def first(i, _):
        return i < keep // per_element

    def record(_, r):
        return r

    return ds.enumerate().filter(first).map(record)
