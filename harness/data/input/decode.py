"""Serialized records -> what the model receives: `parse` (the stored features, by the spec), `stack_bands` (the
inputs as the spec delivers them), `label_of` (the stored label) and `decode` (both, the label checked against the
label rule and cast). One source of truth for training, predict and the SavedModel's serving signature."""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from harness.data.export.records import BYTES, INT64
from harness.data.spec.dataspec import IMAGE, TIME, DataSpec
from harness.data.spec.labels import LABEL_CHECK_MESSAGE, deliver, is_label_value


def feature_description(spec: DataSpec) -> dict:
    """`tf.io.parse_example` features for the spec: per stored feature a fixed-length list of planes x S*S values
    (image; an array band or collapsed bands hold several planes, CHW) or of its depth (table; a scalar when 1).
    For a sequence spec, the context's features (`sequence_description` gives the feature lists)."""
    out = {}
    for name in spec.features:
        dt = spec.dtype_of(name)
        if spec.sequence and spec.is_array(name):
            continue
        if dt == BYTES:
            out[name] = tf.io.FixedLenFeature([], tf.string)
            continue
        n = spec.values_of(name)
        shape = [n] if spec.kind == IMAGE or n > 1 else []
        out[name] = tf.io.FixedLenFeature(shape, tf.int64 if dt == INT64 else tf.float32)
    return out


def sequence_description(spec: DataSpec) -> dict:
    """`tf.io.parse_sequence_example` feature lists of a sequence spec: its array bands, one value per step."""
    return {name: tf.io.FixedLenSequenceFeature([], tf.int64 if spec.dtype_of(name) == INT64 else tf.float32,
                                                allow_missing=True)
            for name in spec.features if spec.sequence and spec.is_array(name)}


def parse(spec: DataSpec, serialized: tf.Tensor) -> dict:
    """Serialized records [N] -> stored feature -> its values [N, values] (a table's scalar: [N]).

    A sequence spec's feature lists arrive [N, steps], padded with 0 (Earth Engine's default value, as its
    tensorDepths pads) to the band's depth.

    Raises (when run):
      tf.errors.InvalidArgumentError: a record lacks a feature or holds another number of values (a feature list
        longer than its depth included).
    """
    if not spec.sequence:
        return tf.io.parse_example(serialized, feature_description(spec))
    context, lists, _ = tf.io.parse_sequence_example(serialized, context_features=feature_description(spec),
                                                     sequence_features=sequence_description(spec))
    for name, x in lists.items():
        depth = spec.feature_depth(name)
        check = tf.debugging.assert_less_equal(tf.shape(x)[1], depth, message=(
            f"Key: {name}. a feature list is longer than its depth {depth}"))
        with tf.control_dependencies([check]):
            x = tf.pad(x, [[0, 0], [0, depth - tf.shape(x)[1]]])
        context[name] = tf.ensure_shape(x, [None, depth])
    return context


def _feature(spec: DataSpec, name: str, value: tf.Tensor) -> tf.Tensor:
    """One parsed stored feature as float32 [N, planes, S*S] (image) or [N, planes] (table)."""
    if spec.dtype_of(name) == BYTES:
        value = tf.io.decode_raw(value, tf.uint8)
    value = tf.cast(value, tf.float32)
    if spec.kind == IMAGE:
        return tf.reshape(value, [-1, spec.feature_depth(name), spec.values_per_feature()])
    return value[:, None] if value.shape.rank == 1 else value


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


def _runs(spec: DataSpec, channels: Sequence[str]) -> list[list]:
    """Channels as runs [feature, first plane, end plane] of consecutive planes of one stored feature."""
    runs: list[list] = []
    for c in channels:
        feature, plane = spec.channel_source(c)
        if runs and runs[-1][0] == feature and runs[-1][2] == plane:
            runs[-1][2] += 1
        else:
            runs.append([feature, plane, plane + 1])
    return runs


def _stack(spec: DataSpec, parsed: dict, channels: Sequence[str]) -> tf.Tensor:
    """Channels -> channels-last float32 [N, H, W, C] or [N, C].

    Each run of consecutive planes of one stored feature is one slice of it ([N, planes, S*S], CHW as Earth Engine
    writes it); image planes are concatenated plane-major ([N, C, S*S]) and transposed: `tf.stack(axis=-1)` is a
    concat whose inner size is one value, copied value by value (1.5 ms against 0.6 ms per 256x256x8 record here).
    """
    parts = []
    for feature, a, b in _runs(spec, channels):
        x = _feature(spec, feature, parsed[feature])
        parts.append(x if (a, b) == (0, spec.feature_depth(feature)) else x[:, a:b])
    x = parts[0] if len(parts) == 1 else tf.concat(parts, axis=1)
    if spec.input_nodata is not None and spec.input_fill:   # nodata inputs delivered as the channel's mean
        fill = tf.constant([spec.input_fill.get(c, 0.0) for c in channels], tf.float32)
        x = tf.where(tf.equal(x, spec.input_nodata), fill[:, None] if spec.kind == IMAGE else fill, x)
    if spec.kind != IMAGE:
        return x  # [N, C]
    s = spec.stored_size
    x = tf.transpose(tf.reshape(x, [-1, len(channels), s, s]), [0, 2, 3, 1])
    return _spatial(spec, x, mask=False)


def stack_bands(spec: DataSpec, parsed: dict):
    """Per-feature tensors -> the model's inputs as the spec delivers them (one source of truth for training,
    predict and the SavedModel's serving signature).

    Args:
      parsed: stored feature name -> float [N, planes * S*S] (image, CHW: planes outermost, each row-major) or
        [N] / [N, depth] (table), as `parse` returns them (a bytes band: uint8 raw bytes, per `spec.dtypes`).
    Returns:
      float32 [N, H, W, C] or [N, C] (C = `spec.channels`: an array band of depth D gives D channels); with band
      groups, group_delivery "dict": {group: [N, H, W, Cg] or [N, Cg]} in the groups' order, "time": the groups
      stacked on axis 1, [N, T, H, W, Cg] or [N, T, Cg].
    """
    if not spec.band_groups:
        return _stack(spec, parsed, spec.channels)
    groups = {g: _stack(spec, parsed, c) for g, c in spec.band_groups.items()}
    return tf.stack(list(groups.values()), axis=1) if spec.group_delivery == TIME else groups


def label_of(spec: DataSpec, parsed: dict) -> tf.Tensor:
    """The label's stored values [N, S*S] (image) or [N] (table), as stored (float or int64): its own feature,
    or its plane of a collapsed feature."""
    feature, plane = spec.feature_of(spec.label)
    x = parsed[feature]
    if feature == spec.label:
        return x
    if spec.dtype_of(feature) == BYTES:
        x = tf.io.decode_raw(x, tf.uint8)
    return tf.reshape(x, [-1, spec.feature_depth(feature), spec.values_per_feature()])[:, plane]


def decode(spec: DataSpec, serialized: tf.Tensor):
    """Serialized Examples [N] -> (inputs, labels) per the spec (see build_dataset for shapes and dtypes).

    Raises (when the dataset is iterated):
      tf.errors.InvalidArgumentError: from `tf.io.parse_example` for a record that lacks a feature or holds
        another number of values; with LABEL_CHECK_MESSAGE for a classification label that is negative,
        fractional, NaN or >= spec.num_classes, or a regression label that is NaN or infinite (and not the
        ignore_label). harness.data.export.scan finds the file and record.
    """
    parsed = parse(spec, serialized)
    inputs = stack_bands(spec, parsed)
    if spec.label is None:
        return inputs
    label = label_of(spec, parsed)
    # Earth Engine stores class ids as floats (3.0): cast (GEE_FORMAT.md), after checking that every value keeps
    # the label rule (a class id, a finite regression value, or the nodata value; harness.data.spec.labels); a failing
    # batch is traced to its record by harness.data.export.scan.
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
