"""A run trained on band groups predicts through its saved spec: its inputs are delivered as training's pipeline
delivers them (`group_delivery` time or dict), on the ACES points (a temporal model trained for one epoch, time) and on
an image export (models written beside their run's spec); the predictions equal the model called on the records as
the training pipeline decodes them, in record order. A model whose inputs are not the spec's is a
ModelMismatchError naming both shapes."""
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from predict_support import BANDS, K, P, run_cli

from harness.data import pipeline
from harness.data.spec import DataSpec
from harness.distribute.context import WorkerContext
from harness.errors import ModelMismatchError
from harness.predict.options import PredictOptions
from harness.predict.run import read_outputs, run

GROUPS = {"before": ["blue_before", "green_before", "nir_before", "red_before"],
          "during": ["blue_during", "green_during", "nir_during", "red_during"]}
IMAGE_GROUPS = {"a": BANDS[:2], "b": BANDS[2:]}
EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


def _run(model, data, out, **kw):
    options = PredictOptions(model=str(model), data=(str(data),), output=str(out), **kw)
    return run(options, context=WorkerContext.single(), say=lambda line: None)


def _delivered(spec: DataSpec, paths):
    """Every record of `paths` in order, decoded by the training pipeline's `decode` (inputs only)."""
    ds = tf.data.TFRecordDataset([str(p) for p in paths], compression_type="GZIP").batch(10_000)
    parts = [pipeline.decode(spec.replace(label=None), batch) for batch in ds]
    return tf.nest.map_structure(lambda *t: np.concatenate(t), *parts)


def _expected(model, inputs):
    logits = model.predict(inputs, batch_size=256, verbose=0)
    return np.argmax(logits, -1), tf.nn.softmax(logits, -1).numpy()


def _written(out, classes):
    rows = read_outputs(sorted(out.glob("*.tfrecord")))
    probabilities = np.stack([np.stack([r[f"probability_{c}"] for c in range(classes)], -1) for r in rows])
    return np.stack([r["class"] for r in rows]), probabilities


def test_a_run_trained_on_band_groups_predicts_the_pipelines_inputs(shared_data, tmp_path):
    """`examples/aces_points.yaml`: two groups on a time axis. (A table run delivering its groups as a dict
    cannot be trained yet: the band statistics take one tensor.)"""
    import tf_keras as keras

    points = shared_data / "gee-aces-points"
    run_dir, out = tmp_path / "run", tmp_path / "pred"
    run_cli("train", "--data", points / "training.tfrecord.gz", "--config", EXAMPLES / "aces_points.yaml", "--model",
            f"{EXAMPLES / 'temporal_pixel.py'}:build", "--epochs", 1, "--output", run_dir)
    run_cli("predict", "--model", run_dir, "--data", points / "testing.tfrecord.gz", "--output", out,
            "--probabilities", "--format", "tfrecord")
    spec = DataSpec.from_config(json.loads((run_dir / "summary.json").read_text())["spec"])
    assert spec.group_delivery == "time"
    model = keras.models.load_model(str(run_dir / "model.keras"), compile=False)
    classes, probabilities = _expected(model, _delivered(spec, [points / "testing.tfrecord.gz"]))
    got_classes, got_probabilities = _written(out, spec.num_classes)
    assert got_classes.shape == (1219, 1)
    np.testing.assert_array_equal(got_classes[:, 0], classes)
    np.testing.assert_allclose(got_probabilities[:, 0], probabilities, atol=1e-5)


def _image_run(folder, delivery, *, model_delivery=None):
    """A run folder: a model over IMAGE_GROUPS built for `model_delivery` (default `delivery`), 3 classes, and a
    summary.json whose spec delivers the groups by `delivery`."""
    import tf_keras as keras

    s = P + K
    if (model_delivery or delivery) == "time":
        x = keras.Input((2, s, s, 2), name="series")
        y = keras.layers.Reshape((s, s, 3))(keras.layers.Conv3D(3, (2, 1, 1))(x))
    else:
        x = {g: keras.Input((s, s, 2), name=g) for g in IMAGE_GROUPS}
        y = keras.layers.Conv2D(3, 1)(keras.layers.Concatenate()([x["a"], x["b"]]))
    folder.mkdir()
    keras.Model(x, y).save(str(folder / "model.keras"))
    spec = DataSpec(kind="image", bands=(), label="landcover", band_groups=IMAGE_GROUPS, group_delivery=delivery,
                    patch_size=P, kernel_margin=K, num_classes=3)
    (folder / "summary.json").write_text(json.dumps({"spec": spec.to_config()}))
    return folder, spec


@pytest.mark.parametrize("delivery", ["time", "dict"])
def test_an_image_run_on_band_groups(margin_export, tmp_path, delivery):
    import tf_keras as keras

    run_dir, spec = _image_run(tmp_path / "run", delivery)
    out = tmp_path / "pred"
    _run(run_dir, margin_export, out, probabilities=True, batch_size=4)
    model = keras.models.load_model(str(run_dir / "model.keras"), compile=False)
    inputs = _delivered(spec, sorted(margin_export.glob("*.tfrecord.gz")))
    inputs = inputs if isinstance(inputs, dict) else np.asarray(inputs)
    classes, probabilities = _expected(model, inputs)
    got_classes, got_probabilities = _written(out, 3)
    a = K // 2
    np.testing.assert_array_equal(got_classes.reshape(-1, P, P), classes[:, a:a + P, a:a + P])
    np.testing.assert_allclose(got_probabilities.reshape(-1, P, P, 3), probabilities[:, a:a + P, a:a + P],
                               atol=1e-5)


def test_a_model_not_built_for_the_runs_groups(margin_export, tmp_path):
    run_dir, _ = _image_run(tmp_path / "run", "time", model_delivery="dict")
    with pytest.raises(ModelMismatchError, match=r"the model takes \{a: \[batch, 20, 20, 2\], b: \[batch, 20, 20, "
                                                 r"2\]\}; .* gives \[batch, 2, 20, 20, 2\] per the run's spec "
                                                 r"\(band groups a: B2, B3; b: B4, B8, stacked on a time axis"):
        _run(run_dir, margin_export, tmp_path / "out")
    assert not (tmp_path / "out").exists()
