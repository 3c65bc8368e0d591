"""One training step of a one-weight model on each of 2 Horovod ranks, through the harness's Trainer and seams:
`step(strategy, context, scale)`, which tests/distribute/scripts/hvd_mpi_threads.py runs after its rounds (under
mpirun, for tests/distribute/test_horovod_backend.py).

As tests/train/model/test_precision.py: kernel [[0, 0]], x = 1, label 0, SGD lr 1, mixed_float16 with a fixed loss
scale; the gradient [[-0.5, 0.5]] must be scaled once, averaged over the ranks and unscaled once, giving
[[0.5, -0.5]] on every rank.
"""
import harness  # noqa: F401
import tensorflow as tf
import tf_keras as keras

from harness.distribute.backend import HorovodBackend
from harness.train.loop import factory
from harness.train.loop.controller import Schedule
from harness.train.model import precision


def step(strategy, context, scale: float) -> dict:
    """The step on this rank (Horovod initialized: `horovod.init()`'s strategy and context); returns `{"size",
    "loss", "scaled", "kernel"}` (scaled: the optimizer is a LossScaleOptimizer; kernel: after the step)."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2, use_bias=False, kernel_initializer="zeros"),
                              keras.layers.Activation("linear", dtype="float32")])
    opt = precision.wrap_optimizer(keras.optimizers.SGD(1.0), "mixed_float16", initial_scale=scale, dynamic=False)
    per_rank = 1
    backend = HorovodBackend(strategy, context)
    trainer = factory.build_run(backend, model, opt, factory.synthetic_batch(backend, per_rank),
                                Schedule(epochs=1, steps_per_epoch=1)).trainer
    batch = (tf.ones([per_rank, 1]), tf.zeros([per_rank], tf.int32))
    loss = float(trainer.train_step(batch)[0])
    return {"size": context.num_workers, "loss": loss,
            "scaled": isinstance(opt, keras.mixed_precision.LossScaleOptimizer),
            "kernel": model.layers[0].kernel.numpy().tolist()}
