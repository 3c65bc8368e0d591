"""Loss scaling is applied exactly once, under one replica and under 2 MirroredStrategy replicas."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.train import precision
from harness.train.loop import LoopConfig, Trainer
from harness.errors import ConfigError


class _Chief:
    is_chief = True


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _one_step(strategy, scale):
    """Logits = x @ kernel with kernel [[0, 0]], x = 1, label 0, SGD lr 1.

    d(cross-entropy)/d(kernel) = x * (softmax - onehot) = [[-0.5, +0.5]], so one step gives [[0.5, -0.5]]
    whatever the scale; a scale applied twice or never unscaled would give [[0.5 * scale, ...]] or
    [[0.5 / scale, ...]]."""
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)),
                                  keras.layers.Dense(2, use_bias=False, kernel_initializer="zeros"),
                                  keras.layers.Activation("linear", dtype="float32")])
        opt = precision.wrap_optimizer(keras.optimizers.SGD(1.0), "mixed_float16", initial_scale=scale,
                                       dynamic=False)
    assert isinstance(opt, keras.mixed_precision.LossScaleOptimizer)
    cfg = LoopConfig(epochs=1, steps_per_epoch=1, global_batch_size=replicas, loss_divisor=replicas)
    trainer = Trainer(model=model, optimizer=opt, strategy=strategy, context=_Chief(), config=cfg)
    ds = tf.data.Dataset.from_tensors((tf.ones([1]), tf.zeros([], tf.int32))).repeat().batch(replicas)
    dist = strategy.experimental_distribute_dataset(ds)
    loss = float(trainer.train_step(next(iter(dist))))
    return loss, model.layers[0].kernel.numpy()


@pytest.mark.parametrize("scale", [8.0, 1024.0])
def test_loss_scale_applied_once_one_replica(mixed_float16, scale):
    loss, kernel = _one_step(tf.distribute.OneDeviceStrategy("/cpu:0"), scale)
    assert loss == pytest.approx(np.log(2.0), rel=1e-3)
    np.testing.assert_allclose(kernel, [[0.5, -0.5]], rtol=1e-3)


def test_loss_scale_applied_once_two_replicas(mixed_float16, cpu_mirrored):
    strategy = cpu_mirrored
    assert strategy.num_replicas_in_sync == 2
    loss, kernel = _one_step(strategy, 64.0)
    assert loss == pytest.approx(np.log(2.0), rel=1e-3)
    np.testing.assert_allclose(kernel, [[0.5, -0.5]], rtol=1e-3)


def test_bfloat16_and_float32_need_no_scaling():
    opt = keras.optimizers.SGD(1.0)
    assert precision.wrap_optimizer(opt, "mixed_bfloat16") is opt
    assert precision.wrap_optimizer(opt, "float32") is opt


def test_resolve_precision_requested_and_invalid():
    assert precision.resolve_precision("float32") == ("float32", "requested")
    policy, why = precision.resolve_precision("auto")   # no GPU here
    assert policy in ("float32", "mixed_bfloat16") and why
    with pytest.raises(ConfigError, match="--precision must be one of"):
        precision.resolve_precision("fp8")
