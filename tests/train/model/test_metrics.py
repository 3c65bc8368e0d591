"""Metrics from one int64 confusion matrix summed over replicas (`harness.train.model.metrics`), never averaged
averages."""
import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.data.export import synth
from harness.data.spec.labels import IGNORED
from harness.distribute.context import WorkerContext
from harness.train.model.losses import make_loss
from loop_support import build
from harness.train.model.metrics import (Regression, confusion_counts, from_confusion, from_regression_sums,
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


def _conv_trainer(strategy, kernel, **kwargs):
    """A Trainer of one 1x1 convolution (`kernel` `[1, 1, 2, outputs]`) on `[8, 4, 4, 2]` inputs over 2 replicas,
    one evaluation step of the global batch 8."""
    with strategy.scope():
        inputs = keras.Input((4, 4, 2))
        model = keras.Model(inputs, keras.layers.Conv2D(kernel.shape[-1], 1, use_bias=False, name="head")(inputs))
        model.get_layer("head").set_weights([kernel])
        opt = keras.optimizers.SGD(0.1)
    return build(strategy, model, opt, global_batch_size=8, context=WorkerContext.single(replicas_per_worker=2),
                 **kwargs)


def test_evaluate_sums_one_matrix_over_replicas(cpu_mirrored):
    """Two replicas see masks of very different class mixes: the metrics are those of the whole set (one matrix),
    which the mean of the replicas' own IoUs is not."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4, 4, 2)).astype(np.float32)
    y = np.concatenate([rng.integers(0, 3, (4, 4, 4)), np.zeros((4, 4, 4), np.int64)]).astype(np.int32)
    kernel = rng.normal(size=(1, 1, 2, 3)).astype(np.float32)
    trainer = _conv_trainer(cpu_mirrored, kernel)
    ds = cpu_mirrored.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    got = trainer.evaluate(ds)
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
    trainer = _conv_trainer(cpu_mirrored, kernel, metrics=Regression(),
                            loss_fn=make_loss("mse", task="regression", ignore=True))
    ds = cpu_mirrored.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    got = trainer.evaluate(ds)
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


# --- the proofs: summary.json and TensorBoard against numpy on the saved model's predictions, 2 real workers ---------
ROOT = pathlib.Path(__file__).resolve().parents[3]
TRAIN_RUNS = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "train_runs.py"
NAMES = ["water", "crop", "forest", "urban"]


def _split(folder: pathlib.Path, parts: dict, mutate) -> dict:
    """Re-split the export in `folder` (one field: the same function from bands to label in every part) into
    folders `parts` = {name: [records per shard]} (`<name>-0000k.tfrecord.gz`, records in export order), with
    `mutate(example, index)` applied to each record; returns {name: its Examples in order}."""
    paths = sorted(folder.glob("*.tfrecord.gz"))
    examples = [tf.train.Example.FromString(r) for p in paths
                for r in tf.data.TFRecordDataset(str(p), compression_type="GZIP").as_numpy_iterator()]
    assert sum(map(sum, parts.values())) == len(examples)
    out, start = {}, 0
    for name, sizes in parts.items():
        (folder.parent / name).mkdir()
        out[name] = examples[start:start + sum(sizes)]
        for k, n in enumerate(sizes):
            with tf.io.TFRecordWriter(str(folder.parent / name / f"{name}-{k:05d}.tfrecord.gz"), "GZIP") as w:
                for i in range(start, start + n):
                    mutate(examples[i], i)
                    w.write(examples[i].SerializeToString())
            start += n
    return out


def _column(examples, name):
    return np.array([ex.features.feature[name].float_list.value for ex in examples], np.float32)


def _segmentation(folder: pathlib.Path) -> tuple[list, list]:
    """The segmentation test's export in `folder` and its `harness train` flags: (flags, validation Examples)."""
    synth.write_image_export(str(folder / "export"), shards=4, records=128, patch_size=16, seed=1)

    def nodata(ex, i):
        mask = np.array(ex.features.feature["landcover"].float_list.value).reshape(16, 16)
        mask[0] = 255.0                                            # the first row of every patch
        mask[(np.add.outer(np.arange(16), np.arange(16)) + i) % 7 == 0] = 255.0
        ex.features.feature["landcover"].float_list.value[:] = mask.ravel()
    # Unequal shards; worker 0 reads shards 0 and 2, worker 1 shards 1 and 3: the same records each, none dropped.
    # 64 training records: 2 steps, 1 epoch (the metrics are the validation set's, of whatever model is saved).
    examples = _split(folder / "export", {"train": [10, 22, 22, 10], "val": [12, 20, 20, 12]}, nodata)["val"]
    return ["--data", folder / "train", "--validation-data", folder / "val", "--epochs", "1",
            "--per-replica-batch-size", "16", "--learning-rate", "0.01", "--ignore-label", "255",
            "--class-names", *NAMES, "--model", "examples/deep_unet.py:build",
            "--model-args", '{"depth": 2, "base_filters": 8}', "--output", folder / "run"], examples


def _regression(folder: pathlib.Path) -> tuple[list, list]:
    """The regression test's export in `folder` and its `harness train` flags: (flags, validation Examples)."""
    synth.write_table_export(str(folder / "export"), shards=4, records=512, seed=1, label="target",
                             regression=True)

    def nodata(ex, i):
        if i % 9 == 0:
            ex.features.feature["target"].float_list.value[:] = [-9999.0]
    # 256 training rows: 4 steps an epoch, 8 in all, enough for the validation RMSE to fall (~0.3 -> ~0.1)
    examples = _split(folder / "export", {"train": [50, 78, 78, 50], "val": [40, 88, 88, 40]}, nodata)["val"]
    return ["--data", folder / "train", "--validation-data", folder / "val", "--task", "regression",
            "--label", "target", "--ignore-label", "-9999", "--epochs", "2", "--per-replica-batch-size", "32",
            "--learning-rate", "0.01", "--monitor", "val_rmse", "--output", folder / "run"], examples


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """Both tests' runs in one launch of 2 workers (`harness launch local`), one after the other in each worker's
    process, each through `harness train`'s CLI (tests/train/scripts/train_runs.py: the launch and the workers'
    start paid once, ~4 CPU-s less than a launch each): per test its run folder and validation Examples, and the
    launch's stdout."""
    tmp = tmp_path_factory.mktemp("metrics")
    runs = {name: make(tmp / name) for name, make in (("segmentation", _segmentation), ("regression", _regression))}
    flags = [str(a) for a in [*runs["segmentation"][0], "---", *runs["regression"][0]]]
    r = subprocess.run([sys.executable, "-m", "harness.cli", "launch", "local", "--workers", "2", "--timeout", "540",
                        "--", sys.executable, str(TRAIN_RUNS), *flags],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return {name: (tmp / name / "run", examples) for name, (_, examples) in runs.items()} | {"stdout": r.stdout}


def _scalars(folder: pathlib.Path) -> dict:
    """TensorBoard scalars of the event files under `folder`: tag -> {step: value}."""
    out = {}
    for path in folder.rglob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for v in event.summary.value:
                out.setdefault(v.tag, {})[event.step] = float(tf.make_ndarray(v.tensor))
    return out


def test_segmentation_metrics_equal_numpy_on_the_saved_model_two_workers(two_workers):
    """examples/deep_unet.py (2 stages: ~4 CPU-s less than 3) on 16x16 patches over 2 workers (`launch local`),
    training and validation shards of unequal sizes, nodata 255 on a share of the pixels and class names: the
    confusion matrix, per-class IoU and F1 in summary.json equal numpy's from the saved model's predictions on the
    validation set (every valid pixel counted once, no nodata pixel, none dropped), and TensorBoard holds the
    per-class metrics by name and the learning rate per step. The deep U-Net's BatchNormalization makes this a test
    of the replicas' statistics too: each replica evaluates with the mean statistics that are saved
    (`align_model_state`), not its own."""
    (out, examples), stdout = two_workers["segmentation"], two_workers["stdout"]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["workers_weights_sha256"]) == 2 and len(set(summary["workers_weights_sha256"])) == 1
    assert summary["spec"]["ignore_label"] == 255 and summary["spec"]["num_classes"] == 4
    last = summary["history"][-1]

    labels = _column(examples, "landcover").reshape(-1, 16, 16)
    images = np.stack([_column(examples, b).reshape(-1, 16, 16) for b in ("B2", "B3", "B4", "B8")], axis=-1)
    model = keras.models.load_model(summary["model"], compile=False)
    predicted = np.argmax(model.predict(images, batch_size=16, verbose=0), axis=-1)
    counted = labels != 255
    matrix = np.zeros((4, 4), np.int64)
    np.add.at(matrix, (labels[counted].astype(int), predicted[counted]), 1)
    assert counted.sum() < labels.size - 64 * 16  # a first row and more of every patch is nodata
    assert last["val_confusion_matrix"] == matrix.tolist() and matrix.sum() == counted.sum()
    hits, actual, guessed = np.diag(matrix), matrix.sum(1), matrix.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        iou, f1 = hits / (actual + guessed - hits), 2 * hits / (actual + guessed)
    assert summary["class_names"] == NAMES
    for c, name in enumerate(NAMES):
        for key, want in (("iou", iou[c]), ("f1", f1[c])):
            assert summary["per_class"][name][key] == pytest.approx(want, rel=1e-6, nan_ok=True), (name, key)
    assert last["val_accuracy"] == pytest.approx(hits.sum() / matrix.sum(), rel=1e-12)
    assert f"val_accuracy {last['val_accuracy']:.4f} val_mean_iou {last['val_mean_iou']:.4f}" in stdout

    scalars = _scalars(out / "logs" / "train")
    step = summary["final_step"]
    for c, name in enumerate(NAMES):
        if np.isfinite(iou[c]):
            assert scalars[f"val_iou/{name}"][step] == pytest.approx(iou[c], rel=1e-6)
            assert scalars[f"val_f1/{name}"][step] == pytest.approx(f1[c], rel=1e-6)
        assert f"val_precision/{name}" in scalars or not np.isfinite(last["val_precision"][c])
    assert scalars["val_mean_iou"][step] == pytest.approx(last["val_mean_iou"], rel=1e-6)
    assert sorted(scalars["learning_rate"]) == list(range(1, step + 1))  # one per step
    assert all(v == pytest.approx(0.01) for v in scalars["learning_rate"].values())


def test_regression_metrics_equal_numpy_on_the_saved_model_two_workers(two_workers):
    """A regression table export (label a linear function of the bands) with nodata -9999 on some rows, trained
    with the default mse over 2 workers: RMSE, MAE and R² of every epoch come from summed sums (the epoch line,
    TensorBoard and summary.json), and the last equal numpy's on the saved model's predictions of the validation
    rows. Tolerance 1e-5 relative: numpy's reference is computed from the model's float32 outputs run in other
    batches (float32 rounding, 6e-8 per operation, through a few layers)."""
    (out, examples), stdout = two_workers["regression"], two_workers["stdout"]
    summary = json.loads((out / "summary.json").read_text())
    history = summary["history"]
    assert summary["spec"]["task"] == "regression" and len(set(summary["workers_weights_sha256"])) == 1
    assert history[-1]["val_rmse"] < history[0]["val_rmse"]
    assert summary["best"]["monitor"] == "val_rmse" and summary["best"]["mode"] == "min"
    assert f"val_rmse {history[-1]['val_rmse']:.4f} val_mae {history[-1]['val_mae']:.4f}" in stdout

    y = _column(examples, "target")[:, 0].astype(np.float64)
    x = np.stack([_column(examples, b)[:, 0] for b in ("B2", "B3", "B4", "B8")], axis=-1)
    model = keras.models.load_model(summary["model"], compile=False)
    pred = model.predict(x, batch_size=32, verbose=0)[:, 0].astype(np.float64)
    ok = y != -9999.0
    e, t = pred[ok] - y[ok], y[ok]
    last = history[-1]
    assert last["val_count"] == ok.sum() == 256 - 28  # every valid row counted once (261, 270, ... nodata)
    assert last["val_rmse"] == pytest.approx(np.sqrt(np.mean(e ** 2)), rel=1e-5)
    assert last["val_mae"] == pytest.approx(np.mean(np.abs(e)), rel=1e-5)
    assert last["val_r2"] == pytest.approx(1 - np.sum(e ** 2) / np.sum((t - t.mean()) ** 2), rel=1e-5)
    scalars = _scalars(out / "logs" / "train")
    for key in ("val_rmse", "val_mae", "val_r2"):
        assert scalars[key][summary["final_step"]] == pytest.approx(last[key], rel=1e-6)
