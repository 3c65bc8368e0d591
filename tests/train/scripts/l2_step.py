"""One SGD step of a Dense layer with an L2 regularizer on N logical CPU replicas (MirroredStrategy) through the
harness's Trainer, for a tf-keras model and then a Keras 3 one; prints `L2_STEP {json}` per run and kind with the
loss and the weights after the step.

Usage: l2_step.py RUN [RUN ...], each RUN `REPLICAS[:CLIP_NORM]` or `horovod[:CLIP_NORM]` (horovod: one replica
per rank, under horovodrun; each rank takes its share of the batch). The runs share one process (one TensorFlow
import): the CPU is split into as many logical devices as the largest REPLICAS, and a run of N replicas mirrors
the first N of them (1: OneDeviceStrategy), each run with fresh models and optimizers.
"""
import json
import sys

import harness  # noqa: F401
import numpy as np
import tensorflow as tf

runs = []
for arg in sys.argv[1:]:
    mode, _, clip = arg.partition(":")
    runs.append((mode, float(clip) if clip else None))
if not runs or len({mode == "horovod" for mode, _ in runs}) > 1:
    sys.exit("usage: l2_step.py REPLICAS[:CLIP_NORM]... | horovod[:CLIP_NORM]...")
horovod_mode = runs[0][0] == "horovod"
if horovod_mode:
    from harness.distribute import horovod
    hvd_strategy, hvd_context = horovod.init()
else:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * max(int(mode) for mode, _ in runs))

from harness import keras_kinds  # noqa: E402
from harness.distribute.context import WorkerContext  # noqa: E402
from harness.distribute.backend import HorovodBackend, TrainingBackend  # noqa: E402
from harness.distribute.batch import batch_sizes  # noqa: E402
from harness.train.loop import factory  # noqa: E402
from harness.train.loop.controller import Schedule  # noqa: E402

rng = np.random.default_rng(0)
x, y = rng.normal(size=(12, 3)).astype(np.float32), rng.integers(0, 2, 12).astype(np.int32)
kernel = rng.normal(size=(3, 2)).astype(np.float32)
for mode, clip_norm in runs:
    if horovod_mode:
        strategy, context = hvd_strategy, hvd_context
    else:
        n = int(mode)
        strategy = (tf.distribute.OneDeviceStrategy("/cpu:0") if n == 1 else
                    tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)],
                                                   cross_device_ops=tf.distribute.ReductionToOneDevice()))
        context = WorkerContext.single(replicas_per_worker=n)
    ranks = context.num_workers if horovod_mode else 1
    share = 12 // ranks  # Horovod: each rank its own rows, divided by its own batch (the tape averages)
    backend = (HorovodBackend if horovod_mode else TrainingBackend)(strategy, context)
    plan = batch_sizes(workers=context.num_workers, replicas_per_worker=strategy.num_replicas_in_sync,
                       global_batch_size=12)   # the loss divisor: 12 (tf.distribute), the rank's share (Horovod)
    for kind in keras_kinds.KINDS:
        keras = keras_kinds.module(kind)
        with strategy.scope():
            inputs = keras.Input((3,))
            model = keras.Model(inputs, keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.5),
                                                           name="dense")(inputs))
            model.get_layer("dense").set_weights([kernel, np.zeros(2, np.float32)])
            opt = keras.optimizers.SGD(0.1)
        trainer = factory.build_run(backend, model, opt, plan, Schedule(epochs=1, steps_per_epoch=1),
                                    clip_norm=clip_norm).trainer
        if horovod_mode:
            batch = (tf.constant(x[context.rank * share:(context.rank + 1) * share]),
                     tf.constant(y[context.rank * share:(context.rank + 1) * share]))
        else:
            batch = next(iter(strategy.experimental_distribute_dataset(
                tf.data.Dataset.from_tensor_slices((x, y)).batch(12).repeat())))
        loss = float(trainer.train_step(batch)[0])
        print("L2_STEP " + json.dumps({"kind": kind, "rank": context.rank, "clip": clip_norm,
                                       "replicas": strategy.num_replicas_in_sync * ranks, "loss": loss,
                                       "weights": [w.tolist() for w in model.get_weights()]}), flush=True)
