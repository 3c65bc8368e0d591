"""A model trained on a table export (rows of bands, as Earth Engine exports sampled points) predicts an image
export of the same bands pixel by pixel (`harness.predict.model.Geometry.per_pixel`): every pixel's class is the
model applied to that pixel's bands, the kernel margin cut, on 1 worker (`harness predict`, in this process:
`predict_support.cli_in_process`) and on 2 (`harness launch local`)."""
import json
import sys

import numpy as np
import pytest
import tensorflow as tf
from predict_support import check_map, cli_in_process, read_outputs, run_cli

from harness.data.export import synth
from harness.predict import describe, model as model_lib

BANDS, P, K = ("B2", "B3", "B8"), 96, 4    # 5 patches, 3 per row: a 288 x 192 map, overviews


@pytest.fixture(scope="module")
def points_and_scene(tmp_path_factory):
    root = tmp_path_factory.mktemp("per_pixel")
    synth.write_table_export(str(root / "points"), prefix="points", shards=2, records=512, bands=BANDS,
                             label="class", classes=3, seed=4)
    # Patches of P + K with the bands in another order, and a band the model does not take: matched by name.
    synth.write_image_export(str(root / "scene"), prefix="scene", shards=3, records=5, bands=("B8", "B4", "B2", "B3"),
                             label=None, patch_size=P, kernel_size=K, seed=5)
    run_cli("train", "--data", root / "points", "--label", "class", "--epochs", 1, "--output", root / "run")
    return root


def _expected(root) -> np.ndarray:
    """argmax of the run's model over each patch's central P x P pixels, read straight from the records."""
    model = model_lib.load(str(root / "run")).model
    s, m = P + K, K // 2
    description = {b: tf.io.FixedLenFeature([s * s], tf.float32) for b in BANDS}
    classes = []
    for path in sorted((root / "scene").glob("*.tfrecord.gz")):
        for raw in tf.data.TFRecordDataset(str(path), compression_type="GZIP"):
            ex = tf.io.parse_single_example(raw, description)
            patch = np.stack([ex[b].numpy().reshape(s, s) for b in BANDS], -1)[m:m + P, m:m + P]
            logits = model(patch.reshape(-1, len(BANDS)), training=False)
            classes.append(np.argmax(np.asarray(logits), -1).reshape(P, P))
    return np.array(classes)


@pytest.mark.parametrize("workers", [1, 2])
def test_every_pixel_is_the_table_model_applied_to_its_bands(points_and_scene, tmp_path, workers):
    root = points_and_scene
    predict = ["predict", "--model", root / "run", "--data", root / "scene", "--output", tmp_path / "preds",
               *(["--probabilities"] if workers == 2 else [])]
    if workers == 1:
        cli_in_process(*predict)
    else:
        run_cli("launch", "local", "--workers", 2, "--timeout", 240, "--", sys.executable, "-m", "harness.cli",
                *predict)
    outputs = sorted((tmp_path / "preds").glob("*.tfrecord"))
    got = np.array([row["class"].reshape(P, P) for row in read_outputs(outputs)])
    want = _expected(root)
    assert got.shape == (5, P, P) and len(np.unique(want)) > 1
    np.testing.assert_array_equal(got, want)
    mixer = json.loads((tmp_path / "preds" / "scene-mixer.json").read_text())
    assert mixer["totalPatches"] == 5
    # The map: placed by the mixer, the sixth slot of the 3 x 2 grid nodata; 2 workers add the probabilities.
    names = ["class 0", "class 1", "class 2"] if workers == 2 else None
    found = check_map(tmp_path / "preds", "scene", probabilities=names)
    assert found["overviews"] == [2] and found["profile"]["dtype"] == "uint8" and found["profile"]["nodata"] == 255
    assert len({found["colormap"][i] for i in range(3)}) == 3 and found["colormap"][255] == (0, 0, 0, 0)
    assert found["categories"] == ["class 0", "class 1", "class 2"]   # where GDAL and QGIS find the names
    assert (tmp_path / "preds" / "scene.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # `harness inspect` of the folder reads it as predictions: the map's pixels per class, the empty slot nodata
    predictions = describe.describe([str(tmp_path / "preds")])
    counts = np.bincount(got.ravel(), minlength=3)
    assert predictions["maps"][0]["class_counts"] == {f"class {i}": int(counts[i]) for i in range(3)}
    assert predictions["maps"][0]["nodata_pixels"] == P * P and predictions["bands"] == list(BANDS)
    assert predictions["maps"][0]["nodata"] == 255   # a uint8 class map's (harness.predict.maps)
    assert f"; nodata (value 255, declared in the map): {P * P} pixels" in describe.format_text(predictions)



def test_the_geometry_of_a_row_model_and_the_runs_it_refuses():
    import tf_keras as keras

    from harness.data.spec.dataspec import DataSpec
    from harness.errors import ModelMismatchError

    x = keras.Input((3,))
    loaded = model_lib.LoadedModel(keras.Model(x, keras.layers.Dense(4)(x)), "m.keras", "0",
                                   DataSpec(kind="table", bands=BANDS, label="class"))
    scene = DataSpec(kind="image", bands=BANDS, patch_size=P, kernel_margin=K)
    assert model_lib.check(loaded, scene, "scene-00000") == model_lib.Geometry(P + K, 0, P, 4, per_pixel=True)
    grouped = model_lib.LoadedModel(loaded.model, "m.keras", "0", DataSpec(
        kind="table", bands=BANDS, label="class", band_groups={"t0": ("B2",), "t1": ("B3", "B8")}))
    with pytest.raises(ModelMismatchError, match=r"^m.keras: the run was trained on a table export with band "
                                                 r"groups .*train without groups to map an image export$"):
        model_lib.check(grouped, scene, "scene-00000")
    wide = model_lib.LoadedModel(loaded.model, "m.keras", "0", DataSpec(kind="table", bands=("B2", "B3"),
                                                                        label="class"))
    with pytest.raises(ModelMismatchError, match=r"the model takes 3 bands, scene-00000 gives 2"):
        model_lib.check(wide, scene.replace(bands=("B2", "B3")), "scene-00000")
