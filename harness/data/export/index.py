"""Record counts (and uncompressed record bytes) per shard, counted once and cached in a small JSON index.

Earth Engine and the tools around it do not record how many Examples a shard holds, and declared sizes are wrong
(the ACES points export of the test data, tests/shared_data.py: 8531 declared, 8316 present; docs/GEE_FORMAT.md),
so the harness counts. Counting reads the whole shard once inside TensorFlow (batched, no per-record Python); the
result is cached under `$HARNESS_CACHE_DIR` (default `~/.cache/harness/`) in `record_index.json`, keyed by path,
size in bytes and modification time (`file_identity`), so a later run, or another worker sharing the home folder,
does not read the data again. A rewritten shard changes size or mtime and is counted again; the entries of
rewritten and deleted (local) files leave the index at its next write. Each entry also lists the checks its
shard's first record passed (`passed`, `mark_passed`), so a later run with the same spec reads no first record, and
the shard's compression (`compressions`), so a later run sniffs no first bytes. On gs:// the identities come from
the discovery's listing (`identities(listed=)`), not from a stat per object.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from harness.data.export import gcs, records
from harness.distribute import environment
from harness.data.export.shards import GZIP, NONE, Shard, read_buffer_bytes, sniff_compression
from harness.tracing import graph_fn
from harness.errors import HarnessError, NotTFRecordError, TruncatedShardError

log = logging.getLogger(__name__)

INDEX_NAME = "record_index.json"
_COUNT_BATCH = 4096


@dataclasses.dataclass(frozen=True)
class ShardStats:
    """Size of one shard: `records` (count) and `bytes` (sum of serialized record lengths, uncompressed, without
    TFRecord framing; about the decoded size for float and int64 features: 4 and up to 10 bytes per value)."""

    records: int
    bytes: int


def cache_dir() -> str:
    """`$HARNESS_CACHE_DIR`, else `~/.cache/harness`."""
    return os.environ.get(environment.CACHE_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "harness")


def file_identity(path: str) -> str:
    """`path|size in bytes|modification time in nanoseconds`: what tells a file from a rewritten one here (the
    record index, the pipeline's file cache). Local files are stat'ed by the OS (`os.stat`: nanoseconds);
    `tf.io.gfile.stat` rounds local mtimes to whole seconds, so it is used only for other file systems (`gs://`:
    a request each; `identities` takes them from the discovery's listing instead)."""
    if "://" not in path:
        st = os.stat(path)
        return f"{path}|{st.st_size}|{st.st_mtime_ns}"
    st = tf.io.gfile.stat(path)
    return f"{path}|{st.length}|{st.mtime_nsec}"


def listed_identity(obj: gcs.Listed) -> str:
    """`file_identity` of a gs:// object from a listing (`gcs.Listed`: its size, and `updated` converted as
    TensorFlow's stat converts it), with no request: equal to `file_identity(obj.path)` for the same object."""
    return f"{obj.path}|{obj.size}|{obj.mtime_ns}"


def identities(shards: Sequence[Shard], *, listed: Optional[gcs.Listings] = None) -> list[str]:
    """`file_identity` of each shard, in order: the keys of the index. A shard that the discovery's listings
    found (`listed`, `shards.find_shards`: gs://) takes its identity from there (`listed_identity`); any other is
    stat'ed (a request each on gs://), so a caller computes them once per run and hands them on."""
    objects = listed.objects if listed is not None else {}
    return [listed_identity(objects[s.path]) if s.path in objects else file_identity(s.path) for s in shards]


def size_of(key: str) -> int:
    """The size in bytes that an identity (`file_identity`) holds."""
    return int(key.rsplit("|", 2)[1])


def lookup(keys: Sequence[str], *, index_path: Optional[str] = None) -> list[Optional[dict]]:
    """The record index's entry for each identity in `keys` ({"records", "bytes", "compression", "checked"}), None
    where it holds none (a file not counted yet)."""
    entries = _load(index_path or os.path.join(cache_dir(), INDEX_NAME))
    return [e if isinstance(e, dict) else None for e in (entries.get(k) for k in keys)]


def compression_of(entry: Optional[dict]) -> Optional[str]:
    """The compression ("GZIP" or "") an index entry (`lookup`) remembers of its file, found in an earlier run
    (sniffed from its first bytes or verified by its count, then kept by `record_stats`); None when not known."""
    c = (entry or {}).get(COMPRESSION)
    return c if c in (GZIP, NONE) else None


def compressions(keys: Sequence[str], *, index_path: Optional[str] = None) -> list[Optional[str]]:
    """For each identity in `keys`: the compression its index entry remembers (`compression_of`), or None."""
    return [compression_of(e) for e in lookup(keys, index_path=index_path)]


def remember(paths: Sequence[str], stats: Sequence[ShardStats], *, index_path: Optional[str] = None) -> None:
    """Put the known `stats` of the files at `paths` (just written by the harness: `harness reshard`) in the index
    under their identities, so that no run counts them."""
    _save(index_path or os.path.join(cache_dir(), INDEX_NAME),
          {file_identity(p): {"records": st.records, "bytes": st.bytes} for p, st in zip(paths, stats)})


def _stats(entry: dict) -> ShardStats:
    return ShardStats(records=entry["records"], bytes=entry["bytes"])


# Checks passed, per shard: the digests of the checks (`harness.data.spec.validate.check_digest`: the spec and the
# checking code's version) that the shard's first record passed, the last CHECKED_KEPT of them, so that a later run
# with the same spec reads no shard whose identity is unchanged. A rewritten shard has another identity: no entry.
CHECKED, CHECKED_KEPT = "checked", 4
COMPRESSION = "compression"   # an entry's compression: "GZIP" or "" (`compressions`)


def passed(keys: Sequence[str], digest: str, *, index_path: Optional[str] = None) -> list[bool]:
    """For each identity in `keys`: whether its shard passed the checks of `digest` in an earlier run (its index
    entry lists the digest)."""
    entries = _load(index_path or os.path.join(cache_dir(), INDEX_NAME))
    return [digest in (entries.get(k) or {}).get(CHECKED, ()) for k in keys]


def mark_passed(keys: Sequence[str], digests: Sequence[str], *, index_path: Optional[str] = None) -> None:
    """Record that the shards of `keys` (counted: in the index) passed the checks of each of `digests`.

    The index is read, merged and replaced as one file (`_save`); a concurrent writer may drop a mark, which costs
    only that shard's check again. Keys not in the index are left out (nothing to attach the mark to)."""
    path = index_path or os.path.join(cache_dir(), INDEX_NAME)
    entries, new = _load(path), {}
    for k in keys:
        entry = entries.get(k)
        if not isinstance(entry, dict) or "records" not in entry:
            continue
        have = [d for d in entry.get(CHECKED, ()) if d not in digests]
        new[k] = {**entry, CHECKED: (have + list(digests))[-CHECKED_KEPT:]}
    if new:
        _save(path, new)


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _path_of(key: str) -> str:
    return key.rsplit("|", 2)[0]


def _stale(key: str, new_key_of: dict) -> bool:
    """Whether an index entry names a file that is gone or was rewritten: another identity of its path is being
    written now, or its path is local and no longer exists (a `gs://` path is not checked: a request each)."""
    path = _path_of(key)
    if new_key_of.get(path, key) != key:
        return True
    return "://" not in path and not os.path.exists(path)


def _save(path: str, new: dict) -> None:
    """Merge `new` into the index file atomically (write a temporary file, then rename); failures only log.

    Entries of files rewritten since (another identity of the same path in `new`) or gone (local paths) are
    dropped as the file is written, so the index holds the files that exist, not every file ever opened."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        new_key_of = {_path_of(k): k for k in new}
        merged = {k: v for k, v in {**_load(path), **new}.items() if k in new or not _stale(k, new_key_of)}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".record_index.")
        with os.fdopen(fd, "w") as f:
            json.dump(merged, f, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write the record index %s: %s (counts will be recomputed next run)", path, e)
        if tmp is not None and os.path.exists(tmp):   # a write cut short (a full disk): no half file left beside
            os.remove(tmp)


HEADS_KEPT_BYTES = 64 << 20   # the first records a counting read keeps for the checks (`_read_sizes`): 64 MiB in all


def _read_sizes(shards: Sequence[Shard], depths: Sequence[int] = ()) -> tuple[np.ndarray, dict]:
    """`[len(shards), 2]` int64: records and uncompressed record bytes of each shard, read in one tf.data pipeline
    (shards interleaved on TensorFlow's own threads; each record's length taken as it is read, so only lengths are
    batched, 4096 per element: memory does not grow with the records' size; no per-record Python). Batching whole
    records held 4096 of them per shard read at once (issue 62 measured 1.6 GB at the peak for a 1 GB export).
    With `depths` (per shard, how many of its first records to keep), the same read also keeps them: each record
    passes with its position and, past the first `depths[i]`, as an empty string, so the batches stay lengths;
    `{i: (record 0, ...)}` for the shards kept, HEADS_KEPT_BYTES in all (a shard whose records would pass that
    is kept out: its records are read again where they are needed, `source.ShardSet.heads`).

    One pipeline, called from this thread alone: TensorFlow's Python API dispatcher keeps the arguments of the call
    it is checking in storage shared by every thread (`PythonAPIDispatcher::Dispatch`,
    tensorflow/python/framework/python_api_dispatcher.cc, TF 2.18), so ops built from several Python threads at
    once can read another thread's freed argument (the signal 11 in `PyObject_GetAttr` under
    `PyInstanceChecker::Check` that counting in a thread pool caused; tests/data/export/test_index.py).

    Raises:
      tf.errors.DataLossError: from whichever shard failed first (the caller names it).
    """
    sizes, heads = np.zeros((len(shards), 2), np.int64), {}
    if not shards:
        return sizes, heads
    parallel = min(8, len(shards))
    buffer = read_buffer_bytes([s.path for s in shards])

    def read(i, path, compression, depth):
        def size(lengths):   # int32 each; their sum in int64 (4096 records of 2 MB overflow int32)
            return i, tf.size(lengths, out_type=tf.int64), tf.reduce_sum(tf.cast(lengths, tf.int64))

        def length_and_head(j, record):   # the record itself only among the first `depth`
            return j, tf.strings.length(record), tf.where(j < depth, record, "")

        def size_and_heads(j, lengths, kept):
            return (*size(lengths), j[0], kept[:depth])

        ds = tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=buffer)
        if not depths:   # each record's bytes dropped once its length is taken
            return ds.map(graph_fn(tf.strings.length)).batch(_COUNT_BATCH).map(graph_fn(size))
        return (ds.enumerate().map(graph_fn(length_and_head)).batch(_COUNT_BATCH)
                .map(graph_fn(size_and_heads)))

    ds = (tf.data.Dataset.from_tensor_slices((np.arange(len(shards), dtype=np.int64), [s.path for s in shards],
                                              [s.compression for s in shards],
                                              np.asarray(list(depths) or [0] * len(shards), np.int64)))
          .interleave(graph_fn(read), cycle_length=parallel, num_parallel_calls=parallel, deterministic=False))
    held = 0
    for i, n, nbytes, *first in ds.as_numpy_iterator():
        sizes[i] += (n, nbytes)
        if first and first[0] == 0 and len(first[1]):   # the shard's first batch: its first records
            kept = tuple(first[1])
            if held + sum(map(len, kept)) <= HEADS_KEPT_BYTES:
                heads[int(i)], held = kept, held + sum(map(len, kept))
    return sizes, heads


def _checked(shard: Shard, n: int, nbytes: int, size: Optional[int] = None) -> ShardStats:
    """ShardStats of `shard` from its counted `n` records of `nbytes`, after the checks TF's read does not make
    (`size`: the file's bytes where known, from its identity; else stat'ed)."""
    if n == 0 and records.has_payload(shard):
        raise NotTFRecordError(f"{shard.path}: not a TFRecord file (it has bytes but no complete record)")
    if shard.compression != GZIP:
        size = tf.io.gfile.stat(shard.path).length if size is None else size
        if size != nbytes + records.FRAMING_BYTES * n:
            raise TruncatedShardError(f"{shard.path}: shard truncated after {n} records (last good record index "
                                      f"{n - 1}): {size - nbytes - records.FRAMING_BYTES * n} trailing bytes "
                                      "are a partial record header")
    return ShardStats(int(n), int(nbytes))


def count_shard(shard: Shard) -> ShardStats:
    """Read one shard to the end and return its ShardStats (no cache).

    Raises:
      CompressionMismatchError: if the shard's compression disagrees with its bytes.
      NotTFRecordError: if record 0 is not TFRecord framing, or the file has bytes but no record.
      TruncatedShardError: if the shard ends inside a record (the message gives the last good record index).
      CorruptShardError: if a record's CRC fails or the GZIP stream is corrupt (the message gives the last good
        record index).
    """
    return count_shards([shard])[0]


@dataclasses.dataclass
class Found:
    """What counting reads found besides the counts (`record_stats(found=)`, `source.open_shards`).

    Attributes:
      deep, depth: the path whose first `depth` records a counting read keeps (the spec's inference reads them);
        of every other gs:// shard it keeps record 0 (the checks read it). Locally none is kept: a local file's
        head is read again for microseconds, and counting takes one length per record.
      heads: {path: (its first records, ...)} kept by the counting reads (`_read_sizes`: HEADS_KEPT_BYTES in all).
      compressions: {path: compression} of the shards whose counting read refuted the compression given (a guess,
        `source.open_shards`): sniffed, then counted again with it.
    """

    deep: str = ""
    depth: int = 1
    heads: dict = dataclasses.field(default_factory=dict)
    compressions: dict = dataclasses.field(default_factory=dict)


def count_shards(shards: Sequence[Shard], *, sizes: Optional[Sequence[int]] = None,
                 found: Optional[Found] = None) -> list[ShardStats]:
    """ShardStats of each shard, in order, read in one pipeline (no cache). When a read fails, the shards are
    read again one by one, so that the error names the first bad shard in order and its last good record.
    `sizes`: each file's bytes, when known (from its identity), so an uncompressed one's framing check stats none.
    `found` (`Found`): the read also keeps the first records of each gs:// shard, and a shard whose read fails
    where its first bytes (sniffed then: a request) say the other compression is counted again with that one.

    Raises:
      the errors of count_shard, for the first bad shard (with `found`, CompressionMismatchError excepted).
    """
    known = list(sizes) if sizes is not None else [None] * len(shards)
    depths = [0 if not gcs.is_gcs(s.path) else found.depth if s.path == found.deep else 1
              for s in shards] if found is not None else []
    try:
        counted, heads = _read_sizes(shards, depths if any(depths) else ())
    except tf.errors.DataLossError as e:
        if len(shards) > 1:
            return [st for s, size in zip(shards, known) for st in count_shards([s], sizes=[size], found=found)]
        shard = shards[0]
        sniffed = sniff_compression(shard.path) if found is not None else shard.compression
        if sniffed != shard.compression:
            found.compressions[shard.path] = sniffed
            return count_shards([dataclasses.replace(shard, compression=sniffed)], sizes=sizes, found=found)
        good = records.count_until_error(shard.path, shard.compression)
        raise records.data_loss_error(shard, good, e) from None
    if found is not None:
        found.heads.update((shards[i].path, kept) for i, kept in heads.items())
    return [_checked(s, n, nbytes, size) for s, (n, nbytes), size in zip(shards, counted, known)]


@dataclasses.dataclass(frozen=True)
class Split:
    """Counting split across the workers of one job: worker `rank` of `workers` counts (or takes from its index)
    the shards `rank, rank + workers, ...`, and `gather` hands every worker's figures to every worker.

    Attributes:
      rank, workers: this worker and the job's workers.
      gather: `fn(values: list[float]) -> float64 [workers, len(values)]` in rank order, every worker calling it at
        the same point with the same length (`TrainingBackend.allgather`).
    """

    rank: int
    workers: int
    gather: Callable[[Sequence[float]], np.ndarray]


# A gathered row's records: this worker's count of that shard raised; no shard; counted here with another
# compression than the one given (a guess refuted: every worker counts it itself, finding the compression too).
_FAILED, _PAD, _RECOUNT = -1.0, -2.0, -3.0


def record_stats(shards: Sequence[Shard], *, use_cache: bool = True, index_path: Optional[str] = None,
                 split: Optional[Split] = None, tally: Optional[dict] = None,
                 keys: Optional[Sequence[str]] = None, found: Optional[Found] = None) -> list[ShardStats]:
    """ShardStats for each shard, in order, from the cached index or by counting (count_shards: one pipeline).

    With `split`, each worker reads only its share (the shards `rank::workers`: from its index, else counted) and
    the figures are gathered, so a job of N workers on cold caches reads each shard once, not N times; every
    worker then holds every count and caches them. A shard that fails to count on its worker fails on every
    worker, with the same named error (each reads that shard again to name it), so no worker waits for a worker
    that stopped. `tally` (a dict), when given, is filled with what was done: {"shards", "counted", "cached",
    "gathered"} (gathered: counted or cached by the other workers). `keys`: the shards' `identities`, when the
    caller has them (else stat'ed here). `found` (`Found`): the counting reads keep the first records of the gs://
    shards they read, and a compression they refute is corrected (`count_shards`; in the index, the corrected one).

    Zero-record shards are valid: they are counted and logged, not an error.

    Raises:
      the errors of count_shard, for the first bad shard.
    """
    index_path = index_path or os.path.join(cache_dir(), INDEX_NAME)
    cached = _load(index_path) if use_cache else {}
    keys = list(keys) if keys is not None else identities(shards)
    mine = list(range(len(shards))) if split is None or split.workers == 1 else \
        list(range(split.rank, len(shards), split.workers))
    todo = [i for i in mine if keys[i] not in cached]
    new, failed = {}, None
    fixed = found.compressions if found is not None else {}

    def count(indices):   # their index entries, counted (the compression a read found, where it refuted a guess)
        got = count_shards([shards[i] for i in indices], sizes=[size_of(keys[i]) for i in indices], found=found)
        new.update((keys[i], {"records": st.records, "bytes": st.bytes,
                              COMPRESSION: fixed.get(shards[i].path, shards[i].compression)})
                   for i, st in zip(indices, got))

    if todo:
        log.info("counting records of %d shard(s) (cached in %s)", len(todo), index_path)
        try:
            count(todo)
        except HarnessError:
            if split is None or split.workers == 1:
                raise
            for i in todo:   # which one: the others are told, and name it themselves (below)
                try:
                    count([i])
                except HarnessError:
                    failed = i
                    break
    if split is not None and split.workers > 1:
        rows = []
        for i in mine:   # after a failure, the shards not counted are unknown (_PAD), the failed one _FAILED
            got = new.get(keys[i]) or cached.get(keys[i])
            rows += [_FAILED, 0.0] if i == failed else [_PAD, 0.0] if got is None else \
                [_RECOUNT, 0.0] if shards[i].path in fixed else [float(got["records"]), float(got["bytes"])]
        width = 2 * -(-len(shards) // split.workers)
        gathered = split.gather(rows + [_PAD] * (width - len(rows)))
        bad, recount = [], []
        for w, row in enumerate(gathered):
            for j, i in enumerate(range(w, len(shards), split.workers)):
                n, nbytes = row[2 * j], row[2 * j + 1]
                if n == _FAILED:
                    bad.append(i)
                elif keys[i] in new or keys[i] in cached:
                    continue
                elif n == _RECOUNT:
                    recount.append(i)
                elif n >= 0:
                    new[keys[i]] = {"records": int(n), "bytes": int(nbytes), COMPRESSION: shards[i].compression}
        if bad:
            count_shards([shards[min(bad)]], found=found)   # the named error of the first bad shard, on every worker
            raise HarnessError(f"{shards[min(bad)].path}: another worker could not count it (see its log)")
        if recount:
            count(recount)
    # entries written before compressions were kept (or by `remember`) learn this run's: the next sniffs none
    learnt = {k: {**cached[k], COMPRESSION: s.compression} for k, s in zip(keys, shards)
              if k in cached and k not in new and isinstance(cached[k], dict) and COMPRESSION not in cached[k]
              and s.compression in (GZIP, NONE)}
    if (new or learnt) and use_cache:
        _save(index_path, {**learnt, **new})
    if tally is not None:
        tally.update(shards=len(shards), counted=len(todo), cached=sum(keys[i] in cached for i in mine),
                     gathered=len(shards) - len(mine))
    out = [_stats(new.get(k) or cached[k]) for k in keys]
    empty = [s.path for s, st in zip(shards, out) if st.records == 0]
    if empty:
        log.warning("%d shard(s) hold zero records (counted, not an error): %s", len(empty), ", ".join(empty))
    return out


def record_counts(shards: Sequence[Shard], **kwargs) -> list[int]:
    """Number of records of each shard, in order (see record_stats; cached by path, size and mtime)."""
    return [s.records for s in record_stats(shards, **kwargs)]
