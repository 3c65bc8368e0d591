"""Find the record a parse failure came from: file, record index and feature.

`validate.validate_spec` checks the first record of every shard before training; a record further in that lacks a
feature or holds another number of values fails inside `tf.io.parse_example`, whose message names neither the
file nor the record. After such a failure, `first_bad_record` reads the shards again, one vectorized parse per
read batch (as fast as the input pipeline), and decodes only the failing batch record by record to name it.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import tensorflow as tf

from harness.data.export import records
from harness.data.export.shards import Shard
from harness.data.spec.labels import is_label_value, label_rule_error
from harness.data.spec.dataspec import DataSpec
from harness.data.spec.validate import check_feature
from harness.errors import LabelValueError, SpecMismatchError

log = logging.getLogger(__name__)

SCAN_BATCH = 1024  # records per vectorized parse while scanning


def first_bad_record(spec: DataSpec, shards: Sequence[Shard]) -> Optional[SpecMismatchError]:
    """The first record of `shards` (in order) that disagrees with `spec`, as the named error, or None.

    Reads every record of every shard until the first mismatch (a full read of the data in the worst case:
    use it after a failure, not before training).

    Returns:
      MissingFeatureError, FeatureDtypeError, FeatureLengthError or EmptyFeatureError (validate.check_feature) whose
      message starts "<path>: record <index>", or None when every record matches.

    Raises:
      the framing errors of records.read_records / records.decode_example (truncated shard, not an Example).
    """
    from harness.data.input.decode import parse

    for shard in shards:
        start = 0
        batches = records.dataset(shard).batch(SCAN_BATCH)
        try:
            for batch in batches:
                try:
                    parse(spec, batch)
                except tf.errors.InvalidArgumentError:
                    error = _name_in_batch(spec, shard, batch.numpy(), start)
                    if error is not None:
                        return error
                start += int(batch.shape[0])
        except tf.errors.DataLossError as e:
            raise records.data_loss_error(shard, start, e) from None
    return None


def _name_in_batch(spec: DataSpec, shard: Shard, batch, start: int) -> Optional[SpecMismatchError]:
    for offset, raw in enumerate(batch):
        index = start + offset
        schema = records.schema_of(records.decode_example(raw, path=shard.path, index=index))
        for name in spec.features:
            error = check_feature(spec, name, schema, f"{shard.path}: record {index}")
            if error is not None:
                return error
    log.warning("%s: records %d-%d fail tf.io.parse_example but match the spec record by record", shard.path,
                start, start + len(batch) - 1)
    return None


def first_bad_label(spec: DataSpec, shards: Sequence[Shard], num_classes: Optional[int]):
    """The first record of `shards` (in order) whose label breaks the label rule (`harness.data.spec.labels`): for
    classification not a class id in [0, num_classes): negative, fractional, NaN or infinite, or >= num_classes
    (not checked when None); for regression NaN or infinite. The spec's ignore_label passes.

    Reads the label feature only, one vectorized parse per read batch of SCAN_BATCH records.

    Returns:
      `(path, record index, value)` of the first offending pixel's record (value: float), or None.
    """
    import numpy as np

    from harness.data.input.decode import label_of, parse

    only = spec.replace(bands=(spec.label,), label=None, band_groups={}, group_delivery="dict")  # its feature
    only = spec if spec.feature_of(spec.label)[0] != spec.label else only
    for shard in shards:
        start = 0
        for batch in records.dataset(shard).batch(SCAN_BATCH):
            labels = label_of(spec, parse(only, batch)).numpy().astype(np.float64)
            labels = labels.reshape(labels.shape[0], -1)  # [records, values per record]
            bad = ~is_label_value(labels, spec.task, num_classes, spec.ignore_label).numpy()
            rows = np.flatnonzero(bad.any(axis=1))
            if rows.size:
                row = int(rows[0])
                return shard.path, start + row, float(labels[row][bad[row]][0])
            start += int(batch.shape[0])
    return None


def bad_label_error(spec: DataSpec, shards: Sequence[Shard], num_classes: Optional[int]) -> Optional[LabelValueError]:
    """first_bad_label as the error to raise, or None when every label keeps the rule.

    The message names file, record and value; an integer at or above `num_classes` asks for --num-classes, any
    other value (negative, fractional, NaN) says class ids are integers >= 0.
    """
    found = first_bad_label(spec, shards, num_classes)
    if found is None:
        return None
    path, index, value = found
    return label_rule_error(f"{path}: record {index}", spec.label, value, spec.task, num_classes)


def first_unreadable(shards: Sequence[Shard]):
    """The framing error of the first shard (in order) that TensorFlow cannot read to its end, or None.

    For a DataLossError met after the counts (a network or FUSE mount returning a bad block once training began:
    tensorflow/tensorflow#36802): read batch by batch as fast as the pipeline reads, the good records recounted
    one by one in the failing shard.

    Returns:
      CorruptShardError, TruncatedShardError, CompressionMismatchError or NotTFRecordError
      (`records.data_loss_error`: file and record index), or None when every shard reads to its end.
    """
    for shard in shards:
        try:
            for _ in records.dataset(shard).batch(SCAN_BATCH):
                pass
        except tf.errors.DataLossError as e:
            good = records.count_until_error(shard.path, shard.compression or "")
            return records.data_loss_error(shard, good, e)
    return None


def named_error(error: Exception, spec: DataSpec, num_classes: Optional[int],
                shards: Sequence[Shard] = ()) -> Exception:
    """A named error for a TensorFlow error whose cause the harness knows; else `error` itself.

    A DataLossError (a record unreadable after the counts) is traced to its file and record (first_unreadable);
    a failed class-id check (harness.data.spec.labels) or a sparse cross-entropy label out of range is traced to its
    file, record and value (bad_label_error); a parse failure (a record after the first of its shard lacks a
    feature or holds another number of values) to its file, record and feature (first_bad_record), by scanning
    `shards` in order.

    Returns:
      a framing error (CorruptShardError, ...), LabelValueError, a SpecMismatchError subclass, or `error`
      unchanged.
    """
    import re

    from harness.data.spec.labels import LABEL_CHECK_MESSAGE
    from harness.errors import MissingFeatureError

    if isinstance(error, tf.errors.DataLossError):
        found = first_unreadable(shards) if shards else None
        return found if found is not None else error
    text = str(error)
    m = re.search(r"Received a label value of (-?\d+) which is outside the valid range of \[0, (\d+)\)", text)
    if m or LABEL_CHECK_MESSAGE in text:
        named = bad_label_error(spec, shards, num_classes or None) if shards else None
        if named is not None:
            return named
        if m:
            return LabelValueError(f"label {spec.label!r}: value {m.group(1)} is outside the {num_classes} classes "
                                   f"[0, {num_classes})")
        if spec.task != "classification":
            return LabelValueError(f"label {spec.label!r}: a value is NaN or infinite (regression labels must be "
                                   "finite; give a nodata value as ignore_label)")
        return LabelValueError(f"label {spec.label!r}: a value is not a class id (an integer >= 0"
                               + (f" and < {num_classes})" if num_classes else ")"))
    if re.search(r"Feature: \S+ \(data type: \w+\) is required|Key: \S+[.,]|Can't parse serialized", text) and shards:
        found = first_bad_record(spec, shards)
        if found is not None:
            return found
    m = re.search(r"Feature: (\S+) \(data type: (\w+)\) is required but could not be found", text)
    if m:
        return MissingFeatureError(f"feature {m.group(1)!r} ({m.group(2)}) is missing from a record after the "
                                   "first of its shard (the spec was checked against each shard's first record)")
    return error
