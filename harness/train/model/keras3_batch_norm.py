"""Keras 3's BatchNormalization on TensorFlow's fused kernel while training, as tf-keras runs it.

On the TensorFlow backend Keras 3 normalizes with `tf.nn.moments` and `tf.nn.batch_normalization`
(keras/src/backend/tensorflow/nn.py; keras-team/keras-core#225 "BatchNorm is slow"), where tf-keras runs one
`FusedBatchNormV3` per layer (tf_keras/src/layers/normalization/batch_normalization.py, `_fused_batch_norm`).
Measured in issue 43 on the built-in U-Net (a bare tf.function step, 16 patches of 64x64x8, CPU): 79 ms for Keras 3
against 68 ms for tf-keras with BatchNormalization, 58 ms against 58 without.

`fuse(model)` gives each plain Keras 3 BatchNormalization layer of a model a training call on
`tf.compat.v1.nn.fused_batch_norm` that computes what Keras 3's own call computes: the batch mean and the biased
batch variance (the kernel returns the variance with Bessel's correction, n/(n-1), for its own running average: it
is undone), the same moving-average update of the layer's moving mean and variance, in float32 whatever the
policy (Keras 3 upcasts too), the output cast back to the layer's compute dtype. Layers it cannot match exactly are
left as they are: a mask, `renorm`, `synchronized`, inputs other than 4-D with the channels last, epsilon below the
kernel's minimum (1.001e-5). Inference (training=False) keeps Keras 3's call. Nothing is saved differently: the
layer's class and config are Keras 3's.
"""
from __future__ import annotations

import logging
import types

import tensorflow as tf

log = logging.getLogger(__name__)

# tf.compat.v1.nn.fused_batch_norm raises epsilon to at least this (cuDNN's CUDNN_BN_MIN_EPSILON, tensorflow's
# nn_impl.py): a layer asking for less is left on Keras 3's own call.
MIN_EPSILON = 1.001e-5


def _fusable(layer) -> bool:
    axis = layer.axis if isinstance(layer.axis, int) else (layer.axis[0] if len(layer.axis) == 1 else None)
    spec = getattr(layer, "input_spec", None)   # set by the layer's build: InputSpec(ndim=rank of its input)
    rank = spec.ndim if spec is not None else None
    return (not layer.renorm and not layer.synchronized and layer.epsilon >= MIN_EPSILON and rank == 4
            and axis in (3, -1))


def _fused_call(self, inputs, training=None, mask=None):
    if mask is not None or not (training and self.trainable):
        return self._keras3_call(inputs, training=training, mask=mask)
    x = tf.cast(inputs, tf.float32)
    channels = tf.shape(x)[-1]
    scale = tf.cast(self.gamma.value, tf.float32) if self.scale else tf.ones([channels], tf.float32)
    offset = tf.cast(self.beta.value, tf.float32) if self.center else tf.zeros([channels], tf.float32)
    y, mean, corrected = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, epsilon=self.epsilon,
                                                          data_format="NHWC", is_training=True)
    n = tf.cast(tf.size(x) // channels, tf.float32)
    variance = corrected * ((n - 1.0) / tf.maximum(n, 1.0))   # Keras 3's moments: the biased variance
    momentum = self.momentum
    moving_mean = tf.cast(self.moving_mean.value, tf.float32)
    moving_variance = tf.cast(self.moving_variance.value, tf.float32)
    self.moving_mean.assign(moving_mean * momentum + mean * (1.0 - momentum))
    self.moving_variance.assign(moving_variance * momentum + variance * (1.0 - momentum))
    return tf.cast(y, self.compute_dtype)


def fuse(model) -> int:
    """Put every fusable Keras 3 BatchNormalization layer of `model` (nested models included) on the fused kernel
    for its training calls; returns how many. A built model only (the layers know their input rank)."""
    import keras

    count = 0
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if type(layer) is keras.layers.BatchNormalization and layer.built and _fusable(layer) \
                and not hasattr(layer, "_keras3_call"):
            object.__setattr__(layer, "_keras3_call", layer.call)
            object.__setattr__(layer, "call", types.MethodType(_fused_call, layer))
            count += 1
    if count:
        log.info("Keras 3 BatchNormalization: %d layer(s) trained on TensorFlow's fused kernel (as tf-keras does; "
                 "Keras 3's own numbers)", count)
    return count
