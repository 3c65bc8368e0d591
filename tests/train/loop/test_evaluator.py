"""Validation scores every record exactly once (issue 19, item 6): the last, partial batch is kept and replicas
without data in a step score nothing, so the counts and metrics are those of the whole set, on any number of
replicas. Multi-worker and Horovod cases: tests/train/test_multi_worker.py, tests/distribute/test_horovod_backend.py."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.distribute.context import WorkerContext
from harness.distribute.plan import make_plan
from harness.train.model.metrics import Regression
from harness.train.model.losses import make_loss
from loop_support import build

N, BATCH = 37, 8   # 37 records in per-replica batches of 8: batches 8, 8, 8, 8, 5 -> the last step partial


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, 3)).astype(np.float32)
    return x, rng.integers(0, 3, N).astype(np.int32)


def _linear(strategy, kernel, outputs=3):
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(outputs, use_bias=False, name="head")])
        model.get_layer("head").set_weights([kernel])
        return model, keras.optimizers.SGD(0.1)


@pytest.mark.parametrize("replicas", [1, 2])
def test_every_record_scored_once_with_a_partial_last_batch(cpu_mirrored, replicas):
    strategy = cpu_mirrored if replicas == 2 else tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _data()
    kernel = np.random.default_rng(1).normal(size=(3, 3)).astype(np.float32)
    model, opt = _linear(strategy, kernel)
    run = build(strategy, model, opt, global_batch_size=BATCH * replicas,
                context=WorkerContext.single(replicas_per_worker=replicas))
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))
    got = run.evaluate(dataset)
    predicted = (x @ kernel).argmax(1)
    matrix = np.zeros((3, 3), np.int64)
    np.add.at(matrix, (y, predicted), 1)
    assert got["val_records"] == N and got["val_pixels"] == N
    assert got["val_confusion_matrix"] == matrix.tolist()
    assert got["val_accuracy"] == pytest.approx((predicted == y).mean(), rel=1e-12)
    logits = x @ kernel
    ce = np.log(np.exp(logits).sum(1)) - logits[np.arange(N), y]
    assert got["val_loss"] == pytest.approx(ce.mean(), rel=1e-5)


def test_regression_counts_every_pixel_once(cpu_mirrored):
    x, _ = _data()
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    y[5] = np.nan   # nodata: not counted
    kernel = np.array([[1.0], [-1.0], [0.0]], np.float32)
    model, opt = _linear(cpu_mirrored, kernel, outputs=1)
    run = build(cpu_mirrored, model, opt, global_batch_size=2 * BATCH, metrics=Regression(),
                loss_fn=make_loss("mse", task="regression", ignore=True))
    got = run.evaluate(cpu_mirrored.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)))
    ok = np.isfinite(y)
    e = (x @ kernel)[:, 0][ok].astype(np.float64) - y[ok]
    assert got["val_records"] == N and got["val_pixels"] == N - 1
    assert got["val_rmse"] == pytest.approx(np.sqrt((e ** 2).mean()), rel=1e-5)


def test_evaluation_plan_keeps_every_record():
    """A validation set smaller than one global batch, and uneven over workers, is planned whole: nothing dropped."""
    plan = make_plan([("a", 100), ("b", 50), ("c", 0)], workers=2, replicas_per_worker=1, per_replica_batch_size=32,
                     evaluation=True)
    assert plan.records == (100, 50) and plan.dropped == (0, 0) and plan.steps_per_epoch == 4
    small = make_plan([("a", 5)], workers=2, replicas_per_worker=2, per_replica_batch_size=8, evaluation=True)
    assert sum(small.records) == 5 and sum(small.dropped) == 0
