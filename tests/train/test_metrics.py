"""Metrics from one int64 confusion matrix summed over replicas (`harness.train.metrics`), never averaged
averages."""
import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.data.labels import IGNORED
from harness.distribute.context import WorkerContext
from harness.train.losses import make_loss
from harness.train.loop import LoopConfig, Trainer
from harness.train.metrics import (Regression, confusion_counts, from_confusion, from_regression_sums,
                                   per_class_scalars)


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


def test_nodata_pixels_are_not_counted():
    labels = tf.constant([[0, 1, IGNORED], [2, IGNORED, 1]])
    logits = tf.one_hot([[0, 2, 1], [2, 0, 1]], 3)  # predicted 0 2 1 / 2 0 1; the ignored pixels predict 1, 0
    got = confusion_counts(labels, logits, 3).numpy()
    np.testing.assert_array_equal(got, [[1, 0, 0], [0, 1, 1], [0, 0, 1]])  # 4 valid pixels, none of the two ignored


def test_regression_metrics_sum_over_replicas_as_numpy(cpu_mirrored):
    """RMSE, MAE and R² of one validation set split over 2 replicas of different value ranges, from summed sums,
    equal numpy's over the valid pixels; nodata (NaN) is left out."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 4, 4, 2)).astype(np.float32)
    y = (np.concatenate([rng.normal(0, 1, (4, 4, 4)), rng.normal(5, 3, (4, 4, 4))])).astype(np.float32)
    y[0, 0, :2] = np.nan
    kernel = rng.normal(size=(1, 1, 2, 1)).astype(np.float32)
    with cpu_mirrored.scope():
        inputs = keras.Input((4, 4, 2))
        model = keras.Model(inputs, keras.layers.Conv2D(1, 1, use_bias=False, name="head")(inputs))
        model.get_layer("head").set_weights([kernel])
        opt = keras.optimizers.SGD(0.1)
    cfg = LoopConfig(epochs=1, steps_per_epoch=1, global_batch_size=8, loss_divisor=8, validation_steps=1)
    trainer = Trainer(model=model, optimizer=opt, strategy=cpu_mirrored, config=cfg, metrics=Regression(),
                      loss_fn=make_loss("mse", task="regression", ignore=True),
                      context=WorkerContext.single(replicas_per_worker=2))
    ds = cpu_mirrored.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    got = trainer.evaluate(iter(ds), 1)
    pred = np.einsum("bhwc,c->bhw", x.astype(np.float64), kernel[0, 0, :, 0].astype(np.float64))
    ok = np.isfinite(y)
    e, t = pred[ok] - y[ok], y[ok].astype(np.float64)
    assert got["val_count"] == 8 * 16 - 2
    # float32 predictions (about 1e-7 relative) against numpy's float64 ones: 1e-6
    assert got["val_rmse"] == pytest.approx(np.sqrt(np.mean(e ** 2)), rel=1e-6)
    assert got["val_mae"] == pytest.approx(np.mean(np.abs(e)), rel=1e-6)
    assert got["val_r2"] == pytest.approx(1 - np.sum(e ** 2) / np.sum((t - t.mean()) ** 2), rel=1e-6)
    halves = [np.sqrt(np.nanmean((pred[i:i + 4] - y[i:i + 4]) ** 2)) for i in (0, 4)]
    assert abs(np.mean(halves) - got["val_rmse"]) > 0.01  # the mean of the replicas' own RMSE would be wrong
    assert got["val_loss"] == pytest.approx(np.sum(e ** 2) / (8 * 16) * 1.0, rel=1e-5)  # nodata weighs 0


def test_regression_closed_form_and_undefined():
    got = from_regression_sums([4, 2.0, 2.0, 10.0, 30.0])  # y = 1..4: Σy² − (Σy)²/n = 5
    assert got == {"val_rmse": np.sqrt(0.5), "val_mae": 0.5, "val_r2": 1 - 2.0 / 5.0, "val_count": 4}
    assert all(math.isnan(got[k]) for k in ("val_rmse", "val_mae", "val_r2")
               for got in [from_regression_sums([0, 0, 0, 0, 0])])
    assert math.isnan(from_regression_sums([3, 1.0, 1.0, 6.0, 12.0])["val_r2"])  # a constant target


def test_per_class_scalars_named_and_nan_left_out():
    logs = {"val_iou": [0.5, float("nan"), 0.25], "val_f1": [0.6, 0.1, 0.2], "val_accuracy": 0.7}
    assert per_class_scalars(logs, ("water", "crop", "urban")) == {
        "val_iou/water": 0.5, "val_iou/urban": 0.25, "val_f1/water": 0.6, "val_f1/crop": 0.1, "val_f1/urban": 0.2}
    assert set(per_class_scalars(logs)) == {"val_iou/0", "val_iou/2", "val_f1/0", "val_f1/1", "val_f1/2"}
