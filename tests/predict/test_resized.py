"""A run that resized its patches (`data: resize: R`) predicts and serves as it trained: the read patch (P cropped,
or the stored S) resized to R x R, the model's R x R logits resized back (bilinear) and cropped to P x P. Before,
predict read the stored size: a fixed-size model was refused and a fully convolutional one ran at another scale.
One run is trained (crop_margin true, resize R: the crop and the resize in training's pipeline); the uncropped
case is that run with `crop_margin` taken out of its spec (the only field the two runs' specs differ in; a model
of R x R input either way; the training pipeline's resize without a crop: tests/data/input/test_pipeline.py). Only the
training runs in a child process: `harness synth`, `predict` and `export` run in this one
(`predict_support.cli_in_process`)."""
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from predict_support import cli_in_process, read_outputs, run_cli


BANDS = ["B2", "B3", "B4"]
P, K, R = 16, 4, 8


def _stored(data):
    rows = []
    for path in sorted(data.glob("*.tfrecord.gz")):
        for raw in tf.data.TFRecordDataset(str(path), compression_type="GZIP"):
            f = tf.train.Example.FromString(raw.numpy()).features.feature
            rows.append(np.stack([np.array(f[b].float_list.value, np.float32).reshape(P + K, P + K)
                                  for b in BANDS], -1))
    return np.stack(rows)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resized") / "data"
    cli_in_process("synth", folder, "--shards", 2, "--records", 6, "--patch-size", P, "--kernel-size", K, "--bands",
                   *BANDS, "--classes", 3)
    return folder


@pytest.fixture(scope="module")
def cropped_run(data, tmp_path_factory):
    """A run trained with `data: {crop_margin: true, resize: R}`."""
    folder = tmp_path_factory.mktemp("resized_run")
    config = folder / "run.yaml"
    config.write_text(f"data:\n  crop_margin: true\n  resize: {R}\n")
    run_cli("train", "--config", config, "--data", data, "--label", "landcover", "--epochs", 1,
            "--global-batch-size", 2, "--num-classes", 3, "--output", folder / "run")
    return folder / "run"


@pytest.mark.parametrize("crop", [True, False])
def test_predict_resizes_in_and_back(data, cropped_run, tmp_path, crop):
    run_dir, out = tmp_path / "run", tmp_path / "pred"
    shutil.copytree(cropped_run, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["spec"]["crop_margin"] is True and summary["spec"]["resize"] == R
    if not crop:
        del summary["spec"]["crop_margin"]               # as a run of `crop_margin: false` writes its spec
        (run_dir / "summary.json").write_text(json.dumps(summary))
    cli_in_process("predict", "--model", run_dir, "--data", data, "--output", out)
    rows = read_outputs(sorted(out.glob("*.tfrecord")))
    got = np.stack([r["class"].reshape(P, P) for r in rows])

    import tf_keras as keras
    model = keras.models.load_model(str(run_dir / "model.keras"), compile=False)
    x = _stored(data)
    side = P if crop else P + K
    if crop:
        x = x[:, K // 2:K // 2 + P, K // 2:K // 2 + P]
    logits = model.predict_on_batch(tf.image.resize(x, [R, R], method="bilinear"))
    assert logits.shape == (6, R, R, 3)
    back = tf.image.resize(logits, [side, side], method="bilinear").numpy()
    if not crop:
        back = back[:, K // 2:K // 2 + P, K // 2:K // 2 + P]
    np.testing.assert_array_equal(got, np.argmax(back, -1))

    sm = tmp_path / "sm"
    r = cli_in_process("export", "--format", "savedmodel", "--model", run_dir, "--output", sm)
    assert f"inputTileSize=[{side}, {side}], inputOverlapSize=[{0 if crop else K // 2}" in r.stdout
    serve = tf.saved_model.load(str(sm)).signatures["grpc"]
    tiles = x if crop else _stored(data)
    served = serve(**{b: tf.constant(tiles[..., i]) for i, b in enumerate(BANDS)})["class"].numpy()
    np.testing.assert_array_equal(served, got)
