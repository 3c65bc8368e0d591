"""Read one input shard for prediction: every record once, in order, in batches (the last may be smaller).

No shuffle, no interleave across files, no drop_remainder: a shard is one `TFRecordDataset` read from its first
record to its last, so the i-th prediction of a shard is the i-th record of it, whatever the batch size. Bands are
decoded by the training pipeline's own `decode` (`harness.data.input.decode`), so the model sees what it was trained on.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from harness.data.input import decode
from harness.data.export.records import BYTES, INT64
from harness.data.export.shards import Shard, read_buffer_bytes
from harness.data.spec.dataspec import DataSpec
from harness.tracing import graph_fn


def keep_description(kept: dict[str, str]) -> dict:
    """`tf.io.parse_example` features of the kept properties (name -> storage dtype), one value each."""
    types = {INT64: tf.int64, BYTES: tf.string}
    return {name: tf.io.FixedLenFeature([], types.get(dtype, tf.float32)) for name, dtype in kept.items()}


def ordered_batches(shards: Sequence[Shard], spec: DataSpec, batch_size: int,
                    kept: dict[str, str]) -> tf.data.Dataset:
    """Batches of the shards, shard after shard, each shard's records in order.

    Args:
      shards: the shards to read, in order (a worker's contiguous run, less the complete ones).
      spec: the read spec, without label; `crop_margin` set when the model takes the central P x P.
      kept: table exports: properties copied to the output, name -> storage dtype ("float", "int64", "bytes").
    Returns:
      a dataset of `(position, inputs, kept)`: position int32, the batch's shard (its index in `shards`); inputs
      float32 [b, S, S, C] (or [b, P, P, C] cropped) for images, [b, C] for tables, 1 <= b <= batch_size (smaller
      only for a shard's last batch: a batch never mixes shards); kept {name: [b]} float32, int64 or string.
      Reading and decoding run ahead of the consumer across file boundaries (one `flat_map`, then a parallel,
      deterministic map and a prefetch).
    Raises (when iterated):
      tf.errors.InvalidArgumentError: for a record that lacks a band or holds another number of values
        (`harness.data.export.scan.named_error` names it).
    """
    keep = keep_description(kept)
    files = tf.data.Dataset.from_tensor_slices((tf.range(len(shards), dtype=tf.int32), [s.path for s in shards],
                                               [s.compression for s in shards]))

    buffer = read_buffer_bytes([s.path for s in shards])

    def read(position, path, compression):
        ds = tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=buffer)
        return ds.batch(batch_size, drop_remainder=False).map(graph_fn(lambda records: (position, records)))

    def parse(position, serialized):
        inputs = decode.decode(spec, serialized)
        return position, inputs, tf.io.parse_example(serialized, keep) if keep else {}

    ds = files.flat_map(graph_fn(read))
    ds = ds.map(graph_fn(parse), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def missing_kept(names: Sequence[str], schema: dict) -> list[str]:
    """The `--keep` properties absent from the records' schema."""
    return [n for n in names if n not in schema]
