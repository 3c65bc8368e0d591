"""One SGD step of a Dense layer with an L2 regularizer on N logical CPU replicas (MirroredStrategy) through the
harness's Trainer; prints `L2_STEP {json}` with the loss and the weights after the step.

Usage: l2_step.py REPLICAS
"""
import json
import sys

import harness  # noqa: F401
import numpy as np
import tensorflow as tf

n = int(sys.argv[1])
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)

import tf_keras as keras  # noqa: E402

from harness.distribute.context import WorkerContext  # noqa: E402
from harness.train.loop import LoopConfig, Trainer  # noqa: E402

strategy = (tf.distribute.OneDeviceStrategy("/cpu:0") if n == 1 else
            tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)],
                                           cross_device_ops=tf.distribute.ReductionToOneDevice()))
rng = np.random.default_rng(0)
x, y = rng.normal(size=(12, 3)).astype(np.float32), rng.integers(0, 2, 12).astype(np.int32)
kernel = rng.normal(size=(3, 2)).astype(np.float32)
with strategy.scope():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.5),
                                                   name="dense")(inputs))
    model.get_layer("dense").set_weights([kernel, np.zeros(2, np.float32)])
    opt = keras.optimizers.SGD(0.1)
cfg = LoopConfig(epochs=1, steps_per_epoch=1, global_batch_size=12, loss_divisor=12)
trainer = Trainer(model=model, optimizer=opt, strategy=strategy, context=WorkerContext.single(replicas_per_worker=n),
                  config=cfg)
ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(12).repeat())
loss = float(trainer.train_step(next(iter(ds))))
print("L2_STEP " + json.dumps({"replicas": strategy.num_replicas_in_sync, "loss": loss,
                               "weights": [w.tolist() for w in model.get_weights()]}), flush=True)
