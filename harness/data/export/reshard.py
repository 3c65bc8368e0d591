"""`harness reshard`: rewrite an export's shards (GZIP as Earth Engine writes them) into uncompressed shards, as many
as a multiple of the workers, balanced, in the original record order, with their record index.

Why: a GZIP stream is inflated by one thread per file, and Earth Engine exports often have fewer files than a
worker has cores, or record counts that split unevenly among workers (`harness plan` shows the records each
worker drops). Uncompressed shards are read at disk speed, a parallel interleave reads all of a worker's files at
once, and equal shards give every worker the same records.

Output (`OUT/<prefix>-00000.tfrecord` ...): record r of the concatenated source shards (in shard order) is record
r of the concatenated outputs; output shard i holds `records // n` records, plus one for the first `records % n`.
Beside them: `<prefix>-index.json` (source files, per output shard its path, first record and count) and, for an
image export, the source's mixer copied as `<prefix>-mixer.json` (same patch grid and order). The harness record
index (`harness.data.export.index`) is filled for the new shards with what was written (records and bytes, no read
of them), so the first run does not count them. Records are read in batches of at most READ_BATCH records and
about READ_BATCH_BYTES (the source's mean record size from its counts): memory does not grow with the records'
size.
"""
from __future__ import annotations

import json
import logging
import posixpath
from typing import Optional, Sequence

import tensorflow as tf

from harness.data.export import index
from harness.data.export.shards import read_buffer_bytes
from harness.data.export.source import open_shards
from harness.errors import ConfigError

log = logging.getLogger(__name__)

READ_BATCH = 1024
READ_BATCH_BYTES = 32 << 20   # a read batch's serialized records, about (2 MB patches: 16 a batch, not 1024)


def balanced_sizes(records: int, shards: int) -> list[int]:
    """`shards` counts summing to `records`, differing by at most one, larger first."""
    if shards < 1:
        raise ConfigError(f"need at least one output shard, got {shards}")
    return [records // shards + (1 if i < records % shards else 0) for i in range(shards)]


def reshard(sources: Sequence[str], output: str, *, workers: int, shards_per_worker: int = 1,
            prefix: Optional[str] = None, mixer: Optional[str] = None) -> dict:
    """Rewrite the shards found in `sources` into `workers x shards_per_worker` uncompressed shards under `output`.

    Returns:
      the index written to `<prefix>-index.json`: `{"sources", "records", "workers", "shards": [{"path",
      "first_record", "records"}], "mixer"}`.
    Raises:
      ConfigError: if workers or shards_per_worker < 1, or there are fewer records than output shards.
      and the errors of shard discovery and counting (bad, truncated or mismatched shards).
    """
    if workers < 1 or shards_per_worker < 1:
        raise ConfigError(f"--workers and --shards-per-worker must be >= 1, got {workers} and {shards_per_worker}")
    data = open_shards(list(sources), mixer=mixer)   # gs://: one listing per folder, no stat per shard
    shards, stats = list(data.shards), list(data.stats)
    total, n_out = sum(st.records for st in stats), workers * shards_per_worker
    if total < n_out:
        raise ConfigError(f"{total} records cannot fill {n_out} shards ({workers} workers x {shards_per_worker})")
    prefix = prefix or posixpath.basename(shards[0].prefix)
    tf.io.gfile.makedirs(output)
    sizes = balanced_sizes(total, n_out)
    paths = [posixpath.join(output, f"{prefix}-{i:05d}.tfrecord") for i in range(n_out)]
    mean_bytes = sum(st.bytes for st in stats) / total
    written = _copy_in_order(shards, paths, sizes, batch=max(1, min(READ_BATCH, int(READ_BATCH_BYTES // mean_bytes))))
    entries, first = [], 0
    for path, n in zip(paths, sizes):
        entries.append({"path": path, "first_record": first, "records": n})
        first += n
    found = data.mixer
    mixer_out = None
    if found is not None:
        mixer_out = posixpath.join(output, f"{prefix}-mixer.json")
        tf.io.gfile.copy(found.path, mixer_out, overwrite=True)
    result = {"sources": [s.path for s in shards], "records": total, "workers": workers,
              "shards_per_worker": shards_per_worker, "shards": entries, "mixer": mixer_out}
    with tf.io.gfile.GFile(posixpath.join(output, f"{prefix}-index.json"), "w") as f:
        json.dump(result, f, indent=1)
    index.remember(paths, [index.ShardStats(n, nbytes) for n, nbytes in zip(sizes, written)])
    return result


def _copy_in_order(shards, paths: Sequence[str], sizes: Sequence[int], batch: int = READ_BATCH) -> list[int]:
    """Stream the records of `shards` in order into `paths`, `sizes[i]` records into `paths[i]`, read `batch`
    records at a time; returns the serialized bytes written to each (the record index's `bytes`)."""
    if len({s.compression for s in shards}) == 1:
        comp = shards[0].compression
        records = tf.data.TFRecordDataset([s.path for s in shards], compression_type=comp,
                                          buffer_size=read_buffer_bytes([s.path for s in shards]))
    else:  # mixed compression: one dataset per file, concatenated in order
        records = None
        for s in shards:
            one = tf.data.TFRecordDataset(s.path, compression_type=s.compression,
                                          buffer_size=read_buffer_bytes(s.path))
            records = one if records is None else records.concatenate(one)
    batches = records.batch(batch).prefetch(2).as_numpy_iterator()
    pending: list[bytes] = []
    out_bytes = []
    for path, size in zip(paths, sizes):
        nbytes = 0
        with tf.io.TFRecordWriter(path) as writer:
            written = 0
            while written < size:
                if not pending:
                    pending = list(next(batches))
                take = min(size - written, len(pending))
                for record in pending[:take]:
                    writer.write(record)
                    nbytes += len(record)
                pending = pending[take:]
                written += take
        out_bytes.append(nbytes)
        log.info("wrote %s: %d records", path, size)
    return out_bytes
