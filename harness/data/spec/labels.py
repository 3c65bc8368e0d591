"""The label rule, in one place: a classification label value is a class id when it is a finite integer >= 0,
and below `num_classes` when the number of classes is known; a regression label value is finite (a NaN or inf
target makes the loss NaN at some later step, far from the record that holds it).

Earth Engine stores class ids as floats (3.0; `docs/GEE_FORMAT.md`), so the rule is checked on the float
values before they are cast to int32. The input pipeline applies it to every batch (`harness.data.input.pipeline`), the
job to the first records of every shard before training (`check_first_labels`), and the scan that names a failing
record applies it again (`harness.data.export.scan.first_bad_label`): the same function each time.

A declared `ignore_label` (nodata) is not a class id but passes the rule; the pipeline delivers it as `IGNORED`
(classification) or NaN (regression) — one value whatever the export wrote — and the loss and the metrics leave
those pixels out (`valid`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from harness.errors import LabelValueError

# The assertion a batch with a label that breaks the rule fails with (see harness.data.input.decode.decode).
LABEL_CHECK_MESSAGE = "harness: labels must be class ids in [0, num_classes) (classification) or finite (regression)"
IGNORED = -1  # an ignored (nodata) classification label as delivered by the pipeline, int32


def valid(labels) -> tf.Tensor:
    """Elementwise bool: is each delivered label a target (not nodata)? Class ids: `>= 0` (`IGNORED` is -1);
    regression values: finite (nodata is NaN)."""
    labels = tf.convert_to_tensor(labels)
    return tf.math.is_finite(labels) if labels.dtype.is_floating else labels >= 0


def deliver(values, task: str, ignore_label=None) -> tf.Tensor:
    """Stored label values (float or int64, already checked) as the pipeline delivers them: int32 class ids, or
    float32 regression values; values equal to `ignore_label` become `IGNORED` / NaN."""
    values = tf.convert_to_tensor(values)
    if task == "classification":
        out = tf.cast(values, tf.int32)
        if ignore_label is None:
            return out
        return tf.where(tf.equal(values, tf.cast(ignore_label, values.dtype)), IGNORED, out)
    out = tf.cast(values, tf.float32)
    if ignore_label is None:
        return out
    return tf.where(tf.equal(values, tf.cast(ignore_label, values.dtype)), float("nan"), out)


def is_class_id(values, num_classes: Optional[int] = None, ignore_label=None) -> tf.Tensor:
    """Elementwise: is each value a class id (or the declared nodata value)? Works in a `tf.function` and eagerly
    on numpy arrays.

    Args:
      values: label values of any shape, float or integer dtype (a numpy array or a tensor).
      num_classes: when given, values must also be < num_classes.
      ignore_label: a value that passes too (the spec's `ignore_label`), or None.
    Returns:
      bool tensor of the shape of `values`.
    """
    values = tf.convert_to_tensor(values)
    if values.dtype.is_floating:
        ok = tf.math.is_finite(values) & tf.equal(values, tf.round(values)) & (values >= 0)
    else:
        ok = values >= 0
    if num_classes:
        ok &= values < tf.cast(num_classes, values.dtype)
    if ignore_label is not None:
        ok |= tf.equal(values, tf.cast(ignore_label, values.dtype))
    return ok


def is_label_value(values, task: str, num_classes: Optional[int] = None, ignore_label=None) -> tf.Tensor:
    """Elementwise: does each value keep the rule of `task`? Classification: `is_class_id`; regression: finite,
    or the declared nodata value. Works in a `tf.function` and eagerly on numpy arrays.

    Args:
      values: label values of any shape, float or integer dtype.
      task: "classification" or "regression".
      num_classes: classification only: values must also be < num_classes when given.
      ignore_label: a value that passes too (the spec's `ignore_label`), or None.
    Returns:
      bool tensor of the shape of `values`.
    """
    if task == "classification":
        return is_class_id(values, num_classes, ignore_label)
    values = tf.convert_to_tensor(values)
    ok = tf.math.is_finite(values) if values.dtype.is_floating else tf.ones_like(values, dtype=tf.bool)
    if ignore_label is not None:
        ok |= tf.equal(values, tf.cast(ignore_label, values.dtype))
    return ok


def label_rule_error(where: str, label: str, value: float, task: str,
                    num_classes: Optional[int]) -> LabelValueError:
    """The error for a label `value` at `where` ("<path>: record <i>") that breaks the rule of `task`."""
    if task == "classification":
        return not_a_class_id_error(where, label, value, num_classes)
    return LabelValueError(f"{where}: label {label!r} holds {value!r}: regression labels must be finite (a nodata "
                           "value? give it as ignore_label, or mask it before export)")


def not_a_class_id_error(where: str, label: str, value: float, num_classes: Optional[int]) -> LabelValueError:
    """The error for a label `value` that breaks the rule, at `where` ("<path>: record <i>").

    An integer at or above `num_classes` asks for --num-classes; any other value (negative, fractional, NaN or
    infinite) says that class ids are integers >= 0."""
    text = f"{where}: label {label!r} holds {value!r}"
    if num_classes and bool(is_class_id(np.float64(value))):
        return LabelValueError(f"{text}, outside the {num_classes} classes [0, {num_classes}) taken from a sample; "
                               f"declare --num-classes {int(value) + 1} (or more)")
    return LabelValueError(f"{text}: class ids are integers >= 0 (a nodata value or a continuous band? mask it "
                           "before export, or give the right --label)")


def stored_label(spec, ex) -> np.ndarray:
    """The label's values in one decoded record (float64): its feature's float or int64 list, or its plane of a
    collapsed feature (planes outermost, as Earth Engine writes them)."""
    from harness.data.export.records import features_of

    feature, plane = spec.feature_of(spec.label)
    stored = features_of(ex).feature[feature]
    values = np.asarray(stored.float_list.value, np.float64)
    if not values.size:  # an int64 label
        values = np.asarray(stored.int64_list.value, np.float64)
    if feature != spec.label:
        values = values.reshape(spec.feature_depth(feature), -1)[plane]
    return values


def check_first_labels(spec, shards: Sequence, records: int = 16, *, read=None) -> None:
    """Check the labels of the first `records` records of the first non-empty shard and the first record of every
    other shard, before training (a continuous band given as --label, a negative nodata value).

    Records further in are checked by the pipeline's per-batch check, whose failure is traced by
    `harness.data.export.scan.first_bad_label`. `read`: `fn(shard, n) -> [tf.train.Example]` (`ShardSet.first_examples`:
    the records the spec inference and validation read, read once), default `records.first_examples`.

    Raises:
      LabelValueError: naming the shard, record and value (a class id rule or a non-finite regression value).
    """
    from harness.data.export.records import first_examples

    read = read or first_examples
    checked = 0
    for shard in shards:
        examples = read(shard, records if not checked else 1)[:records if not checked else 1]
        for i, ex in enumerate(examples):
            check_record(spec, f"{shard.path}: record {i}", ex)
        checked += len(examples)


def check_record(spec, where: str, ex) -> None:
    """Check the label of one decoded record (`ex`, at `where`: "<path>: record <i>") against the task's rule.

    Raises:
      LabelValueError: naming `where` and the first value that breaks the rule.
    """
    values = stored_label(spec, ex)
    bad = np.flatnonzero(~is_label_value(values, spec.task, None, spec.ignore_label).numpy())
    if bad.size:
        raise label_rule_error(where, spec.label, float(values[bad[0]]), spec.task, None)

