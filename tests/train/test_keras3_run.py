"""A Keras 3 model (`import keras`: examples/keras3_unet.py) through the whole job as a user runs it: `harness train`
on 2 MirroredStrategy replicas with validation, the best epoch kept, --clip-norm and AdamW; the same command again
with more epochs resumes from the backup; `harness predict` and `harness export` read the Keras 3 file; a tf-keras
model given it with --init-from is refused by name. One run, read by every test; what trains is a real process, the
rest (synth, predict, export, the refusals met before any step) runs in this one (`harness.cli.main`)."""
import json

import numpy as np
import pytest
import tensorflow as tf
from predict_support import read_outputs, run_cli

from harness import cli, keras_kinds

BANDS = ["B2", "B3", "B4"]
EXAMPLE = "examples/keras3_unet.py:build"
# One level: a block of two convolutions with BatchNormalization, and the logits. Keras 3 traces an AdamW update per
# variable and replica: 8 trainable variables rather than the default's 22 make each training process ~2.5 CPU-s
# cheaper (and the export ~0.8).
MODEL_ARGS = '{"filters": [8]}'


@pytest.fixture(scope="module")
def keras3_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keras3")
    data, val, run_dir = tmp / "data", tmp / "val", tmp / "run"
    for folder, seed in ((data, 1), (val, 2)):
        assert cli.main(["synth", str(folder), "--shards", "2", "--records", "8", "--patch-size", "16", "--bands",
                         *BANDS, "--classes", "3", "--seed", str(seed)]) == 0
    train = ["train", "--data", data, "--validation-data", val, "--label", "landcover", "--num-classes", 3,
             "--model", EXAMPLE, "--model-args", MODEL_ARGS, "--strategy", "mirrored", "--cpu-replicas", 2,
             "--global-batch-size", 4, "--optimizer", "adamw", "--clip-norm", 1.0, "--monitor", "val_loss",
             "--output", run_dir]
    first = run_cli(*train, "--epochs", 2)
    summary_2 = json.loads((run_dir / "summary.json").read_text())
    resumed = run_cli(*train, "--epochs", 3)
    summary_3 = json.loads((run_dir / "summary.json").read_text())
    assert cli.main(["predict", "--model", str(run_dir), "--data", str(data), "--output", str(tmp / "pred")]) == 0
    assert cli.main(["export", "--format", "savedmodel", "--model", str(run_dir), "--output", str(tmp / "sm")]) == 0
    return dict(tmp=tmp, data=data, run=run_dir, first=first, resumed=resumed, summary_2=summary_2,
                summary_3=summary_3)


def test_the_run_trains_a_keras3_model_and_saves_it_as_keras3(keras3_run):
    s = keras3_run["summary_2"]
    assert s["keras"] == "keras3"
    assert keras_kinds.of_file(str(keras3_run["run"] / "model.keras")) == keras_kinds.KERAS3
    assert s["plan"]["steps_per_epoch"] == 2   # 8 patches, global batch 4
    assert [h["epoch"] for h in s["history"]] == [1, 2] and s["final_step"] == 4 and s["optimizer_iterations"] == 4
    assert all(np.isfinite(h["loss"]) and np.isfinite(h["val_loss"]) for h in s["history"])
    assert s["best"]["epoch"] in (1, 2) and (keras3_run["run"] / "best" / "model.keras").exists()
    assert s["learning_rate"]["peak"] > 0


def test_the_same_command_with_more_epochs_resumes_from_the_backup(keras3_run):
    s = keras3_run["summary_3"]
    assert s["initial_step"] == 4 and s["final_step"] == 6 and s["optimizer_iterations"] == 6
    assert [h["epoch"] for h in s["history"]] == [3]


def test_predict_and_export_read_the_keras3_file(keras3_run):
    rows = read_outputs(sorted((keras3_run["tmp"] / "pred").glob("*.tfrecord")))
    classes = np.stack([row["class"].reshape(16, 16) for row in rows])
    assert classes.shape == (8, 16, 16) and set(np.unique(classes)) <= {0, 1, 2}
    serve = tf.saved_model.load(str(keras3_run["tmp"] / "sm")).signatures["grpc"]
    patches = {b: [] for b in BANDS}
    for path in sorted(keras3_run["data"].glob("*.tfrecord.gz")):
        for raw in tf.data.TFRecordDataset(str(path), compression_type="GZIP"):
            f = tf.train.Example.FromString(raw.numpy()).features.feature
            for b in BANDS:
                patches[b].append(np.array(f[b].float_list.value, np.float32).reshape(16, 16))
    out = serve(**{b: tf.constant(np.stack(v)) for b, v in patches.items()})
    np.testing.assert_array_equal(out["class"].numpy(), classes)


def _refused(capsys, *args):
    """`harness ARGS` in this process: its exit code and stderr."""
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    return code, capsys.readouterr().err


def test_a_tf_keras_model_given_the_keras3_run_by_init_from_is_refused(keras3_run, tmp_path, capsys):
    code, err = _refused(capsys, "train", "--data", keras3_run["data"], "--label", "landcover", "--num-classes", 3,
                         "--epochs", 1, "--init-from", keras3_run["run"], "--global-batch-size", 4, "--output",
                         tmp_path / "run")
    assert code == 2, err[-3000:]
    assert "a Keras 3 model file; this model is tf-keras" in err and "Traceback" not in err


def test_the_keras3_runs_backup_resumed_with_a_tf_keras_model_is_refused_by_name(keras3_run, tmp_path, capsys):
    import shutil

    run_dir = shutil.copytree(keras3_run["run"], tmp_path / "run")   # the built-in model is tf-keras
    code, err = _refused(capsys, "train", "--data", keras3_run["data"], "--label", "landcover", "--num-classes", 3,
                         "--epochs", 4, "--global-batch-size", 4, "--output", run_dir)
    assert code == 2, err[-3000:]
    assert "was written by a different run (keras: backup 'keras3', now 'tf_keras')" in err, err[-3000:]
