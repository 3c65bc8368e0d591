"""Updates skipped by loss scaling (mixed_float16) are counted per epoch and a run whose updates keep being skipped
at the loss scale's floor stops with a named error (issue 19, item 8). The gradients are made non-finite on
purpose by a layer whose custom gradient overflows float16 where the batch's second feature says so, while the
forward pass (and so the loss) stays finite."""
import io
import contextlib

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.errors import LossScaleError
from harness.train.model import precision
from loop_support import build

BATCH = 4


class Overflow(keras.layers.Layer):
    """Identity forward; backward multiplies the gradient by 1e30 (inf in float16) in rows whose `flag` input is 1."""

    def call(self, inputs):
        x, flag = inputs

        @tf.custom_gradient
        def blow_up(v):
            def grad(dy):
                big = tf.cast(tf.where(flag > 0.5, tf.constant(1e30, tf.float32), 1.0), dy.dtype)
                return dy * big
            return tf.identity(v), grad
        return blow_up(x)


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _run(spike_every, steps, epochs=1, steps_per_loop=1):
    """Train a Dense(2) under mixed_float16 with dynamic loss scaling; every `spike_every`-th batch overflows."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        x_in, flag_in = keras.Input((3,)), keras.Input((1,))
        hidden = keras.layers.Dense(4, name="hidden")(x_in)
        out = keras.layers.Dense(2, name="head")(Overflow()([hidden, flag_in]))
        model = keras.Model([x_in, flag_in], keras.layers.Activation("linear", dtype="float32")(out))
        opt = precision.wrap_optimizer(keras.optimizers.SGD(0.1), "mixed_float16")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * steps, 3)).astype(np.float32)
    flag = np.zeros((BATCH * steps, 1), np.float32)
    for step in range(spike_every - 1, steps, spike_every):
        flag[step * BATCH] = 1.0   # one row of the batch of that step
    y = (x[:, 0] > 0).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices(((x, flag), y)).batch(BATCH).repeat()
    run = build(strategy, model, opt, global_batch_size=BATCH, epochs=epochs, steps_per_epoch=steps // epochs,
                steps_per_loop=steps_per_loop)
    before = model.get_layer("hidden").kernel.numpy()
    return run, model, opt, iter(strategy.experimental_distribute_dataset(ds)), before


@pytest.mark.parametrize("steps_per_loop", [1, 8])
def test_spikes_are_counted_per_epoch_and_halve_the_scale(mixed_float16, steps_per_loop):
    run, model, opt, batches, _ = _run(spike_every=8, steps=32, epochs=2, steps_per_loop=steps_per_loop)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        history = run.fit(batches)
    assert [h["skipped_updates"] for h in history] == [2, 2]        # steps 8, 16 | 24, 32
    assert history[-1]["loss_scale"] == 2 ** 15 / 2 ** 4             # halved once per skipped update
    assert run.controller.steps_run == 32 and run.controller.updates_skipped == 4
    assert "2 updates skipped, loss scale 2048" in printed.getvalue()


def test_overflow_every_step_stops_with_a_named_error(mixed_float16):
    run, model, opt, batches, before = _run(spike_every=1, steps=64)
    with pytest.raises(LossScaleError, match=r"floor 1, at step 15 .*: 0 of 15 steps run applied an update"):
        with contextlib.redirect_stdout(io.StringIO()):
            run.fit(batches)
    # 32768 halves to the floor 1 in 15 skipped steps: no lower scale is left to try, and 15 >= 10 were skipped
    assert float(opt.loss_scale.numpy()) == 1.0
    np.testing.assert_array_equal(model.get_layer("hidden").kernel.numpy(), before)


def test_float32_reports_no_skipped_updates():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        opt = keras.optimizers.SGD(0.1)
    ds = tf.data.Dataset.from_tensors((tf.ones([BATCH, 3]), tf.zeros([BATCH], tf.int32))).repeat()
    run = build(strategy, model, opt, global_batch_size=BATCH, steps_per_epoch=4)
    with contextlib.redirect_stdout(io.StringIO()):
        (logs,) = run.fit(iter(strategy.experimental_distribute_dataset(ds)))
    assert "skipped_updates" not in logs and run.controller.updates_skipped == 0
