"""Read one input shard for prediction: every record once, in order, in batches (the last may be smaller).

No shuffle, no interleave across files, no drop_remainder: a shard is one `TFRecordDataset` read from its first
record to its last, so the i-th prediction of a shard is the i-th record of it, whatever the batch size. Bands are
decoded by the training pipeline's own `decode` (`harness.data.pipeline`), so the model sees what it was trained on.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from harness.data import pipeline
from harness.data.records import BYTES, INT64
from harness.data.shards import Shard
from harness.data.spec import DataSpec

READ_BUFFER_BYTES = 4 * 1024 * 1024


def keep_description(kept: dict[str, str]) -> dict:
    """`tf.io.parse_example` features of the kept properties (name -> storage dtype), one value each."""
    types = {INT64: tf.int64, BYTES: tf.string}
    return {name: tf.io.FixedLenFeature([], types.get(dtype, tf.float32)) for name, dtype in kept.items()}


def shard_batches(shard: Shard, spec: DataSpec, batch_size: int, kept: dict[str, str]) -> tf.data.Dataset:
    """Batches of one shard in record order.

    Args:
      spec: the read spec, without label; `crop_margin` set when the model takes the central P x P.
      kept: table exports: properties copied to the output, name -> storage dtype ("float", "int64", "bytes").
    Returns:
      a dataset of `(inputs, kept)`: inputs float32 [b, S, S, C] (or [b, P, P, C] cropped) for images,
      [b, C] for tables, b <= batch_size (smaller only for the shard's last batch); kept {name: [b]} float32,
      int64 or string.
    Raises (when iterated):
      tf.errors.InvalidArgumentError: for a record that lacks a band or holds another number of values
        (`harness.data.scan.named_error` names it).
    """
    keep = keep_description(kept)

    def parse(serialized):
        inputs = pipeline.decode(spec, serialized)
        return inputs, tf.io.parse_example(serialized, keep) if keep else {}

    ds = tf.data.TFRecordDataset(shard.path, compression_type=shard.compression, buffer_size=READ_BUFFER_BYTES)
    ds = ds.batch(batch_size, drop_remainder=False)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def missing_kept(names: Sequence[str], schema: dict) -> list[str]:
    """The `--keep` properties absent from the records' schema."""
    return [n for n in names if n not in schema]
