"""A user's own model (`--model`, `model_fn`, `--model-args`, `--init-from`): loaded, checked and refused with
messages that name the module, the layer and the shapes; the two examples in examples/ build and train."""
import json
import pathlib
import subprocess
import sys
from types import MappingProxyType

import numpy as np
import pytest
import tf_keras as keras

from harness import keras_kinds
from harness.data.spec.dataspec import DataSpec
from harness.errors import ConfigError, ModelError, UserCodeError
from harness.train.model import builtin, user as user_model
from harness.train.options import TrainOptions
from harness.train.model.user import ModelInputs, check_model, init_weights, load_function
import procs

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
CLI = [sys.executable, "-m", "harness.cli"]


def _inputs(shape=(3,), classes=3, label_shape=(), kind="table", policy="float32", bands=("a", "b", "c"), **kw):
    return ModelInputs(input_shape=shape, patch_size=shape[0] if kind == "image" else None, bands=bands,
                       band_groups=MappingProxyType({}), num_classes=classes, task="classification", kind=kind,
                       label_shape=label_shape, policy=policy, **kw)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# --- loading --------------------------------------------------------------------------------------------------
def test_load_function_from_a_file_and_a_module(tmp_path, monkeypatch):
    path = _write(tmp_path, "mine.py", "def build(inputs, width=4):\n    return ('built', width)\n")
    assert load_function(f"{path}:build")(None) == ("built", 4)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_function("mine:build")(None, width=8) == ("built", 8)


@pytest.mark.parametrize("source, spec, message", [
    (None, "nocolon", "--model 'nocolon': expected MODULE:FUNCTION or path/to/file.py:FUNCTION"),
    (None, "/nonexistent/model.py:build", "--model: no file '/nonexistent/model.py'"),
    ("import not_a_real_package_xyz\n", "{path}:build",
     "cannot import module '{path}': ModuleNotFoundError: No module named 'not_a_real_package_xyz'"),
    ("def build(inputs):\n    return None\nsyntax error here\n", "{path}:build",
     "cannot import module '{path}': SyntaxError: invalid syntax"),
    ("def other(inputs):\n    pass\n", "{path}:build", "module '{path}' has no 'build' (it has: ['other'])"),
    ("build = 3\n", "{path}:build", "{path}.build is a int, not a function"),
])
def test_load_function_refusals_name_the_module_and_error(tmp_path, source, spec, message):
    path = _write(tmp_path, "user_mod.py", source) if source else None
    with pytest.raises(UserCodeError) as e:
        load_function(spec.format(path=path))
    assert message.format(path=path) in str(e.value)


def test_a_keras3_model_is_checked_as_a_tf_keras_one(tmp_path):
    import keras as keras3

    path = _write(tmp_path, "k3.py", "import keras\n\ndef build(inputs):\n    return keras.Sequential()\n")
    assert keras_kinds.of(load_function(f"{path}:build")) == keras_kinds.KERAS3
    check_model(keras3.Sequential([keras3.Input((3,)), keras3.layers.Dense(3)]), _inputs(), origin="m:f")
    with pytest.raises(ModelError, match=r"output shape \[batch, 2\] does not fit labels \[batch\] with 3 classes"):
        check_model(keras3.Sequential([keras3.Input((3,)), keras3.layers.Dense(2)]), _inputs(), origin="m:f")
    with pytest.raises(UserCodeError, match="m:f returned builtins.dict, not a Keras model"):
        check_model({}, _inputs(), origin="m:f")


def test_a_keras3_file_given_to_a_tf_keras_model_is_refused_by_name(tmp_path):
    import keras as keras3

    saved = tmp_path / "k3.keras"
    keras3.Sequential([keras3.Input((3,)), keras3.layers.Dense(3, name="head")]).save(saved)
    assert keras_kinds.of_file(str(saved)) == keras_kinds.KERAS3
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, name="head")])
    with pytest.raises(UserCodeError, match=r"--init-from .*k3.keras: a Keras 3 model file; this model is tf-keras"):
        init_weights(model, str(saved))
    # Keras 3 reads it (and tf-keras files too)
    other = keras3.Sequential([keras3.Input((3,)), keras3.layers.Dense(3, name="head")])
    assert "1 layers loaded" in init_weights(other, str(saved))


def test_resolve_refusals():
    options = TrainOptions(data=("x",), model="m:f")
    with pytest.raises(ConfigError, match="both model_fn .* and --model 'm:f' given"):
        user_model.resolve(options, lambda inputs: None)
    with pytest.raises(ConfigError, match="--model-args {'depth': 4} given without --model"):
        user_model.resolve(TrainOptions(data=("x",), model_args={"depth": 4}))
    built = builtin.pixel_classifier(3, 3)
    with pytest.raises(UserCodeError, match="model_fn is a built model \\(Functional 'pixel_classifier'\\): pass the "
                                            "function that builds it"):
        user_model.resolve(TrainOptions(data=("x",)), built)
    with pytest.raises(ConfigError, match="train.model_args: expected a mapping of keyword arguments, got '4'"):
        TrainOptions(data=("x",), model_args="4")


# --- checks of the built model ----------------------------------------------------------------------------------
def test_output_that_does_not_fit_the_labels_is_refused():
    mask = _inputs(shape=(8, 8, 3), classes=4, label_shape=(8, 8), kind="image")
    flat = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])
    with pytest.raises(ModelError) as e:
        check_model(flat, mask, origin="my:model")
    assert str(e.value) == ("model my:model: output shape [batch, 10] does not fit labels [batch, 8, 8] with 4 "
                            "classes: expected [batch, 8, 8, 4] (logits, channels-last)")
    with pytest.raises(ModelError, match=r"output shape \[batch, 10\] does not fit labels \[batch\] with 3 classes"):
        check_model(builtin.pixel_classifier(3, 10), _inputs(), origin="my:model")
    check_model(builtin.pixel_classifier(3, 3), _inputs())  # fits: no error
    check_model(builtin.unet(8, 8, 3, 4, filters=(4, 8)), mask)


def test_float16_output_under_mixed_policy_names_the_layer():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = inputs = keras.Input((3,))
        x = keras.layers.Dense(8, name="hidden")(x)
        model = keras.Model(inputs, keras.layers.Dense(3, name="head")(x))
        with pytest.raises(ModelError) as e:
            check_model(model, _inputs(policy="mixed_float16"), origin="f.py:build")
        assert str(e.value) == ("model f.py:build: output is float16 under policy mixed_float16: give its last layer "
                                "'head' dtype=\"float32\" (logits and loss in float32; Keras mixed precision guide)")
        check_model(builtin.pixel_classifier(3, 3), _inputs(policy="mixed_float16"))  # float32 logits: fine
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_subclassed_model_is_checked_by_a_forward_pass():
    class Head(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(5)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(ModelError, match=r"output shape \[batch, 5\] does not fit labels \[batch\] with 3 classes"):
        check_model(Head(), _inputs())


def test_a_dict_of_groups_needs_inputs_named_as_the_groups():
    grouped = _inputs(shape=MappingProxyType({"before": (4,), "during": (4,)}))
    x = {"before": keras.Input((4,), name="before"), "after": keras.Input((4,), name="after")}
    model = keras.Model(x, keras.layers.Dense(3)(keras.layers.Concatenate()(list(x.values()))))
    with pytest.raises(ModelError, match=r"takes inputs \{after: \[4\], before: \[4\]\}; band_groups "
                                         r"\(group_delivery: dict\) deliver \{before: \[4\], during: \[4\]\}: give "
                                         "the model one keras.Input per group, named as the group"):
        check_model(model, grouped)


def test_band_statistics_of_dict_groups_are_per_group():
    """Inputs delivered as a dict: a mean and variance per group, of the group's bands, over every other axis;
    ModelInputs carries them as read-only mappings of floats, in the groups' order."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    before, during = rng.normal(size=(12, 5, 2)), rng.normal(3.0, 2.0, size=(12, 3))
    ds = tf.data.Dataset.from_tensor_slices(({"before": before, "during": during}, np.zeros(12))).batch(4)
    mean, variance = builtin.band_moments(ds, batches=8)
    assert list(mean) == list(variance) == ["before", "during"]
    np.testing.assert_allclose(mean["before"], before.reshape(-1, 2).mean(0))
    np.testing.assert_allclose(variance["during"], during.var(0))

    class Run:  # the fields of harness.train.inputs.Inputs that ModelInputs reads
        spec = DataSpec(kind="table", bands=(), label="y", band_groups={"before": ("a", "b"), "during": ("c", "d", "e")})
        num_classes = 3
    Run.mean, Run.variance = mean, variance
    described = ModelInputs.from_inputs(Run, "float32")
    assert isinstance(described.mean, MappingProxyType)
    assert described.variance["during"] == tuple(variance["during"].tolist())


# --- examples ---------------------------------------------------------------------------------------------------
def test_examples_build_fitting_models():
    deep = load_function(f"{EXAMPLES}/deep_unet.py:build")
    image = _inputs(shape=(16, 16, 3), classes=4, label_shape=(16, 16), kind="image", mean=(0.0,) * 3,
                    variance=(1.0,) * 3)
    model = deep(image, depth=3, base_filters=4)
    check_model(model, image)
    assert model.get_layer("encoder").output_shape[-1] == (None, 4, 4, 16)  # 3 stages: 16 -> 8 -> 4 pixels
    temporal = load_function(f"{EXAMPLES}/temporal_pixel.py:build")
    series = _inputs(shape=(2, 4), classes=5, mean=(0.0,) * 4, variance=(1.0,) * 4)
    check_model(temporal(series), series)
    grouped = _inputs(shape=MappingProxyType({"before": (4,), "during": (4,)}), classes=5,
                      mean=MappingProxyType({"before": (1.0,) * 4, "during": (2.0,) * 4}),
                      variance=MappingProxyType({"before": (1.0,) * 4, "during": (4.0,) * 4}))
    model = temporal(grouped)
    check_model(model, grouped)
    assert model.get_layer("stack_time").output_shape == (None, 2, 4)
    np.testing.assert_allclose(model.get_layer("during_normalize").mean.numpy().ravel(), [2.0] * 4)
    with pytest.raises(ValueError, match="temporal_pixel: expected per-pixel inputs \\(time, bands\\)"):
        temporal(image)
    keras3 = load_function(f"{EXAMPLES}/keras3_unet.py:build")
    model = keras3(image)
    check_model(model, image)
    assert keras_kinds.of_model(model) == keras_kinds.KERAS3 and model.output_shape == (None, 16, 16, 4)


# --- init-from --------------------------------------------------------------------------------------------------
def test_init_from_matches_layers_by_name_and_names_mismatches(tmp_path):
    trained = builtin.pixel_classifier(3, 3, hidden=(8, 8))
    for w in trained.weights:
        w.assign(np.random.default_rng(0).normal(size=w.shape))
    trained.save(tmp_path / "model.keras")
    fresh = builtin.pixel_classifier(3, 4, hidden=(8, 8))  # a new head: 4 classes
    line = init_weights(fresh, str(tmp_path))               # a run folder holding model.keras
    for name in ("dense_0", "dense_1", "normalize"):
        for a, b in zip(fresh.get_layer(name).get_weights(), trained.get_layer(name).get_weights()):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(fresh.get_layer("logits").get_weights()[1], trained.get_layer("logits").get_weights()[1])
    assert line == (f"init-from {tmp_path}/model.keras: 3 layers loaded; shapes differ (kept initialized): "
                    "['logits [(8, 4), (4,)] vs saved [(8, 3), (3,)]']; not in the saved model: none; saved but not "
                    "in the model: none")
    other = builtin.unet(8, 8, 2, 2, filters=(4, 8))  # 2 bands: even "normalize" differs
    with pytest.raises(ModelError, match="no layer of the model matches a layer of .*model.keras by name and shape"):
        init_weights(other, str(tmp_path / "model.keras"))
    with pytest.raises(ModelError, match="--init-from /nonexistent.keras: cannot load /nonexistent.keras"):
        init_weights(other, "/nonexistent.keras")


# --- end to end: the CLI on the real ACES points ----------------------------------------------------------------
def _cli(*args, timeout=300):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_cli_import_failure_is_one_line(tmp_path, capsys):
    """`harness train` in this process: refused before the data is read (nothing trains)."""
    from harness import cli

    path = _write(tmp_path, "broken.py", "import not_a_real_package_xyz\n")
    code = cli.main(["train", "--data", "/nonexistent", "--model", f"{path}:build"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert (f"harness train: UserCodeError: --model '{path}:build': cannot import module '{path}': "
            "ModuleNotFoundError: No module named 'not_a_real_package_xyz'") in err  # before the data is read


def _aces_flags(points, output, *extra, model=EXAMPLES / "temporal_pixel.py:build", model_args='{"dropout": 0.2}'):
    # 1 epoch: validation accuracy ~0.73 on 1 worker and on 2 (majority 0.36); a 2-process epoch is ~6 CPU-s of steps
    return ["train", "--config", EXAMPLES / "aces_points.yaml", "--data", points / "training.tfrecord.gz",
            "--validation-data", points / "validation.tfrecord.gz", "--model", model, "--model-args", model_args,
            "--loss", EXAMPLES / "losses.py:smoothed_crossentropy", "--per-replica-batch-size", "64", "--epochs", "1",
            "--seed", "1", "--output", output, *extra]


@pytest.fixture(scope="module")
def aces_two(shared_data, tmp_path_factory):
    """examples/temporal_pixel.py (filters 32, hidden 64) with a custom loss trained on 2 workers (`harness launch
    local`): the run folder, read by the 1-and-2-worker proof and fine-tuned by the temporal example's test."""
    out = tmp_path_factory.mktemp("aces") / "two"
    two = _cli("launch", "local", "--workers", "2", "--timeout", "400", "--", sys.executable, "-m", "harness.cli",
               *map(str, _aces_flags(shared_data / "gee-aces-points", out)), timeout=450)
    assert two.returncode == 0, (two.stdout[-2000:], two.stderr[-3000:])
    return out


@pytest.fixture(scope="module")
def aces_one(shared_data, aces_two, tmp_path_factory):
    """The same model file and loss on 1 worker, fine-tuned from `aces_two` with a narrower hidden layer (the model
    given as a path relative to the working folder): its run folder and stdout. One process carries the temporal
    example's fine-tuning and the proof's 1-worker run (each was a process of ~5 CPU-s)."""
    out = tmp_path_factory.mktemp("aces") / "one"
    one = _cli(*_aces_flags(shared_data / "gee-aces-points", out, "--init-from", aces_two,
                            model="examples/temporal_pixel.py:build", model_args='{"dropout": 0.2, "hidden": 32}'))
    assert one.returncode == 0, one.stderr[-3000:]
    return out, one.stdout


def test_temporal_example_trains_on_aces_points_and_fine_tunes(aces_two, aces_one):
    """The example trained on the points (the 2-worker run of the proof below, `aces_two`) is fine-tuned with a
    narrower hidden layer on 1 worker (`aces_one`, the proof's 1-worker run), the model given as a path relative to
    the working folder: the convolution loads, the two layers after it are named."""
    summary = json.loads((aces_two / "summary.json").read_text())
    assert summary["history"][-1]["val_accuracy"] > 0.6  # the majority class is 36% of the points
    _, stdout = aces_one
    assert (f"init-from {aces_two}/model.keras: 1 layers loaded; shapes differ (kept initialized): "
            "['hidden [(64, 32), (32,)] vs saved [(64, 64), (64,)]', 'logits [(32, 5), (5,)] vs saved [(64, 5), "
            "(5,)]']") in stdout, stdout[-3000:]


def test_user_model_and_loss_on_aces_points_one_and_two_workers(aces_one, aces_two):
    """The proof of issue 14: a user model file with dropout and a custom per-example loss trains on 1 worker (the
    fine-tuning of `aces_one`) and on 2 (`harness launch local`, `aces_two`), with identical final weights on both
    workers and a validation accuracy well above the majority share (0.36)."""
    for folder, workers in ((aces_one[0], 1), (aces_two, 2)):
        summary = json.loads((folder / "summary.json").read_text())
        digests = summary["workers_weights_sha256"]
        assert len(digests) == workers and len(set(digests)) == 1, digests
        assert digests[0] == summary["weights_sha256"][:12]
        assert summary["history"][-1]["val_accuracy"] > 0.6, summary["history"]
        assert summary["plan"]["global_batch_size"] == 64 * workers
        last = summary["history"][-1]  # metrics of one confusion matrix over every worker's validation share
        matrix = np.array(last["val_confusion_matrix"])
        # every one of the 2385 validation points scored once, on 1 worker and over 2 (the last batches partial)
        assert matrix.shape == (5, 5) and matrix.sum() == 2385 == last["val_records"] == last["val_pixels"]
        assert last["val_accuracy"] == np.trace(matrix) / matrix.sum() and 0 < last["val_mean_iou"] < 1


def test_user_model_and_loss_on_aces_points_two_horovod_ranks(shared_data, tmp_path):
    """The same proof on 2 Horovod ranks (`horovodrun --gloo`, `--backend horovod`): identical final weights on both
    ranks, validation accuracy well above the majority share, one confusion matrix over both ranks' shares."""
    import os

    points = shared_data / "gee-aces-points"
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    horovodrun = [*procs.HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo"]
    r = subprocess.run([*map(str, horovodrun), *CLI, *map(str, _aces_flags(points, tmp_path / "hvd", "--backend",
                                                                           "horovod"))],
                       capture_output=True, text=True, timeout=450, cwd=ROOT, env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    summary = json.loads((tmp_path / "hvd" / "summary.json").read_text())
    assert [s["rank"] for s in summary["ranks"]] == [0, 1]
    assert len({s["weights_sha256"] for s in summary["ranks"]}) == 1
    last = summary["history"][-1]
    assert last["val_accuracy"] > 0.6, summary["history"]
    matrix = np.array(last["val_confusion_matrix"])
    assert matrix.sum() == 2385 and last["val_accuracy"] == np.trace(matrix) / matrix.sum()


# --- refused before any data is read (QA) ------------------------------------------------------------------------
def test_model_args_the_function_cannot_take_are_refused_at_resolve(tmp_path):
    path = _write(tmp_path, "m.py", "def build(inputs, depth=2):\n    pass\n")
    with pytest.raises(UserCodeError) as e:
        user_model.resolve(TrainOptions(data=["d"], model=f"{path}:build", model_args={"bogus": 1}))
    assert str(e.value).startswith(f"model {path}:build: cannot be called with ModelInputs and model_args "
                                   "{'bogus': 1}: got an unexpected keyword argument 'bogus' (it takes "
                                   "build(inputs, depth=2))")
    assert user_model.resolve(TrainOptions(data=["d"], model=f"{path}:build", model_args={"depth": 3})).model_args == {"depth": 3}


def test_init_from_a_missing_path_is_refused_at_resolve(tmp_path):
    with pytest.raises(ModelError, match=rf"^--init-from {tmp_path}/nope.keras: no file {tmp_path}/nope.keras "
                                         r"\(give a .keras model or a run folder holding model.keras\)$"):
        user_model.resolve(TrainOptions(data=["d"], init_from=str(tmp_path / "nope.keras")))
    with pytest.raises(ModelError, match=rf"no file {tmp_path}/model.keras"):  # a run folder without its model
        user_model.resolve(TrainOptions(data=["d"], init_from=str(tmp_path)))


@pytest.mark.parametrize("shape, delivered", [((2, 4), "[2, 4] (group_delivery: time)"),
                                              (MappingProxyType({"before": (4,), "during": (4,)}),
                                               "{before: [4], during: [4]} (group_delivery: dict)")])
def test_builtin_model_refuses_band_group_inputs_with_what_to_do(shape, delivered):
    with pytest.raises(ConfigError) as e:
        user_model.builtin(_inputs(shape=shape))
    assert str(e.value) == (f"the built-in table model takes one input [bands]; band_groups deliver {delivered}: "
                            "give --model (e.g. examples/temporal_pixel.py:build for a table export) or drop "
                            "band_groups from the data config")


def test_regression_output_of_the_wrong_shape_names_both_shapes_it_takes():
    x = keras.Input((3,))
    model = keras.Model(x, keras.layers.Dense(3, name="out")(x))
    with pytest.raises(ModelError) as e:
        check_model(model, dataclasses_replace(_inputs(classes=1), task="regression"), origin="m.py:build")
    assert str(e.value) == ("model m.py:build: output shape [batch, 3] does not fit regression labels [batch]: "
                            "expected [batch] or [batch, 1] (one value per example)")


def dataclasses_replace(obj, **kw):
    import dataclasses
    return dataclasses.replace(obj, **kw)


def test_a_missing_model_file_is_one_error_for_init_from_and_predict(tmp_path):
    """`--init-from` raised ModelError, `predict --model` PredictError, each with its own wording and its own copy
    of "model.keras in a run folder": now one function (run_folder.find_model) and one type, caught as either."""
    from harness.errors import ModelFileError, PredictError
    from harness.predict import model as predict_model

    with pytest.raises(ModelFileError) as init:
        user_model.resolve(TrainOptions(data=["d"], init_from=str(tmp_path)))
    with pytest.raises(ModelFileError) as predict:
        predict_model.load(str(tmp_path))
    assert isinstance(init.value, ModelError) and isinstance(predict.value, PredictError)
    tail = f" {tmp_path}: no file {tmp_path}/model.keras (give a .keras model or a run folder holding model.keras)"
    assert (str(init.value), str(predict.value)) == ("--init-from" + tail, "--model" + tail)


# --- what the harness trains otherwise or refuses (issue 64) ---------------------------------------------------------
USER_MODELS = pathlib.Path(__file__).resolve().parent / "user_models"
MODEL_FILES = {"keras3": USER_MODELS / "keras3_models.py", "tf_keras": USER_MODELS / "tf_keras_models.py"}
BANDS4 = _inputs(shape=(4,), classes=3)


def _kind(kind):
    import importlib

    return importlib.import_module("keras" if kind == "keras3" else "tf_keras")


@pytest.mark.parametrize("kind", ["keras3", "tf_keras"])
def test_a_softmax_output_is_found_in_every_form_a_user_writes_it(kind):
    """`keras_kinds.softmax_output`, the one place predict, export and the loss learn it: the output's own layer
    (its Keras history), a nested model's, a subclassed model's last layer; logits are not probabilities."""
    import tensorflow as tf

    k = _kind(kind)
    x = k.Input((4,))
    h = k.layers.Dense(3, name="scores")(x)
    ops_softmax = k.ops.softmax(h) if kind == "keras3" else tf.nn.softmax(h)
    forms = {"dense": k.layers.Dense(3, activation="softmax", name="probs")(x), "layer": k.layers.Softmax(name="sm")(h),
             "activation": k.layers.Activation("softmax", name="act")(h), "op": ops_softmax}
    found = {form: keras_kinds.softmax_output(k.Model(x, out)) for form, out in forms.items()}
    assert found["dense"] == "probs" and found["layer"] == "sm" and found["activation"] == "act" and found["op"]
    assert keras_kinds.softmax_output(k.Model(x, h)) is None
    # the softmax feeds a last layer of logits: the output is not probabilities
    assert keras_kinds.softmax_output(k.Model(x, k.layers.Dense(3)(forms["dense"]))) is None
    inner = k.Sequential([k.Input((4,)), k.layers.Dense(3, activation="softmax", name="inner_head")])
    assert keras_kinds.softmax_output(k.Model(x, inner(k.layers.Dense(4)(x)))) == "inner_head"
    assert keras_kinds.softmax_output(inner) == "inner_head"
    builder = user_model.resolve(TrainOptions(data=("d",), model=f"{MODEL_FILES[kind]}:subclassed"))
    assert keras_kinds.softmax_output(builder.fn(BANDS4)) is None   # its last layer: logits


@pytest.mark.parametrize("kind", ["keras3", "tf_keras"])
def test_a_model_input_other_than_the_exports_bands_is_one_line_naming_both(kind):
    builder = user_model.resolve(TrainOptions(data=("d",), model=f"{MODEL_FILES[kind]}:three_bands"))
    inputs = dataclasses_replace(BANDS4, bands=("B2", "B3", "B4", "B8"))
    with pytest.raises(ModelError) as e:
        check_model(builder.fn(inputs), inputs, origin="m.py:three_bands")
    assert str(e.value) == ("model m.py:three_bands takes input [batch, 3]; the export delivers [batch, 4] (4 bands: "
                            "B2, B3, B4, B8): build the model's input from the shape it is given "
                            "(keras.Input(inputs.input_shape))")
    k = _kind(kind)
    x = k.Input((16, 16, 3))
    patches = _inputs(shape=(16, 16, 4), classes=2, label_shape=(16, 16), kind="image", bands=inputs.bands)
    with pytest.raises(ModelError, match=r"takes input \[batch, 16, 16, 3\]; the export delivers \[batch, 16, 16, "
                                         r"4\] \(4 bands: B2, B3, B4, B8\)"):
        check_model(k.Model(x, k.layers.Conv2D(2, 1)(x)), patches)

    class Fixed(k.Model):   # no declared input: the forward pass fails, named with the delivered input
        def call(self, x):
            return k.layers.Reshape((3,), name="reshape")(x)   # named: an automatic name counts the process's layers

    with pytest.raises(ModelError) as e:
        check_model(Fixed(), inputs, origin="m.py:fixed")
    failed = {"keras3": "ValueError calling Reshape.call(): The total size of the tensor must be unchanged. Received: "
                        "input_shape=(4,), target_shape=(3,)",
              "tf_keras": "InvalidArgumentError calling layer 'reshape' (type Reshape): Input to reshape is a tensor "
                          "with 8 values, but the requested shape has 6 [Op:Reshape]"}
    assert str(e.value) == ("model m.py:fixed: fails on the input the export delivers, [batch, 4] (4 bands: B2, B3, "
                            f"B4, B8): {failed[kind]}")


@pytest.mark.parametrize("kind", ["keras3", "tf_keras"])
def test_a_models_own_train_step_and_a_compiled_model_are_refused_by_name(kind):
    def refusal(function):
        builder = user_model.resolve(TrainOptions(data=("d",), model=f"{MODEL_FILES[kind]}:{function}"))
        with pytest.raises(ModelError) as e:
            check_model(builder.fn(BANDS4), BANDS4, origin=f"m.py:{function}")
        return str(e.value)

    assert refusal("own_train_step") == (
        "model m.py:own_train_step: OwnStep defines train_step(), which the harness never calls: the harness runs its "
        "own step on every replica (the model's call(), --loss, the gradients summed over the replicas, --optimizer, "
        "--clip-norm): put what it adds in call() (self.add_loss() for a loss term of the model's) or in --loss "
        "MODULE:FUNCTION; then remove train_step() (docs/model.md)")
    assert refusal("compiled") == (
        "model m.py:compiled was compiled with optimizer SGD in the model function, which the harness does not use: "
        "it builds its own optimizer in the strategy's scope, from --optimizer adam|adamw|sgd, --learning-rate, "
        "--schedule, --momentum, --weight-decay (the loss: --loss): remove model.compile(...) and give those flags (a "
        "KerasHub task compiles itself: build it with compile=False) (docs/model.md)")


@pytest.mark.parametrize("function, message", [
    ("three_bands", "takes input [batch, 3]; the export delivers [batch, 4] (4 bands: B2, B3, B4, B8)"),
    ("compiled", "was compiled with optimizer SGD in the model function"),
    ("own_train_step", "OwnStep defines train_step(), which the harness never calls"),
    ("lambda_layer", ": Lambda layer 'halve' holds a Python lambda"),   # unloadable (train/model/loadable.py)
])
def test_train_refuses_them_before_its_first_step(tmp_path, function, message):
    """`harness train` in this process, as the command line runs it: exit 2, one line, no step, nothing saved."""
    import contextlib
    import io

    from harness import cli
    from harness.data.export import synth

    synth.write_table_export(str(tmp_path / "data"), prefix="points", shards=1, records=16, classes=3, seed=1)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["train", "--data", str(tmp_path / "data"), "--label", "class", "--epochs", "1",
                         "--global-batch-size", "8", "--strategy", "single",
                         "--model", f"{MODEL_FILES['keras3']}:{function}", "--output", str(tmp_path / "run")])
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and "Traceback" not in err.getvalue(), err.getvalue()[-3000:]
    assert lines[-1].startswith(f"harness train: ModelError: model {MODEL_FILES['keras3']}:{function}"), lines[-1]
    assert message in lines[-1], lines[-1]
    assert "epoch 1/1" not in out.getvalue() and not (tmp_path / "run" / "model.keras").exists()
