"""A float16 overflow in exactly one replica's (worker's, rank's) share of the batch, for either Keras kind: the model,
the batches and the two steps that tests/train/loop/test_keras_kinds.py runs in-process on 2 MirroredStrategy
replicas and tests/train/scripts/overflow_step.py runs on 2 MultiWorkerMirroredStrategy workers and 2 Horovod ranks.

The model: Dense(4) -> `overflow` (identity forward; its gradient times 1e30, inf in float16, in the rows whose flag
input is 1) -> Dense(2) -> float32 logits, under mixed_float16 with dynamic loss scaling from 2**15 and SGD(0.1).
Step 1 flags one row of the last replica's share; step 2 flags none. Every replica must skip step 1 (loss scale
halved to 2**14, weights untouched) and apply step 2, with finite weights equal everywhere.
"""
import hashlib

import numpy as np
import tensorflow as tf

from harness import keras_kinds
from harness.train.loop import factory
from harness.train.loop.controller import Schedule
from harness.train.model import precision

GLOBAL_BATCH = 8
INITIAL_SCALE = 2.0 ** 15


def overflow_layer(keras, name: str = "overflow"):
    """A layer of the Keras module `keras` taking `[x, flag]`: identity forward; backward multiplies the gradient by
    1e30 (inf in float16) in the rows whose `flag` is 1."""

    class Overflow(keras.layers.Layer):
        def call(self, inputs):
            x, flag = inputs

            @tf.custom_gradient
            def blow_up(v):
                def grad(dy):
                    return dy * tf.cast(tf.where(flag > 0.5, tf.constant(1e30, tf.float32), 1.0), dy.dtype)
                return tf.identity(v), grad
            return blow_up(x)
    return Overflow(name=name)


def build(kind: str, backend):
    """The model and its wrapped optimizer of Keras `kind` under the backend's scope, mixed_float16, the same
    initial weights for both kinds."""
    keras = keras_kinds.module(kind)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with backend.scope():
            x_in, flag_in = keras.Input((3,), name="x"), keras.Input((1,), name="flag")
            hidden = keras.layers.Dense(4, name="hidden")(x_in)
            out = keras.layers.Dense(2, name="head")(overflow_layer(keras)([hidden, flag_in]))
            model = keras.Model([x_in, flag_in], keras.layers.Activation("linear", dtype="float32")(out))
            rng = np.random.default_rng(7)
            model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
            optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.1), "mixed_float16",
                                                 initial_scale=INITIAL_SCALE)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, optimizer


def global_batches():
    """Two global batches `((x, flag), y)`: the first flags one row of the last share, the second none."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(GLOBAL_BATCH, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    flagged = np.zeros((GLOBAL_BATCH, 1), np.float32)
    flagged[-1] = 1.0
    return [((x, flagged), y), ((x, np.zeros_like(flagged)), y)]


def _share(batch, index: int, count: int):
    """Replica (or rank) `index`'s rows of `count` equal shares of a global batch."""
    size = GLOBAL_BATCH // count
    return tf.nest.map_structure(lambda a: tf.constant(a[index * size:(index + 1) * size]), batch)


def run(kind: str, backend) -> dict:
    """Both steps for Keras `kind` on `backend` (each replica, or Horovod rank, its share of the global batch: the
    flagged row in the last one's): per step the skipped flag (1.0: skipped), then the loss scale, the optimizer's
    step counter, whether every weight is finite and the weights' digest (rounded to 1e-5) and values."""
    model, optimizer = build(kind, backend)
    c = backend.context
    trainer = factory.build_run(backend, model, optimizer,
                                factory.synthetic_batch(backend, GLOBAL_BATCH // c.replicas_in_sync),
                                Schedule(epochs=1, steps_per_epoch=2)).trainer
    skipped = []
    for global_batch in global_batches():
        if backend.name == "horovod":
            batch = _share(global_batch, c.rank, c.num_workers)
        else:
            batch = backend.strategy.experimental_distribute_values_from_function(
                lambda ctx: _share(global_batch, ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync))
        skipped.append(float(trainer.train_step(batch)[1]))
    weights = model.get_weights()
    return {"kind": kind, "skipped": skipped, "loss_scale": trainer.loss_scale(),
            "iterations": int(np.asarray(optimizer.iterations)),
            "finite": bool(all(np.isfinite(w).all() for w in weights)),
            "digest": hashlib.sha256(b"".join(np.round(w, 5).tobytes() for w in weights)).hexdigest(),
            "weights": [w.tolist() for w in weights]}
