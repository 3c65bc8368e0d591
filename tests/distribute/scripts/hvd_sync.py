"""2-rank Horovod check, launched by tests/distribute/test_horovod_install.py under horovodrun --gloo and mpirun.

hvd.init, an allreduce of the rank, then a few steps of hvd.DistributedGradientTape training of a tiny tf_keras
model on rank-dependent data. Each rank prints one line `HVD_RESULT {json}` that the test compares across ranks,
with what its Horovod was built with (`built`: the controllers as `horovodrun --check-build` lists them, asked of
horovod.tensorflow's library, which this script's ops ran on).
"""
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2; the launcher also exports it to every rank
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
rank_sum = float(hvd.allreduce(tf.constant(float(rank)), op=hvd.Sum).numpy())

tf.random.set_seed(rank)  # different initial weights per rank: the broadcast must make them equal
model = tf_keras.Sequential([tf_keras.layers.Dense(4, activation="relu"), tf_keras.layers.Dense(1)])
model.build((None, 3))
opt = tf_keras.optimizers.SGD(0.05)
hvd.broadcast_variables(model.variables, root_rank=0)
initial = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])

rng = np.random.default_rng(100 + rank)  # rank-dependent data
x = rng.normal(size=(16, 3)).astype("float32")
y = (x.sum(axis=1, keepdims=True) * (1 + rank)).astype("float32")
local_losses = []
for _ in range(5):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    local_losses.append(float(loss))

weights = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
print("HVD_RESULT " + json.dumps({
    "rank": rank, "size": size, "rank_sum": rank_sum,
    "mpi_enabled": bool(hvd.mpi_enabled()), "gloo_enabled": bool(hvd.gloo_enabled()),
    "built": {"mpi": bool(hvd.mpi_built()), "gloo": bool(hvd.gloo_built())},
    "keras": tf.keras.__name__, "local_losses": local_losses,
    "initial": initial.tolist(), "weights": weights.tolist(),
}), flush=True)
hvd.shutdown()
