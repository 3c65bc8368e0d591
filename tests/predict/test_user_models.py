"""A user's model file holding their own classes, through every command that loads a run: a registered subclassed
model with get_config holding a registered custom layer (tests/train/model/user_models/), in Keras 3 and in
tf-keras, trained (16 rows, 1 epoch, then resumed from the backup for a second), then loaded by `harness predict`,
`evaluate`, `export` and `--init-from` with the model file deleted and its module and registered classes forgotten
by this process: only the copy recorded in the `.keras` can define them. Predictions, probabilities, the loss and the
copied weights equal the trained model's own.

docs/model.md's block ("What a model may hold") runs as printed: `harness train` of examples/custom_layer.py (a
layer of the user's, Keras 3) is a process of its own; predict, evaluate and export then run in this process,
which never imported that file.

Everything but that one training runs in this process (`job.run`, `predict_support.cli_in_process`)."""
import contextlib
import dataclasses
import importlib
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from predict_support import cli_in_process, read_outputs

from harness.data.export import synth

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "train" / "model" / "user_models"
FILES = {"keras3": "keras3_models.py", "tf_keras": "tf_keras_models.py"}
PACKAGES = {"keras3": "harness_tests_keras3", "tf_keras": "harness_tests_tf_keras"}
BANDS = ["B2", "B3", "B4", "B8"]


def _keras(kind):
    return importlib.import_module("keras" if kind == "keras3" else "tf_keras")


def _forget(kind: str, module: str) -> None:
    """This process as one that never ran the model file: its module gone, its registered classes unknown."""
    objects = _keras(kind).saving.get_custom_objects()
    for name in [n for n in objects if n.startswith(PACKAGES[kind] + ">")]:
        del objects[name]
    sys.modules.pop(module, None)


def _rows(folder: pathlib.Path):
    """Every record's bands `[rows, 4]` float32 and class `[rows]`, in the export's order."""
    x, y = [], []
    for path in sorted(folder.glob("*.tfrecord.gz")):
        for raw in tf.data.TFRecordDataset(str(path), compression_type="GZIP"):
            f = tf.train.Example.FromString(raw.numpy()).features.feature
            x.append([f[b].float_list.value[0] for b in BANDS])
            y.append(int(f["class"].float_list.value[0]))
    return np.asarray(x, np.float32), np.asarray(y)


@pytest.fixture(scope="module", params=["keras3", "tf_keras"])
def trained(request, tmp_path_factory):
    """A run of the kind's `subclassed` model from a copy of its model file, 1 epoch then resumed for a second; the
    trained model's own probabilities on every row; then the copy deleted and the file's module forgotten."""
    from harness.train import job
    from harness.train.options import TrainOptions

    kind = request.param
    keras = _keras(kind)
    tmp = tmp_path_factory.mktemp(kind)
    synth.write_table_export(str(tmp / "data"), prefix="points", shards=1, records=16, classes=3, seed=3)
    model_file = shutil.copy(MODELS / FILES[kind], tmp / f"mine_{kind}.py")

    class Capture(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            self.trained = self.model

    capture = Capture()
    options = TrainOptions(data=(str(tmp / "data"),), epochs=1, per_replica_batch_size=8, strategy="single",
                           output=str(tmp / "run"), model=f"{model_file}:subclassed")
    first = job.run(options, data_config={"label": "class"}, callbacks=[capture])
    resumed = job.run(dataclasses.replace(options, epochs=2), data_config={"label": "class"}, callbacks=[capture])
    x, y = _rows(tmp / "data")
    probabilities = tf.nn.softmax(capture.trained(x, training=False)).numpy()
    module = f"harness_user_mine_{kind}"
    pathlib.Path(model_file).unlink()
    _forget(kind, module)
    with pytest.raises(TypeError, match="Could not (locate|deserialize) class 'Classifier'"):   # Keras alone
        keras.models.load_model(str(tmp / "run" / "model.keras"), compile=False)
    return dict(kind=kind, tmp=tmp, run=tmp / "run", data=tmp / "data", first=first, resumed=resumed, x=x, y=y,
                probabilities=probabilities, model=capture.trained, module=module,
                summary=json.loads((tmp / "run" / "summary.json").read_text()))


@pytest.fixture
def fresh(trained):
    """The trained run, this process made to forget its model file again before each test."""
    _forget(trained["kind"], trained["module"])
    yield trained


def test_the_run_records_its_model_file_and_resumes(fresh):
    run = fresh["summary"]["run"]["model_code"]
    assert run["module"] == fresh["module"] and run["function"] == "subclassed" and os.path.isabs(run["path"])
    assert run["path"] == str(fresh["tmp"] / f"mine_{fresh['kind']}.py") and "source" not in run
    assert fresh["first"]["final_step"] == 2 and fresh["resumed"]["initial_step"] == 2
    assert fresh["resumed"]["final_step"] == 4 and fresh["summary"]["keras"] == fresh["kind"]


def test_predict_imports_the_recorded_copy_and_gives_the_trained_models_probabilities(fresh, tmp_path):
    cli_in_process("predict", "--model", fresh["run"], "--data", fresh["data"], "--output", tmp_path,
                   "--format", "tfrecord", "--probabilities")
    rows = read_outputs(sorted(tmp_path.glob("*.tfrecord")))
    got = np.stack([[row[f"probability_{c}"][0] for c in range(3)] for row in rows])
    np.testing.assert_allclose(got, fresh["probabilities"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal([row["class"][0] for row in rows], fresh["probabilities"].argmax(1))
    source = (MODELS / FILES[fresh["kind"]]).read_text()
    assert sys.modules[fresh["module"]].__harness_source__ == source   # the copy ran, the file being gone


def test_evaluate_scores_the_trained_models_loss(fresh, tmp_path):
    cli_in_process("evaluate", "--model", fresh["run"], "--data", fresh["data"], "--output", tmp_path)
    metrics = json.loads((tmp_path / "evaluation.json").read_text())["metrics"]
    p, y = fresh["probabilities"], fresh["y"]
    np.testing.assert_allclose(metrics["val_loss"], -np.log(p[np.arange(len(y)), y]).mean(), rtol=1e-5)
    assert metrics["val_accuracy"] == pytest.approx((p.argmax(1) == y).mean())


def test_export_serves_the_trained_models_classes_and_probabilities(fresh, tmp_path):
    cli_in_process("export", "--format", "savedmodel", "--model", fresh["run"], "--output", tmp_path / "sm",
                   "--probabilities")
    serve = tf.saved_model.load(str(tmp_path / "sm")).signatures["grpc"]
    out = serve(**{b: tf.constant(fresh["x"][:, i]) for i, b in enumerate(BANDS)})
    np.testing.assert_allclose(out["probabilities"].numpy(), fresh["probabilities"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["class"].numpy(), fresh["probabilities"].argmax(1))


def test_init_from_imports_the_recorded_copy_and_copies_the_layers_by_name(fresh):
    """A plain functional model of the kind with the run's "hidden" and "logits" layers: `--init-from`'s copy."""
    from harness.train.model.user import init_weights

    keras = _keras(fresh["kind"])
    x = keras.Input((4,))
    h = keras.layers.Dense(16, activation="relu", name="hidden")(x)
    model = keras.Model(x, keras.layers.Dense(3, name="logits")(h))
    line = init_weights(model, str(fresh["run"]))
    assert line == (f"init-from {fresh['run']}/model.keras: 2 layers loaded; shapes differ (kept initialized): "
                    "none; not in the saved model: none; saved but not in the model: none")   # scale: no weights
    for name in ("hidden", "logits"):
        for a, b in zip(model.get_layer(name).get_weights(), fresh["model"].get_layer(name).get_weights()):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_model_file_that_no_longer_imports_is_one_line(fresh, tmp_path, capsys):
    """The recorded copy imports a module this machine lacks (here: its text edited in the .keras): predict says
    which file, what failed and what to do, in one line."""
    import zipfile

    from harness import model_code

    path = tmp_path / "model.keras"
    with zipfile.ZipFile(fresh["run"] / "model.keras") as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == model_code.ENTRY:
                code = json.loads(data)
                code["source"] = "import a_package_this_machine_lacks\n" + code["source"]
                code["sha256"] = "other"
                data = json.dumps(code)
            dst.writestr(item, data)
    shutil.copy(fresh["run"] / "summary.json", tmp_path / "summary.json")
    r = cli_in_process("predict", "--model", path, "--data", fresh["data"], "--output", tmp_path / "out", ok=False)
    given = f"{fresh['tmp']}/mine_{fresh['kind']}.py:subclassed"
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.match(re.escape(
        f"harness predict: UserCodeError: --model {path} was trained with --model {given}; importing its recorded "
        "copy failed: ModuleNotFoundError: No module named 'a_package_this_machine_lacks': install what it imports "
        "here (or put it on PYTHONPATH) (without it: TypeError: Could not ") + "(locate|deserialize) class 'Classifier'",
        r.stderr.strip().splitlines()[-1]), r.stderr


# --- docs/model.md's block, as printed --------------------------------------------------------------------------
DOC = ROOT / "docs" / "model.md"


def test_the_docs_custom_layer_block_runs_as_printed(tmp_path):
    """Train in a process of its own, from a folder holding examples/custom_layer.py; the file is then deleted, and
    predict, evaluate and export run in this process, which never imported it: the copy in the run loads."""
    section = DOC.read_text().partition("\n## What a model may hold\n")[2].split("\n## ", 1)[0]
    block = re.search(r"^```\n(harness synth.*?)^```$", section, re.S | re.M).group(1)
    lines = [line for line in block.replace("\\\n", "").splitlines() if line.strip()]
    assert [shlex.split(line)[1] for line in lines] == ["synth", "train", "predict", "evaluate", "export"]
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "custom_layer.py", tmp_path / "examples" / "custom_layer.py")
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    out = {}
    for line in lines:
        argv = shlex.split(line.split("  #")[0])
        if argv[1] == "train":
            r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, (line, r.stdout[-2000:], r.stderr[-2000:])
            (tmp_path / "examples" / "custom_layer.py").unlink()
            assert "harness_user_custom_layer" not in sys.modules
        else:
            with contextlib.chdir(tmp_path):
                r = cli_in_process(*argv[1:])
        out[argv[1]] = r.stdout
    run = tmp_path / "runs" / "custom"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["run"]["model_code"]["path"] == str(tmp_path / "examples" / "custom_layer.py")
    assert "NormalizedDifferences" in sys.modules["harness_user_custom_layer"].__harness_source__
    assert [h["epoch"] for h in summary["history"]] == [1]
    evaluation = json.loads((run / "evaluation.json").read_text())
    assert evaluation["records"] == 64 and "evaluate: 64 records" in out["evaluate"]
    assert "wrote sm (signatures serving_default" in out["export"]
    assert any(tmp_path.glob("preds/*.csv")), out["predict"]
