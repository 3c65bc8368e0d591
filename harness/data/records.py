"""Read records from one shard with clear errors, and decode them as tf.train.Example (and nothing else).

TensorFlow reports every framing problem as `tf.errors.DataLossError`; this module turns it into the named error
that says what is wrong with which file and record (harness.errors). Facts used (checked on TF 2.18):
  - GZIP read as uncompressed: "corrupted record at 0"; uncompressed read as GZIP: "inflate() failed";
  - a shard cut inside a record: "truncated record at <offset>" after the good records;
  - a shard cut inside the 12-byte header of a record is NOT reported by TF (it stops silently), so counting
    also compares an uncompressed file's size with the framed size of the records read (16 bytes per record:
    8 length + 4 length CRC + 4 data CRC; TFRecord format, tensorflow/core/lib/io/record_writer.h).
"""
from __future__ import annotations

import dataclasses
import gzip
from typing import Optional

import tensorflow as tf
from google.protobuf import message as pb_message
from google.protobuf import unknown_fields

from harness.data.shards import GZIP, Shard, check_compression, sniff_compression
from harness.errors import (CompressionMismatchError, HarnessError, NotExampleError, NotTFRecordError,
                            TruncatedShardError)

FRAMING_BYTES = 16  # per record: uint64 length, uint32 masked CRC of the length, uint32 masked CRC of the data

FLOAT, INT64, BYTES = "float", "int64", "bytes"
EMPTY = "empty"  # a feature present with no kind set (TFX writes these for missing values)
_KIND_TO_DTYPE = {"float_list": FLOAT, "int64_list": INT64, "bytes_list": BYTES, None: EMPTY}


@dataclasses.dataclass(frozen=True)
class FeatureInfo:
    """What one record holds under one key: dtype ("float", "int64", "bytes" or "empty") and value count.

    For bytes features `length` is the number of byte strings and `nbytes` the length of the first one (a uint8
    band stored as raw bytes is one string of H*W bytes).
    """

    dtype: str
    length: int
    nbytes: int = 0


def dataset(shard: Shard, *, buffer_size: Optional[int] = None) -> tf.data.TFRecordDataset:
    """The raw serialized records of one shard, read with its compression."""
    return tf.data.TFRecordDataset(shard.path, compression_type=shard.compression, buffer_size=buffer_size)


def data_loss_error(shard: Shard, good: int, err: Exception) -> HarnessError:
    """The named error for a DataLossError met after `good` readable records of `shard`."""
    try:
        check_compression(shard)
    except CompressionMismatchError as mismatch:
        return mismatch
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    detail = detail.split("}}")[-1].strip()
    if good == 0 and "truncated" not in detail:
        return NotTFRecordError(f"{shard.path}: not a TFRecord file (record 0 unreadable: {detail})")
    last = f"last good record index {good - 1}" if good else "no complete record"
    return TruncatedShardError(f"{shard.path}: shard truncated after {good} records ({last}): {detail}")


def has_payload(shard: Shard) -> bool:
    """True when the (decompressed) file holds at least one byte: a file with bytes but no record is not TFRecord."""
    with tf.io.gfile.GFile(shard.path, "rb") as f:
        if shard.compression == GZIP:
            try:
                return bool(gzip.GzipFile(fileobj=f).read(1))
            except (OSError, EOFError):
                return True
        return bool(f.read(1))


def read_records(shard: Shard, n: int) -> list[bytes]:
    """The first `n` serialized records of `shard` (fewer if it holds fewer; [] for a zero-record shard).

    Raises:
      CompressionMismatchError: if the shard's declared compression disagrees with its bytes.
      NotTFRecordError: if the first record is not TFRecord framing, or the file has bytes but no record.
      TruncatedShardError: if the shard ends inside one of the first `n` records.
    """
    check_compression(shard)
    out: list[bytes] = []
    try:
        for r in dataset(shard).take(n):
            out.append(r.numpy())
    except tf.errors.DataLossError as e:
        raise data_loss_error(shard, len(out), e) from None
    if not out and has_payload(shard):
        raise NotTFRecordError(f"{shard.path}: not a TFRecord file (it has bytes but no complete record)")
    return out


def _unknown(msg) -> bool:
    return len(unknown_fields.UnknownFieldSet(msg)) > 0


def decode_example(raw: bytes, *, path: str, index: int) -> tf.train.Example:
    """Parse one record as tf.train.Example, refusing anything else.

    A SequenceExample parses as an Example without error (its `context` is field 1, like `features`), as do many
    other protobufs; they are told apart by the fields an Example does not have (wire-format unknown fields).

    Raises:
      NotExampleError: if the bytes are not a protobuf, or hold fields that tf.train.Example does not define.
    """
    try:
        ex = tf.train.Example.FromString(raw)
    except pb_message.DecodeError as e:
        raise NotExampleError(f"{path}: record {index} is not a tf.train.Example ({e})") from None
    what = None
    if _unknown(ex):
        what = "has fields that tf.train.Example lacks (a SequenceExample has feature_lists)"
    elif _unknown(ex.features):
        what = "has unknown fields in its features"
    elif raw and not ex.features.feature:
        what = "decodes as an Example with no feature"
    if what is None:
        for key, feature in ex.features.feature.items():
            if _unknown(feature):
                what = f"feature {key!r} has unknown fields"
                break
    if what:
        raise NotExampleError(f"{path}: record {index} is not a tf.train.Example: it {what}; another protobuf "
                              "(SequenceExample?) must not be read as empty Examples")
    return ex


def schema_of(ex: tf.train.Example) -> dict[str, FeatureInfo]:
    """Feature name -> FeatureInfo for one Example, sorted by name (the order inside a record is arbitrary)."""
    out = {}
    for key in sorted(ex.features.feature):
        f = ex.features.feature[key]
        kind = f.WhichOneof("kind")
        values = getattr(f, kind).value if kind else []
        nbytes = len(values[0]) if kind == "bytes_list" and len(values) else 0
        out[key] = FeatureInfo(_KIND_TO_DTYPE[kind], len(values), nbytes)
    return out


def first_examples(shard: Shard, n: int) -> list[tf.train.Example]:
    """Decode the first `n` records of a shard (see read_records and decode_example for the errors)."""
    return [decode_example(r, path=shard.path, index=i) for i, r in enumerate(read_records(shard, n))]


__all__ = ["FeatureInfo", "FLOAT", "INT64", "BYTES", "EMPTY", "dataset", "read_records", "decode_example",
           "schema_of", "first_examples", "data_loss_error", "has_payload", "sniff_compression"]
