"""A tf-keras model slow where a rank's epoch end is slow, on one rank only (HARNESS_TEST_SLOW_RANK, matched
against OMPI_COMM_WORLD_RANK / HOROVOD_RANK), at the first epoch's end only: its first HARNESS_TEST_SLOW_BATCHES
inferences sleep HARNESS_TEST_EVAL_SLEEP_S seconds each (a rank that spends longer in the validation pass), and
its first save after them (the layer's `get_config`) sleeps HARNESS_TEST_SAVE_SLEEP_S seconds (the chief writing
a large best model to a bucket). Its training steps are not slowed. Used by
tests/distribute/test_horovod_backend.py (Horovod's stall inspector at an epoch's end, in mixed_float16).

    --model tests/distribute/scripts/slow_eval_model.py:build
"""
import os
import time

import tensorflow as tf
import tf_keras as keras


def _slow_batches() -> int:
    return int(os.environ.get("HARNESS_TEST_SLOW_BATCHES", "0"))


_calls = {"HARNESS_TEST_EVAL_SLEEP_S": 0, "HARNESS_TEST_SAVE_SLEEP_S": 0}


def _sleep(name: str, first: int) -> float:
    """Sleep `name`'s seconds on the slow rank for its first `first` calls (a save's: once the inferences slept)."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK"))
    if name == "HARNESS_TEST_SAVE_SLEEP_S" and _calls["HARNESS_TEST_EVAL_SLEEP_S"] < _slow_batches():
        return 0.0   # get_config before the evaluation (the run inspects the model): not the epoch end's save
    _calls[name] += 1
    if rank == os.environ.get("HARNESS_TEST_SLOW_RANK", "0") and _calls[name] <= first:
        time.sleep(float(os.environ.get(name, "0")))
    return 0.0


@keras.utils.register_keras_serializable(package="harness_tests")
class SlowAtEpochEnd(keras.layers.Layer):
    """Identity; at inference (`training=False`) sleeps first, and `get_config` (a save) sleeps."""

    def call(self, x, training=None):
        if training:
            return x
        slept = tf.py_function(lambda: _sleep("HARNESS_TEST_EVAL_SLEEP_S", _slow_batches()), [], tf.float32)
        with tf.control_dependencies([slept]):
            return tf.identity(x)

    def get_config(self):
        _sleep("HARNESS_TEST_SAVE_SLEEP_S", 1)
        return super().get_config()


def build(inputs):
    """A 1x1 convolution per pixel of `[batch, H, W, bands]` float32 to `[batch, H, W, classes]` float32 logits,
    computed in the global policy's dtype (float16 under mixed_float16)."""
    x = image = keras.Input(inputs.input_shape)
    x = SlowAtEpochEnd()(x)
    x = keras.layers.Conv2D(inputs.num_classes, 1)(x)
    logits = keras.layers.Activation("linear", dtype="float32")(x)
    return keras.Model(image, logits)
