"""A training run with injected delays: input d per batch, compute c per step, profiled by a ProfileSession."""
import time

import pytest
import tensorflow as tf
import tf_keras as keras

from harness.distribute.context import WorkerContext
from harness.profile.session import ProfileSession
from loop_support import build

BATCH, STEPS, WARMUP = 8, 20, 8  # warm-up: tracing, and draining the batches prefetched meanwhile


def _sleep(seconds):
    def fn():
        time.sleep(seconds)
        return 0.0
    return tf.ensure_shape(tf.py_function(fn, [], tf.float32), [])


class SleepLayer(keras.layers.Layer):
    """Identity that takes `seconds` of wall time per call: the injected compute."""

    def __init__(self, seconds, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def call(self, x):
        return x + 0.0 * tf.stop_gradient(_sleep(self.seconds))


def _delayed_batches(delay_s):
    """Batches that each take `delay_s` to produce, one at a time, prefetched three ahead."""
    def make(_):
        x = tf.zeros([BATCH, 4]) + _sleep(delay_s)
        return x, tf.zeros([BATCH], tf.int32)
    return tf.data.Dataset.range(10 ** 6).map(make).prefetch(3)


def run_delayed(d, c, output, *, trace_steps=None, plot=False, steps_per_loop=1):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    context = WorkerContext.single()
    with strategy.scope():
        model = keras.Sequential([keras.Input([4]), SleepLayer(c), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.01)
    session = ProfileSession(context=context, strategy=strategy, output=str(output), warmup_steps=WARMUP,
                             interval_s=0.05, trace_steps=trace_steps)
    trainer = build(strategy, model, optimizer, global_batch_size=BATCH, steps_per_epoch=STEPS + WARMUP,
                    warmup_steps=WARMUP, steps_per_loop=steps_per_loop, context=context,
                    **session.controller_kwargs())
    with session:
        trainer.fit(iter(strategy.experimental_distribute_dataset(_delayed_batches(d))))
    return session, session.finish(kind="test", config={"d": d, "c": c}, plot=plot)


@pytest.fixture
def delayed_run():
    """`run(d, c, output, trace_steps=None, plot=False, steps_per_loop=1) -> (session, report)`."""
    return run_delayed
