"""Metrics from one int64 confusion matrix summed over replicas (`harness.train.metrics`), never averaged
averages."""
import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.distribute.context import WorkerContext
from harness.train.loop import LoopConfig, Trainer
from harness.train.metrics import from_confusion


def test_from_confusion_closed_form():
    m = np.array([[5, 1, 0], [2, 2, 0], [0, 0, 0]])  # rows true, columns predicted; class 2 absent
    got = from_confusion(m)
    assert got["val_accuracy"] == 7 / 10
    assert got["val_precision"][:2] == [5 / 7, 2 / 3] and math.isnan(got["val_precision"][2])
    assert got["val_recall"][:2] == [5 / 6, 2 / 4]
    assert got["val_f1"][:2] == pytest.approx([10 / 13, 4 / 7], rel=1e-15)
    assert got["val_iou"][:2] == [5 / 8, 2 / 5] and math.isnan(got["val_iou"][2])
    assert got["val_mean_iou"] == pytest.approx((5 / 8 + 2 / 5) / 2, rel=1e-15)  # absent class left out
    assert got["val_confusion_matrix"] == m.tolist()


def _numpy_metrics(labels, predicted, classes):
    m = np.zeros((classes, classes), np.int64)
    np.add.at(m, (labels.ravel(), predicted.ravel()), 1)
    return m


def test_evaluate_sums_one_matrix_over_replicas(cpu_mirrored):
    """Two replicas see masks of very different class mixes: the metrics are those of the whole set (one matrix),
    which the mean of the replicas' own IoUs is not."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4, 4, 2)).astype(np.float32)
    y = np.concatenate([rng.integers(0, 3, (4, 4, 4)), np.zeros((4, 4, 4), np.int64)]).astype(np.int32)
    kernel = rng.normal(size=(1, 1, 2, 3)).astype(np.float32)
    with cpu_mirrored.scope():
        inputs = keras.Input((4, 4, 2))
        model = keras.Model(inputs, keras.layers.Conv2D(3, 1, use_bias=False, name="head")(inputs))
        model.get_layer("head").set_weights([kernel])
        opt = keras.optimizers.SGD(0.1)
    cfg = LoopConfig(epochs=1, steps_per_epoch=1, global_batch_size=8, loss_divisor=8, validation_steps=1)
    trainer = Trainer(model=model, optimizer=opt, strategy=cpu_mirrored, config=cfg,
                      context=WorkerContext.single(replicas_per_worker=2))
    ds = cpu_mirrored.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    got = trainer.evaluate(iter(ds), 1)
    predicted = np.argmax(np.einsum("bhwc,ck->bhwk", x, kernel[0, 0]), axis=-1)
    matrix = _numpy_metrics(y, predicted, 3)
    assert got["val_confusion_matrix"] == matrix.tolist() and matrix.sum() == 8 * 16
    want = from_confusion(matrix)
    for key in ("val_accuracy", "val_mean_iou", "val_iou", "val_f1"):
        assert got[key] == pytest.approx(want[key], rel=1e-12, nan_ok=True), key
    halves = [from_confusion(_numpy_metrics(y[i:i + 4], predicted[i:i + 4], 3))["val_mean_iou"] for i in (0, 4)]
    assert abs(np.mean(halves) - got["val_mean_iou"]) > 0.01  # averaging the replicas' own would be wrong
