"""A run trained on band groups predicts through its saved spec: its inputs are delivered as training's pipeline
delivers them (`group_delivery` time or dict), on the ACES points (a temporal model trained for one epoch) and on
an image export (models written beside their run's spec); the predictions equal the model called on the records as
the training pipeline decodes them, in record order. A model whose inputs are not the spec's is a
ModelMismatchError naming both shapes. Only the training runs in a child process: `harness predict` runs in this
one (`predict_support.cli_in_process`)."""
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from predict_support import K, P, cli_in_process, grouped_image_run, read_outputs, run_cli

from harness.data.input import decode
from harness.data.spec.dataspec import DataSpec
from harness.distribute.context import WorkerContext
from harness.errors import ModelMismatchError
from harness.predict.job import run
from harness.predict.options import PredictOptions

GROUPS = {"before": ["blue_before", "green_before", "nir_before", "red_before"],
          "during": ["blue_during", "green_during", "nir_during", "red_during"]}
EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


def _run(model, data, out, **kw):
    options = PredictOptions(model=str(model), data=(str(data),), output=str(out), **kw)
    return run(options, context=WorkerContext.single(), say=lambda line: None)


def _delivered(spec: DataSpec, paths):
    """Every record of `paths` in order, decoded by the training pipeline's `decode` (inputs only)."""
    ds = tf.data.TFRecordDataset([str(p) for p in paths], compression_type="GZIP").batch(10_000)
    parts = [decode.decode(spec.replace(label=None), batch) for batch in ds]
    return tf.nest.map_structure(lambda *t: np.concatenate(t), *parts)


def _expected(model, inputs):
    logits = model.predict(inputs, batch_size=256, verbose=0)
    return np.argmax(logits, -1), tf.nn.softmax(logits, -1).numpy()


def _written(out, classes):
    rows = read_outputs(sorted(out.glob("*.tfrecord")))
    probabilities = np.stack([np.stack([r[f"probability_{c}"] for c in range(classes)], -1) for r in rows])
    return np.stack([r["class"] for r in rows]), probabilities


@pytest.mark.parametrize("delivery", ["time", "dict"])
def test_a_run_trained_on_band_groups_predicts_the_pipelines_inputs(shared_data, tmp_path, delivery):
    """`examples/aces_points.yaml` (two groups on a time axis), and the same groups delivered as a dict: one named
    input per group, each normalized by its own group's band statistics."""
    import tf_keras as keras

    points = shared_data / "gee-aces-points"
    run_dir, out, config = tmp_path / "run", tmp_path / "pred", tmp_path / "config.yaml"
    config.write_text((EXAMPLES / "aces_points.yaml").read_text().replace("group_delivery: time",
                                                                          f"group_delivery: {delivery}"))
    run_cli("train", "--data", points / "training.tfrecord.gz", "--config", config, "--model",
            f"{EXAMPLES / 'temporal_pixel.py'}:build", "--epochs", 1, "--output", run_dir)
    cli_in_process("predict", "--model", run_dir, "--data", points / "testing.tfrecord.gz", "--output", out,
                   "--probabilities", "--format", "tfrecord")
    spec = DataSpec.from_config(json.loads((run_dir / "summary.json").read_text())["spec"])
    assert spec.group_delivery == delivery
    model = keras.models.load_model(str(run_dir / "model.keras"), compile=False)
    if delivery == "dict":  # the run's per-group statistics reached the model
        for g, bands in GROUPS.items():
            assert model.get_layer(f"{g}_normalize").mean.shape[-1] == len(bands)
    classes, probabilities = _expected(model, _delivered(spec, [points / "testing.tfrecord.gz"]))
    got_classes, got_probabilities = _written(out, spec.num_classes)
    assert got_classes.shape == (1219, 1)
    np.testing.assert_array_equal(got_classes[:, 0], classes)
    np.testing.assert_allclose(got_probabilities[:, 0], probabilities, atol=1e-5)


@pytest.mark.parametrize("delivery", ["time", "dict"])
def test_an_image_run_on_band_groups(margin_export, tmp_path, delivery):
    import tf_keras as keras

    run_dir, spec = grouped_image_run(tmp_path / "run", delivery)
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
    run_dir, _ = grouped_image_run(tmp_path / "run", "time", model_delivery="dict")
    with pytest.raises(ModelMismatchError, match=r"the model takes \{a: \[batch, 20, 20, 2\], b: \[batch, 20, 20, "
                                                 r"2\]\}; .* gives \[batch, 2, 20, 20, 2\] per the run's spec "
                                                 r"\(band groups a: B2, B3; b: B4, B8, stacked on a time axis"):
        _run(run_dir, margin_export, tmp_path / "out")
    assert not (tmp_path / "out").exists()
