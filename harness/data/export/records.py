"""Read records from one shard with clear errors, and decode them as tf.train.Example (and nothing else).

TensorFlow reports every framing problem as `tf.errors.DataLossError`; this module turns it into the named error
that says what is wrong with which file and record (harness.errors). Facts used (checked on TF 2.18):
  - GZIP read as uncompressed: "corrupted record at 0"; uncompressed read as GZIP: "inflate() failed";
  - a shard cut inside a record: "truncated record at <offset>" after the good records;
  - a shard cut inside the 12-byte header of a record is NOT reported by TF (it stops silently), so counting
    also compares an uncompressed file's size with the framed size of the records read (16 bytes per record:
    8 length + 4 length CRC + 4 data CRC; TFRecord format, tensorflow/core/lib/io/record_writer.h);
  - a flipped byte in a record: "corrupted record at <offset>" (a CRC fails); in a GZIP stream: zlib's
    "inflate() failed with error -3: incorrect data check" (or "invalid ..."), raised before any record of the
    256 kB input buffer holding it is returned, so the good records are recounted on a decompressed copy.
"""
from __future__ import annotations

import dataclasses
import gzip
import os
import re
import struct
import tempfile
import zlib
from typing import Iterator, Optional, Sequence

import tensorflow as tf
from google.protobuf import message as pb_message
from google.protobuf import unknown_fields

from harness.data.export.shards import (GZIP, NONE, RECORD_HEADER_BYTES, Shard, check_compression, is_record_header,
                                        read_buffer_bytes, read_head, sniff_compression)
from harness.choices import DTYPES
from harness.errors import (CompressionMismatchError, CorruptShardError, HarnessError, NotExampleError,
                            NotTFRecordError, TruncatedShardError)

FRAMING_BYTES = 16  # per record: uint64 length, uint32 masked CRC of the length, uint32 masked CRC of the data

FLOAT, INT64, BYTES = DTYPES
EMPTY = "empty"  # a feature present with no kind set (TFX writes these for missing values)
_KIND_TO_DTYPE = {"float_list": FLOAT, "int64_list": INT64, "bytes_list": BYTES, None: EMPTY}
_CORRUPT_RECORD = re.compile(r"corrupted record at \d+")
_CORRUPT_ZLIB = re.compile(r"incorrect data check|incorrect header check|invalid [a-z ]+")
_TF_NOISE = re.compile(r"\s*\[Op:\w+\]( name:.*)?$|'\s*failed with (EOF reached|Read less bytes than requested)")


@dataclasses.dataclass(frozen=True)
class FeatureInfo:
    """What one record holds under one key: dtype ("float", "int64", "bytes" or "empty") and value count.

    For bytes features `length` is the number of byte strings and `nbytes` the length of the first one (a uint8
    band stored as raw bytes is one string of H*W bytes).
    """

    dtype: str
    length: int
    nbytes: int = 0
    sequence: bool = False  # a SequenceExample's feature list: `length` steps, `nbytes` the most values in a step


def dataset(shard: Shard, *, buffer_size: Optional[int] = None) -> tf.data.TFRecordDataset:
    """The raw serialized records of one shard, read with its compression and `buffer_size` bytes of read buffer
    (default `shards.read_buffer_bytes`: 4 MiB local, 16 MiB for a gs:// object)."""
    return tf.data.TFRecordDataset(shard.path, compression_type=shard.compression,
                                   buffer_size=buffer_size or read_buffer_bytes(shard.path))


def data_loss_error(shard: Shard, good: int, err: Exception) -> HarnessError:
    """The named error for a DataLossError met after `good` readable records of `shard`.

    Returns:
      CompressionMismatchError when the declared compression disagrees with the bytes; CorruptShardError for a
      failed record CRC or a corrupt GZIP stream (the good records recounted exactly); NotTFRecordError when
      record 0 is unreadable and the file does not start with a record header; else TruncatedShardError.
    """
    try:
        check_compression(shard)
    except CompressionMismatchError as mismatch:
        return mismatch
    detail = clean_detail(err)
    zlib_corrupt = shard.compression == GZIP and _CORRUPT_ZLIB.search(detail)
    if zlib_corrupt or (_CORRUPT_RECORD.search(detail) and (good > 0 or _starts_with_record(shard))):
        good = max(good, _good_records(shard))
        last = f"last good record index {good - 1}" if good else "no good record"
        return CorruptShardError(f"{shard.path}: corrupt record after {good} good records ({last}): {detail}")
    if good == 0 and "truncated" not in detail:
        return NotTFRecordError(f"{shard.path}: not a TFRecord file (record 0 unreadable: {detail})")
    last = f"last good record index {good - 1}" if good else "no complete record"
    return TruncatedShardError(f"{shard.path}: shard truncated after {good} records ({last}): {detail}")


def clean_detail(err: Exception) -> str:
    """The first line of a TensorFlow error without its op prefix and suffix (`{{function_node ...}}`,
    `[Op:ReduceDataset] name:`, `' failed with EOF reached`)."""
    text = str(err).strip()
    if not text:
        return type(err).__name__
    detail = text.splitlines()[0].split("}}")[-1]
    return _TF_NOISE.sub("", detail).strip() or type(err).__name__


def _starts_with_record(shard: Shard) -> bool:
    """True when the (decompressed) file starts with a valid record header: a TFRecord file, whatever follows."""
    with tf.io.gfile.GFile(shard.path, "rb") as f:
        try:
            head = (gzip.GzipFile(fileobj=f).read(RECORD_HEADER_BYTES) if shard.compression == GZIP
                    else f.read(RECORD_HEADER_BYTES))
        except (OSError, EOFError, zlib.error):
            return False
    return is_record_header(head)


def _good_records(shard: Shard) -> int:
    """Records readable before the first error. A GZIP shard is decompressed (up to the zlib error) into a temporary
    uncompressed copy first: TensorFlow inflates 256 kB at a time and returns no record of a failing block."""
    if shard.compression != GZIP:
        return count_until_error(shard.path, NONE)
    with tempfile.TemporaryDirectory(prefix="harness-corrupt-") as tmp:
        copy = os.path.join(tmp, "records")
        with tf.io.gfile.GFile(shard.path, "rb") as src, open(copy, "wb") as dst:
            _inflate_until_error(src, dst)
        return count_until_error(copy, NONE)


def _inflate_until_error(src, dst) -> None:
    """Write the GZIP stream `src` decompressed to `dst`, up to the 256-byte piece where zlib fails (a failing call
    returns nothing, so the failing 1 MiB chunk is fed again in small pieces)."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    for chunk in iter(lambda: src.read(1 << 20), b""):
        saved = inflate.copy()
        try:
            dst.write(inflate.decompress(chunk))
        except zlib.error:
            inflate = saved
            try:
                for i in range(0, len(chunk), 256):
                    dst.write(inflate.decompress(chunk[i:i + 256]))
            except zlib.error:
                return


def count_until_error(path: str, compression: str) -> int:
    """Records of the file readable before its first DataLossError (all of them when there is none), read one by
    one: the good records before a truncation or a failed CRC (`compression`: "GZIP" or "")."""
    good = 0
    try:
        for _ in tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=read_buffer_bytes(path)):
            good += 1
    except tf.errors.DataLossError:
        pass
    return good


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
    """The first `n` serialized records of `shard` (fewer if it holds fewer; [] for a zero-record shard), read with
    its compression in one TensorFlow read (one request on gs:// for records within its 16 MiB buffer): the
    compression is not sniffed first; a read that fails is traced to its named error (`data_loss_error`, which
    sniffs it then).

    Raises:
      CompressionMismatchError: if the shard's declared compression disagrees with its bytes.
      NotTFRecordError: if the first record is not TFRecord framing, or the file has bytes but no record.
      TruncatedShardError: if the shard ends inside one of the first `n` records.
      CorruptShardError: if a CRC fails, or the GZIP stream is corrupt, in the first `n` records.
    """
    out: list[bytes] = []
    if n < 1:
        check_compression(shard)
        return out  # nothing asked for: nothing to read, and no record missing
    try:
        for r in dataset(shard).take(n):
            out.append(r.numpy())
    except tf.errors.DataLossError as e:
        raise data_loss_error(shard, len(out), e) from None
    if not out and has_payload(shard):
        check_compression(shard)
        raise NotTFRecordError(f"{shard.path}: not a TFRecord file (it has bytes but no complete record)")
    return out


HEAD_READERS = 16            # shards whose first record is read at once (`first_records`)
HEAD_READ_BYTES = 1 << 18    # a file's first read for its record 0: 256 KiB, one request on gs://
_BAD = object()              # `_first_record`: the framing or the GZIP stream is bad (TensorFlow names it)
_TOO_LONG = 1 << 31          # a record length no protobuf reaches (2 GiB): a header claiming it is bad


def _first_record(shard: Shard):
    """Record 0 of `shard` from the start of the file: one read of its first HEAD_READ_BYTES (`read_head`: one
    request on gs://, whatever the count); a record longer than that is read again from the start, as many bytes as
    it needs: uncompressed exactly, GZIP at most what deflate can take for them (zlib's `deflateBound`: n + n/4096 +
    n/16384 + 13 bytes, bounded here by n + n/2048 + HEAD_READ_BYTES). So one more request, and about the record's
    size in memory.

    Returns:
      the record's bytes; None where the file ends before record 0 is whole (empty, or cut); `_BAD` where the first
      12 bytes are no record header (or claim 2 GiB or more, beyond a protobuf) or the GZIP stream does not
      inflate. The record's data CRC is not checked: the shard was read whole through TensorFlow, which checks it,
      by the counting of this run or of the one that put its identity (path, size, mtime) in the record index.
    """
    want = HEAD_READ_BYTES
    while True:
        data = read_head(shard.path, want)
        whole = len(data) < want   # the file ends inside what was read
        try:
            if shard.compression == GZIP:
                inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                head = inflate.decompress(data, RECORD_HEADER_BYTES)
                length = struct.unpack("<Q", head[:8])[0] if is_record_header(head) else None
                body = inflate.decompress(inflate.unconsumed_tail, length) if length and length < _TOO_LONG else b""
                whole = whole or inflate.eof
            else:
                head = data[:RECORD_HEADER_BYTES]
                length = struct.unpack("<Q", head[:8])[0] if is_record_header(head) else None
                body = data[RECORD_HEADER_BYTES:RECORD_HEADER_BYTES + (length or 0)]
        except zlib.error:
            return _BAD
        if len(head) == RECORD_HEADER_BYTES and (length is None or length >= _TOO_LONG):
            return _BAD
        if length is not None and len(body) == length:
            return body
        if whole:
            return None
        need = RECORD_HEADER_BYTES + (length or 0)
        bound = need + (need // 2048 + HEAD_READ_BYTES if shard.compression == GZIP else 0)
        want = bound if length is not None and bound > want else 2 * want


def first_records(shards: Sequence[Shard]) -> Iterator[tuple[int, bytes]]:
    """`(i, serialized record 0 of shards[i])` for every shard whose record 0 is whole, in shard order: each from
    the start of its file (`_first_record`: one read of HEAD_READ_BYTES, one request on gs://, and one more for a
    longer record), HEAD_READERS files at once on threads (file reads only, no TensorFlow op: safe from several
    threads), at most HEAD_READERS records held whatever the number of shards. Measured (`python
    benchmarks/startup.py --shards 1000 --runs 2`, 2 shared cores, 3 interleaved runs): 1000 local GZIP shards of 4
    records, every shard's record 0 read and checked in 0.83-1.37 s, against 1.10-2.78 s through one tf.data
    pipeline (the reader before this one, whose 256 KiB buffer made one request per 256 KiB of a long record) and
    48.5 s with one `read_records` per shard (a dataset built and drained per shard: ~48 ms each).

    The shards are counted (`index.record_stats`): their framing and CRCs were checked as they were read whole.

    Raises:
      the errors of `read_records`, for a shard whose record header or GZIP stream is bad: read again through
      TensorFlow (`read_records`), from this thread, to name it.
    """
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    if not shards:
        return
    with ThreadPoolExecutor(min(HEAD_READERS, len(shards))) as pool:
        pending = deque()
        for i, shard in enumerate(shards):
            pending.append((i, shard, pool.submit(_first_record, shard)))
            if len(pending) == HEAD_READERS:
                yield from _done(*pending.popleft())
        while pending:
            yield from _done(*pending.popleft())


def _done(i: int, shard: Shard, future) -> Iterator[tuple[int, bytes]]:
    """`first_records`' yield of shard i once its read is done (a bad one named by `read_records`)."""
    record = future.result()
    if record is _BAD:
        record = next(iter(read_records(shard, 1)), None)   # raises the named error
    if record is not None:
        yield i, record


def _unknown(msg) -> bool:
    return len(unknown_fields.UnknownFieldSet(msg)) > 0


def _sequence_example(raw: bytes):
    """`raw` as a tf.train.SequenceExample (Earth Engine's sequenceData), or None when it is not one."""
    try:
        seq = tf.train.SequenceExample.FromString(raw)
    except pb_message.DecodeError:
        return None
    if _unknown(seq) or _unknown(seq.context) or _unknown(seq.feature_lists) or not seq.feature_lists.feature_list:
        return None
    return seq


def decode_example(raw: bytes, *, path: str, index: int, sequence: bool = True):
    """Parse one record as tf.train.Example (or, with `sequence`, tf.train.SequenceExample), refusing anything else.

    A SequenceExample parses as an Example without error (its `context` is field 1, like `features`), as do many
    other protobufs; they are told apart by the fields an Example does not have (wire-format unknown fields): a
    record with a SequenceExample's `feature_lists` is returned as one (Earth Engine's `sequenceData` export).

    Raises:
      NotExampleError: if the bytes are not a protobuf, or hold fields that tf.train.Example does not define.
    """
    try:
        ex = tf.train.Example.FromString(raw)
    except pb_message.DecodeError as e:
        raise NotExampleError(f"{path}: record {index} is not a tf.train.Example ({e})") from None
    what = None
    if _unknown(ex) and sequence:
        seq = _sequence_example(raw)
        if seq is not None:
            return seq
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


def features_of(ex) -> "tf.train.Features":
    """The features of an Example, or the context of a SequenceExample."""
    return ex.context if isinstance(ex, tf.train.SequenceExample) else ex.features


def _info(f: tf.train.Feature) -> FeatureInfo:
    kind = f.WhichOneof("kind")
    values = getattr(f, kind).value if kind else []
    nbytes = len(values[0]) if kind == "bytes_list" and len(values) else 0
    return FeatureInfo(_KIND_TO_DTYPE[kind], len(values), nbytes)


def schema_of(ex) -> dict[str, FeatureInfo]:
    """Feature name -> FeatureInfo for one Example, sorted by name (the order inside a record is arbitrary).

    For a SequenceExample: its context features, and each feature list as FeatureInfo(dtype of its steps, steps,
    nbytes = the most values in one step, sequence=True).
    """
    feats = features_of(ex).feature
    out = {key: _info(feats[key]) for key in feats}
    if isinstance(ex, tf.train.SequenceExample):
        for key, fl in ex.feature_lists.feature_list.items():
            steps = [_info(f) for f in fl.feature]
            dtype = next((i.dtype for i in steps if i.dtype != EMPTY), EMPTY)
            out[key] = FeatureInfo(dtype, len(steps), max((i.length for i in steps), default=0), sequence=True)
    return dict(sorted(out.items()))


def first_examples(shard: Shard, n: int) -> list[tf.train.Example]:
    """Decode the first `n` records of a shard (see read_records and decode_examples for the errors)."""
    return decode_examples(read_records(shard, n), shard.path)


def decode_examples(raw: Sequence[bytes], path: str) -> list:
    """`raw`, a file's first records in order, each decoded (`decode_example`).

    Raises:
      NotExampleError: a record is not an Example, or Examples and SequenceExamples are mixed (naming the first
        record of the other kind).
    """
    out = [decode_example(r, path=path, index=i) for i, r in enumerate(raw)]
    for i, ex in enumerate(out):
        if type(ex) is not type(out[0]):
            raise NotExampleError(f"{path}: record {i} is a tf.train.{type(ex).__name__}, unlike record 0 "
                                  f"(tf.train.{type(out[0]).__name__}): one export holds one kind of record")
    return out


__all__ = ["FeatureInfo", "FLOAT", "INT64", "BYTES", "EMPTY", "dataset", "read_records", "decode_example",
           "schema_of", "features_of", "first_examples", "decode_examples", "first_records", "data_loss_error",
           "has_payload", "sniff_compression"]
