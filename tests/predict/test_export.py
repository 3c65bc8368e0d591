"""`harness export --format savedmodel`: loaded with `tf.saved_model.load`, a request built as Earth Engine builds
it (per band, a serialized tensor; any key order) gives the classes `harness predict` writes; a missing band is
an error naming it; the input names survive a reload and re-export; the run was trained under MirroredStrategy.
A run on band groups (time or dict) serves the Keras model's outputs, and a Keras 3 model holding random augmentation
layers and a softmax output serves its own predictions. The trained run also predicts through its
saved spec, checked against the same model called on each patch. Only the training runs in a child process:
`harness synth`, `export` and `predict` run in this one (`predict_support.cli_in_process`)."""
import json
import types

import numpy as np
import pytest
import tensorflow as tf
from predict_support import cli_in_process, read_outputs, run_cli


BANDS = ["B2", "B3", "B4"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`harness train` (MirroredStrategy, 2 CPU replicas) on `harness synth` data: 6 patches of 16 + margin 4 in 2
    shards; `harness predict --probabilities` of the run over them (its rows, classes and stdout); the stored
    patches per band, in order."""
    tmp = tmp_path_factory.mktemp("export")
    data, run_dir = tmp / "data", tmp / "run"
    cli_in_process("synth", data, "--shards", 2, "--records", 6, "--patch-size", 16, "--kernel-size", 4, "--bands",
                   *BANDS, "--classes", 3)
    run_cli("train", "--data", data, "--label", "landcover", "--epochs", 1, "--global-batch-size", 2,
            "--num-classes", 3, "--strategy", "mirrored", "--cpu-replicas", 2, "--output", run_dir)
    r = cli_in_process("predict", "--model", run_dir, "--data", data, "--output", tmp / "pred", "--probabilities")
    rows = read_outputs(sorted((tmp / "pred").glob("*.tfrecord")))
    classes = np.stack([row["class"].reshape(16, 16) for row in rows])
    patches = []
    for path in sorted(data.glob("*.tfrecord.gz")):
        for raw in tf.data.TFRecordDataset(str(path), compression_type="GZIP"):
            f = tf.train.Example.FromString(raw.numpy()).features.feature
            patches.append({b: np.array(f[b].float_list.value, np.float32).reshape(20, 20) for b in BANDS})
    return types.SimpleNamespace(tmp=tmp, run_dir=run_dir, rows=rows, classes=classes, stdout=r.stdout,
                                 patches=patches)


@pytest.fixture(scope="module")
def exported(trained):
    r = cli_in_process("export", "--format", "savedmodel", "--model", trained.run_dir, "--output", trained.tmp / "sm",
                       "--probabilities")
    return trained.tmp / "sm", r.stdout, trained.classes, trained.patches


def test_a_trained_run_predicts_in_order(trained):
    """The run's saved spec, and predict through it: counts, shapes and order (2 shards) checked against the same
    model called on each patch (was tests/predict/test_trained.py's, on a run trained for it alone)."""
    spec = json.loads((trained.run_dir / "summary.json").read_text())["spec"]
    assert spec["bands"] == BANDS and spec["patch_size"] == 16 and spec["kernel_margin"] == 4
    rows = trained.rows
    assert len(rows) == 6
    assert "earthengine upload image --asset_id=projects/my-project/assets/predictions" in trained.stdout
    assert set(rows[0]) == {"class", "probability_0", "probability_1", "probability_2"}
    assert all(v.size == 16 * 16 for row in rows for v in row.values())
    import tf_keras as keras
    model = keras.models.load_model(str(trained.run_dir / "model.keras"), compile=False)
    stored = np.stack([np.stack([p[b] for b in BANDS], -1) for p in trained.patches])
    expected = np.argmax(model.predict_on_batch(stored), -1)[:, 2:18, 2:18]
    np.testing.assert_array_equal(trained.classes, expected)


def _request(patches, bands):
    """Earth Engine's SERIALIZED_TF_TENSORS payload: per band, one serialized TensorProto per instance."""
    return {b: tf.constant([tf.io.serialize_tensor(p[b]).numpy() for p in patches]) for b in bands}


def test_the_serialized_signature_gives_predicts_classes(exported):
    path, stdout, classes, patches = exported
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    out = serve(**_request(patches, reversed(BANDS)))  # any key order
    got = np.stack([tf.io.parse_tensor(s, tf.uint8).numpy() for s in out["class"].numpy()])
    np.testing.assert_array_equal(got, classes)
    probs = np.stack([tf.io.parse_tensor(s, tf.float32).numpy() for s in out["probabilities"].numpy()])
    assert probs.shape == (6, 16, 16, 3)
    np.testing.assert_allclose(probs.sum(-1), 1, rtol=1e-5)
    assert ('payloadFormat="SERIALIZED_TF_TENSORS", inputTileSize=[20, 20], inputOverlapSize=[2, 2], '
            'outputTileSize=[16, 16], outputBands={"class": {"type": ee.PixelType.uint8(), "dimensions": 0}, '
            '"probabilities": {"type": ee.PixelType.float(), "dimensions": 1}}, outputMultiplier=') in stdout
    assert "maxPayloadBytes=1500000)" in stdout


def test_the_tensor_signature_gives_the_same_classes(exported):
    path, _, classes, patches = exported
    serve = tf.saved_model.load(str(path)).signatures["grpc"]
    out = serve(**{b: tf.constant(np.stack([p[b] for p in patches])) for b in BANDS})
    np.testing.assert_array_equal(out["class"].numpy(), classes)


def test_a_missing_band_is_an_error_naming_it(exported):
    path, _, _, patches = exported
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    with pytest.raises(TypeError, match=r"missing a required argument: 'B3'"):
        serve(**_request(patches, ["B2", "B4"]))


def test_names_survive_a_reload_and_re_export(exported, tmp_path):
    path, _, classes, patches = exported
    loaded = tf.saved_model.load(str(path))
    tf.saved_model.save(loaded, str(tmp_path / "again"), signatures=dict(loaded.signatures))
    again = tf.saved_model.load(str(tmp_path / "again")).signatures
    for name in ("serving_default", "grpc"):
        assert sorted(again[name].structured_input_signature[1]) == BANDS
    out = again["serving_default"](**_request(patches, BANDS))
    got = np.stack([tf.io.parse_tensor(s, tf.uint8).numpy() for s in out["class"].numpy()])
    np.testing.assert_array_equal(got, classes)


def test_a_table_model(tmp_path):
    """Per property a serialized float32 scalar per row; class = 0 where b > a (logits [b - a, 0])."""
    import tf_keras as keras

    x = keras.Input((2,))
    dense = keras.layers.Dense(2, use_bias=False)
    model = keras.Model(x, dense(x))
    dense.set_weights([np.array([[-1, 0], [1, 0]], np.float32)])
    model.save(str(tmp_path / "m.keras"))
    r = cli_in_process("export", "--model", tmp_path / "m.keras", "--output", tmp_path / "sm", "--bands", "a", "b")
    assert 'inputProperties=["a", "b"], outputProperties={"class": {"type": ee.PixelType.uint8()' in r.stdout
    rows = np.random.default_rng(0).normal(size=(9, 2)).astype(np.float32)
    request = {name: tf.constant([tf.io.serialize_tensor(v).numpy() for v in rows[:, j]])
               for j, name in enumerate(["b", "a"][::-1])}
    out = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"](**request)
    got = [int(tf.io.parse_tensor(s, tf.uint8)) for s in out["class"].numpy()]
    assert got == [0 if b > a else 1 for a, b in rows]


@pytest.mark.parametrize("delivery", ["time", "dict"])
def test_a_run_on_band_groups_serves_the_keras_models_outputs(margin_export, tmp_path, delivery):
    """The serving signatures group the per-band tiles as the run's pipeline delivers them (groups on a time axis,
    or one input per group): on the stored records, the SavedModel returns the Keras model's probabilities and
    classes, cropped to P x P."""
    import tf_keras as keras
    from predict_support import BANDS, K, P, grouped_image_run

    from harness.data.input import decode

    run_dir, spec = grouped_image_run(tmp_path / "run", delivery)
    cli_in_process("export", "--format", "savedmodel", "--model", run_dir, "--output", tmp_path / "sm",
                   "--probabilities")
    paths = [str(p) for p in sorted(margin_export.glob("*.tfrecord.gz"))]
    serialized = next(iter(tf.data.TFRecordDataset(paths, compression_type="GZIP").batch(1000)))
    model = keras.models.load_model(str(run_dir / "model.keras"), compile=False)
    a = K // 2
    logits = model(decode.decode(spec.replace(label=None), serialized), training=False)
    want = tf.nn.softmax(logits, -1).numpy()[:, a:a + P, a:a + P]
    parsed = tf.io.parse_example(serialized, decode.feature_description(spec.replace(label=None)))
    tiles = {b: tf.reshape(parsed[b], [-1, P + K, P + K]) for b in BANDS}
    signatures = tf.saved_model.load(str(tmp_path / "sm")).signatures
    dense = signatures["grpc"](**tiles)
    np.testing.assert_allclose(dense["probabilities"].numpy(), want, atol=1e-5)
    np.testing.assert_array_equal(dense["class"].numpy(), np.argmax(want, -1))
    request = {b: tf.map_fn(tf.io.serialize_tensor, t, fn_output_signature=tf.string) for b, t in tiles.items()}
    out = signatures["serving_default"](**request)
    got = np.stack([tf.io.parse_tensor(s, tf.float32).numpy() for s in out["probabilities"].numpy()])
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("kind", ["tf_keras", "keras3"])
def test_a_mixed_precision_model_is_served_in_float32(tmp_path, kind):
    """A model trained under mixed_float16 computes in float16 as saved; float16 kernels are slow on the CPUs of
    most serving hosts (tensorflow/tensorflow#35379): the SavedModel computes in float32, its classes those of the
    float16 model."""
    import importlib

    keras = importlib.import_module("tf_keras" if kind == "tf_keras" else "keras")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = keras.Input((4, 4, 2))
        y = keras.layers.Conv2D(3, 1, dtype="float32")(keras.layers.Conv2D(8, 3, padding="same")(x))
        model = keras.Model(x, y)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.save(str(tmp_path / "m.keras"))
    cli_in_process("export", "--model", tmp_path / "m.keras", "--output", tmp_path / "sm", "--bands", "a", "b",
                   "--patch-size", 4)
    serve = tf.saved_model.load(str(tmp_path / "sm")).signatures["grpc"]
    graph = serve.graph.as_graph_def()
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]   # the model's own functions
    halves = [n.name for n in nodes if any(a.type == tf.float16.as_datatype_enum for a in n.attr.values())]
    assert len(nodes) > 20 and halves == [], halves[:5]
    tile = np.random.default_rng(1).normal(size=(3, 4, 4, 2)).astype(np.float32)
    got = serve(a=tile[..., 0], b=tile[..., 1])["class"].numpy()
    np.testing.assert_array_equal(got, np.argmax(np.asarray(model(tile), np.float32), axis=-1))


def test_a_keras3_model_holding_random_augmentation_layers_exports_and_serves_its_predictions(tmp_path):
    """RandomFlip and RandomRotation keep their seed state in Keras 3 variables that the model's TensorFlow tracking
    does not reach (the export failed with a raw KeyError); identity at inference, the SavedModel serves what the
    model's own predict gives. Its last layer applies softmax: the probabilities served are its outputs, not
    softmax applied to them again."""
    import keras

    x = keras.Input((8, 8, 2))
    h = keras.layers.RandomRotation(0.2)(keras.layers.RandomFlip()(x))
    h = keras.layers.Conv2D(4, 3, padding="same")(h)
    model = keras.Model(x, keras.layers.Conv2D(3, 1, activation="softmax")(h))
    model.save(str(tmp_path / "m.keras"))
    cli_in_process("export", "--model", tmp_path / "m.keras", "--output", tmp_path / "sm", "--bands", "a", "b",
                   "--patch-size", 8, "--probabilities")
    tile = np.random.default_rng(2).normal(size=(3, 8, 8, 2)).astype(np.float32)
    out = tf.saved_model.load(str(tmp_path / "sm")).signatures["grpc"](a=tile[..., 0], b=tile[..., 1])
    want = model.predict(tile, verbose=0)
    np.testing.assert_allclose(out["probabilities"].numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["class"].numpy(), np.argmax(want, -1))
