"""A tf-keras pixel classifier whose every training step sleeps HARNESS_TEST_STEP_SLEEP_S seconds (a step of an
hour-long epoch, in little CPU): tests/train/report/test_progress.py reads the progress lines it leaves in a log.

    --model tests/train/scripts/slow_step_model.py:build
"""
import os
import time

import numpy as np
import tensorflow as tf
import tf_keras as keras


def _sleep(x):
    time.sleep(float(os.environ.get("HARNESS_TEST_STEP_SLEEP_S", "0")))
    return x


@keras.utils.register_keras_serializable(package="harness_tests")
class SleepWhenTraining(keras.layers.Layer):
    """Identity; sleeps once per training call (inference does not)."""

    def call(self, x, training=None):
        if training:
            return tf.numpy_function(lambda v: _sleep(v).astype(np.float32), [x], tf.float32, stateful=True) \
                + 0 * x
        return x


def build(inputs):
    x = keras.Input(inputs.input_shape)
    y = keras.layers.Dense(inputs.num_classes)(SleepWhenTraining()(x))
    return keras.Model(x, y)
