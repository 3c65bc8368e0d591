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

from harness import keras_kinds
from harness.errors import LossScaleError
from harness.train.model import precision
from loop_support import build
from overflow_support import overflow_layer

BATCH = 4


@pytest.fixture(params=keras_kinds.KINDS)
def mixed_float16(request):
    """The Keras kind of the test's model, its global policy mixed_float16 for the test."""
    kind = keras_kinds.module(request.param)
    kind.mixed_precision.set_global_policy("mixed_float16")
    yield request.param
    kind.mixed_precision.set_global_policy("float32")


def _run(kind, spike_every, steps, epochs=1, steps_per_loop=1):
    """Train a Dense(2) of Keras `kind` under mixed_float16 with dynamic loss scaling; every `spike_every`-th batch
    overflows."""
    keras = keras_kinds.module(kind)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        x_in, flag_in = keras.Input((3,)), keras.Input((1,))
        hidden = keras.layers.Dense(4, name="hidden")(x_in)
        out = keras.layers.Dense(2, name="head")(overflow_layer(keras)([hidden, flag_in]))
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
    before = np.array(model.get_layer("hidden").kernel)
    return run, model, opt, iter(strategy.experimental_distribute_dataset(ds)), before


@pytest.mark.parametrize("steps_per_loop", [1, 8])
def test_spikes_are_counted_per_epoch_and_halve_the_scale(mixed_float16, steps_per_loop):
    run, model, opt, batches, _ = _run(mixed_float16, spike_every=8, steps=32, epochs=2, steps_per_loop=steps_per_loop)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        history = run.fit(batches)
    assert [h["skipped_updates"] for h in history] == [2, 2]        # steps 8, 16 | 24, 32
    assert history[-1]["loss_scale"] == 2 ** 15 / 2 ** 4             # halved once per skipped update
    assert run.controller.steps_run == 32 and run.controller.updates_skipped == 4
    assert int(np.asarray(opt.iterations)) == 32                     # a skipped update is a step, in both kinds
    assert "2 updates skipped, loss scale 2048" in printed.getvalue()


def test_overflow_every_step_stops_with_a_named_error(mixed_float16):
    run, model, opt, batches, before = _run(mixed_float16, spike_every=1, steps=64)
    # tf-keras: 32768 halves to its floor 1 in 15 skipped steps, no lower scale is left to try, and 15 >= 10 were
    # skipped. Keras 3 halves on: the harness stops it at float16's smallest normal, 2**-14, after 29.
    floor, steps = ("1", 15) if mixed_float16 == keras_kinds.TF_KERAS else ("6.10352e-05", 29)
    with pytest.raises(LossScaleError, match=rf"floor {floor}, at step {steps} .*: 0 of {steps} steps run applied"):
        with contextlib.redirect_stdout(io.StringIO()):
            run.fit(batches)
    assert run.trainer.loss_scale() == keras_kinds.LOSS_SCALE_FLOOR[mixed_float16]
    np.testing.assert_array_equal(np.array(model.get_layer("hidden").kernel), before)


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
