"""The real ACES patch (256x256x8, its renamed mixer) predicted by a run trained on synthetic patches with its
bands: one Example of 65536 class ids, read back by `inspect` as an export of the same grid. (A trained run
predicting in order, checked against the same model called on each patch: tests/predict/test_export.py's
`test_a_trained_run_predicts_in_order`, on the run that file trains.) Only the training runs in a child process:
`harness synth` and `predict` run in this one (`predict_support.cli_in_process`)."""
import json
import shutil

import numpy as np
import tensorflow as tf
from predict_support import check_map, cli_in_process, read_outputs, run_cli

from harness.data.export import inspect as inspect_lib

ACES_BANDS = ["blue_before", "blue_during", "green_before", "green_during", "nir_before", "nir_during",
              "red_before", "red_during"]


def _train(tmp, *, patch, kernel, records, bands, label="landcover"):
    data, out = tmp / "data", tmp / "run"
    cli_in_process("synth", data, "--shards", 3, "--records", records, "--patch-size", patch, "--kernel-size",
                   kernel, "--bands", *bands, "--label", label, "--classes", 3)
    run_cli("train", "--data", data, "--label", label, "--epochs", 1, "--global-batch-size", 2, "--num-classes", 3,
            "--output", out)
    return data, out


def _patches(path, bands, side, compression="GZIP"):
    rows = []
    for raw in tf.data.TFRecordDataset(str(path), compression_type=compression):
        f = tf.train.Example.FromString(raw.numpy()).features.feature
        rows.append(np.stack([np.array(f[b].float_list.value, np.float32).reshape(side, side) for b in bands], -1))
    return np.stack(rows)


def test_the_real_aces_patch(tmp_path, shared_data):
    _, run_dir = _train(tmp_path, patch=256, kernel=0, records=3, bands=ACES_BANDS)
    aces = tmp_path / "aces"
    shutil.copytree(shared_data / "gee-aces-image", aces)
    out = tmp_path / "pred"
    r = cli_in_process("predict", "--model", run_dir, "--data", aces, "--output", out)
    assert sorted(p.name for p in out.iterdir()) == ["image_2021-00000.tfrecord", "image_2021-mixer.json",
                                                     "image_2021.png", "image_2021.tif", "image_2021.tif.aux.xml",
                                                     "predict.json"]
    # the real export's georeference: EPSG:4326, 8.98e-5 degrees per pixel from (89.39, 27.448), every pixel
    found = check_map(out, "image_2021")
    assert found["profile"]["crs"].to_epsg() == 4326 and found["profile"]["transform"].c == 89.39005136557161
    mixer = json.loads((out / "image_2021-mixer.json").read_text())
    assert mixer == json.loads((aces / "image_2021.json").read_text())
    (row,) = read_outputs([out / "image_2021-00000.tfrecord"])
    assert row["class"].dtype == np.int64 and row["class"].size == 256 * 256 and set(row["class"]) <= {0, 1, 2}
    import tf_keras as keras
    model = keras.models.load_model(str(run_dir / "model.keras"), compile=False)
    expected = np.argmax(model.predict_on_batch(_patches(aces / "image_2021.tfrecord.gz", ACES_BANDS, 256)), -1)
    np.testing.assert_array_equal(row["class"].reshape(256, 256), expected[0])
    rep = inspect_lib.report([str(out)])
    assert rep["mixer"]["totalPatches"] == 1 and rep["mixer"]["patchDimensions"] == [256, 256]
    assert rep["features"] == [{"name": "class", "dtype": "int64", "values": 65536,
                                "patch": "256x256 (mixer patchDimensions 256x256)"}]
    assert rep["total_records"] == 1
    assert r.stdout.strip().splitlines()[-2:] == [
        f"gcloud storage cp {out}/image_2021-00000.tfrecord {out}/image_2021-mixer.json gs://BUCKET/PATH/",
        "earthengine upload image --asset_id=projects/my-project/assets/predictions "
        "gs://BUCKET/PATH/image_2021-00000.tfrecord gs://BUCKET/PATH/image_2021-mixer.json"]
