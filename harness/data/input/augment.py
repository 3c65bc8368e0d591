"""Training batches augmented: random flips and 90-degree rotations of inputs and mask together
(`augment_batch`), random brightness and contrast of the inputs (`color_jitter`)."""
from __future__ import annotations

import tensorflow as tf

from harness.data.spec.dataspec import TIME, DataSpec


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
