"""harness/train/model/loadable.py: a user's model saved and loaded again before the first step, in Keras 3 and in
tf-keras (the model files of tests/train/model/user_models/): those that load again pass; an unregistered layer, a
subclassed model without get_config, a Lambda and a get_config that leaves out an argument are each refused with
one line naming the class and the fix (`harness train` refusing the Lambda model before its first step: test_user.py's
`test_train_refuses_them_before_its_first_step`); the built-in models load again. The check builds no strategy and trains nothing: all of it runs in this process."""
import pathlib
import re
from types import MappingProxyType

import pytest

from harness import model_code
from harness.errors import ModelError
from harness.train.model import loadable, user
from harness.train.options import TrainOptions

MODELS = pathlib.Path(__file__).resolve().parent / "user_models"
FILES = {"keras3": MODELS / "keras3_models.py", "tf_keras": MODELS / "tf_keras_models.py"}
DECORATOR = {"keras3": "@keras.saving.register_keras_serializable()",
             "tf_keras": "@tf_keras.saving.register_keras_serializable()"}
DOC = '(docs/model.md, "What a model may hold")'
INPUTS = user.ModelInputs(input_shape=(4,), patch_size=None, bands=("B2", "B3", "B4", "B8"),
                          band_groups=MappingProxyType({}), num_classes=3, task="classification", kind="table",
                          label_shape=(), policy="float32")


def _built(kind: str, function: str):
    """The model of `function` in the kind's model file, built and checked as `harness train` builds it, and the
    builder (its origin, its recorded code)."""
    builder = user.resolve(TrainOptions(data=("d",), model=f"{FILES[kind]}:{function}"))
    model = builder.fn(INPUTS)
    user.check_model(model, INPUTS, origin=builder.origin)
    return model, builder


def _check(kind: str, function: str) -> float:
    model, builder = _built(kind, function)
    return loadable.check(model, INPUTS, origin=builder.origin, code=builder.code)


@pytest.mark.parametrize("kind", ["keras3", "tf_keras"])
@pytest.mark.parametrize("function", ["registered_layer", "subclassed"])
def test_a_registered_layer_and_a_subclassed_model_with_get_config_load_again(kind, function):
    assert 0 < _check(kind, function) < 30


@pytest.mark.parametrize("kind", ["keras3", "tf_keras"])
def test_an_unregistered_layer_is_named_with_the_decorator(kind):
    with pytest.raises(ModelError) as e:
        _check(kind, "unregistered_layer")
    assert str(e.value) == (
        f"model {FILES[kind]}:unregistered_layer: class Doubled (layer 'doubled') is not registered with Keras, so "
        "predict, evaluate, export and --init-from could not load the trained model: decorate it with "
        f"{DECORATOR[kind]} {DOC}")


def test_a_subclassed_model_without_get_config_is_named():
    """Keras 3 cannot make its get_config (a constructor argument it cannot serialize); tf-keras saves it with an
    empty config, which does not load again: each names the class and what to add."""
    with pytest.raises(ModelError) as e:
        _check("keras3", "subclassed_without_config")
    assert str(e.value) == (
        f"model {FILES['keras3']}:subclassed_without_config: class WithoutConfig (layer 'without_config') has no "
        "get_config(), and Keras cannot make one from its constructor's arguments (positional ones, or values it "
        f"cannot serialize): add get_config() returning them, and from_config() for those that are not plain values "
        f"{DOC}")
    with pytest.raises(ModelError) as e:
        _check("tf_keras", "subclassed_without_config")
    assert str(e.value) == (
        f"model {FILES['tf_keras']}:subclassed_without_config: saved, it does not load again as predict, evaluate "
        "and export load it: TypeError: Unable to revive model from config.; WithoutConfig (layer 'without_config') "
        "defines no get_config(): add one returning its constructor's arguments (and from_config() for those that "
        f"are not plain values) {DOC}")


@pytest.mark.parametrize("kind", ["keras3", "tf_keras"])
def test_a_lambda_layer_is_refused_with_the_fix(kind):
    with pytest.raises(ModelError) as e:
        _check(kind, "lambda_layer")
    held = ("saves its function as bytecode" if kind == "tf_keras" else "holds a Python lambda")
    also = "" if kind == "tf_keras" else " (or give Lambda a named function, registered the same way)"
    assert str(e.value) == (
        f"model {FILES[kind]}:lambda_layer: Lambda layer 'halve' {held}, which Keras' safe mode refuses to load "
        f"(predict, evaluate and export load in safe mode): write it as a Layer subclass with call(), decorated with "
        f"{DECORATOR[kind]}{also} {DOC}")


@pytest.mark.parametrize("kind", ["keras3", "tf_keras"])
def test_a_get_config_that_leaves_out_an_argument_computes_other_outputs_once_loaded(kind):
    with pytest.raises(ModelError) as e:
        _check(kind, "forgotten_argument")
    assert re.fullmatch(
        rf"model {re.escape(str(FILES[kind]))}:forgotten_argument: loaded again, it computes other outputs than the "
        r"model built \(by up to [\d.]+, same weights, same inputs\): a get_config\(\) of Forgetful \(layer "
        rf"'forgetful'\) leaves out an argument its constructor takes {re.escape(DOC)}", str(e.value)), str(e.value)


@pytest.mark.parametrize("kind", ["keras3", "tf_keras"])
def test_the_built_in_models_load_again(kind):
    """The run skips the check for them (`RunParts.check_loadable`): Keras' own layers, tested here once."""
    from harness import keras_kinds
    from harness.train.model import parts

    for data, shape in (("image", (16, 16, 4)), ("table", (4,))):
        model = parts.builtin_model(data, shape, 3, mean=[0.0] * 4, variance=[1.0] * 4, keras_kind=kind)
        inputs = INPUTS if data == "table" else user.ModelInputs(
            input_shape=shape, patch_size=16, bands=INPUTS.bands, band_groups=MappingProxyType({}), num_classes=3,
            task="classification", kind="image", label_shape=(16, 16), policy="float32")
        loadable.check(model, inputs, origin="built-in")
        assert keras_kinds.of_model(model) == kind


def test_the_saved_copy_records_the_model_file_and_its_text(tmp_path):
    model, builder = _built("keras3", "registered_layer")
    path = str(tmp_path / "m.keras")
    model.save(path)
    model_code.write(path, builder.code)
    code = model_code.read(path)
    assert code.given == f"{FILES['keras3']}:registered_layer" and code.path == str(FILES["keras3"])
    assert code.module == "harness_user_keras3_models" and code.function == "registered_layer"
    assert code.source == FILES["keras3"].read_text() and code.sha256 == builder.code.sha256


def test_the_cost_script_prints_its_figures():
    """scripts/loadable_cost.py (docs/model.md's figures), smoke-sized: one check of each model, 16x16 patches."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parent / "scripts"))
    try:
        import loadable_cost
    finally:
        sys.path.pop(0)
    lines = []
    figures = loadable_cost.measure(repeats=1, side=16, say=lines.append)
    assert len(figures) == 4 and all(0 < v < 30 for v in figures.values()), figures
    assert re.fullmatch(r"U-Net 16x16x4 \(tf_keras\): [\d.]+ CPU-s per check \(median of 1; first [\d.]+\)", lines[0])
