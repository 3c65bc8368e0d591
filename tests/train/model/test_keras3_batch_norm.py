"""Keras 3's BatchNormalization on the fused kernel (harness.train.model.keras3_batch_norm) computes what Keras 3's
own call computes: outputs, gradients and moving statistics of one training step, under float32 and mixed_float16,
and a layer it cannot match is left alone."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from harness.train.model import keras3_batch_norm


def _model(seed, **bn):
    """The same initial weights for a seed (each initializer seeded: no global seed, which this process's other
    tests' tf.data pipelines would then see)."""
    init = keras.initializers.GlorotUniform(seed=seed)
    i = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(6, 3, padding="same", kernel_initializer=init)(i)
    x = keras.layers.BatchNormalization(**bn)(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.BatchNormalization(center=False, momentum=0.9)(x)
    return keras.Model(i, keras.layers.Conv2D(2, 1, dtype="float32", kernel_initializer=init)(x))


def _step(model, x):
    with tf.GradientTape() as tape:
        y = model(x, training=True)
        loss = tf.reduce_mean(tf.square(tf.cast(y, tf.float32) - 0.5))
    return y, tape.gradient(loss, [v.value for v in model.trainable_variables])


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_one_training_step_equals_keras3s_own(policy):
    keras.mixed_precision.set_global_policy(policy)
    try:
        own, fused = _model(1), _model(1)
        assert keras3_batch_norm.fuse(fused) == 2 and keras3_batch_norm.fuse(fused) == 0   # once
        x = tf.random.stateless_normal([4, 8, 8, 3], seed=[1, 2]) * 3 + 1
        (y1, g1), (y2, g2) = _step(own, x), _step(fused, x)
        tol = 1e-5 if policy == "float32" else 2e-3
        np.testing.assert_allclose(np.asarray(y1, np.float32), np.asarray(y2, np.float32), atol=tol)
        for a, b in zip(g1, g2):
            np.testing.assert_allclose(a, b, atol=tol * max(1.0, float(np.abs(a).max())))
        for a, b in zip(own.non_trainable_variables, fused.non_trainable_variables):   # moving mean, variance
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(own(x, training=False), np.float32),
                                   np.asarray(fused(x, training=False), np.float32), atol=tol)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_layers_the_kernel_cannot_match_keep_keras3s_call():
    assert keras3_batch_norm.fuse(_model(2, renorm=True)) == 1          # the second layer only
    assert keras3_batch_norm.fuse(_model(2, epsilon=1e-6)) == 1
    i = keras.Input((5, 3))
    table = keras.Model(i, keras.layers.BatchNormalization()(keras.layers.Dense(4)(i)))
    assert keras3_batch_norm.fuse(table) == 0                           # 3-D inputs: not the NHWC kernel's
