"""A user's own model: `--model MODULE:FUNCTION` or `--model path/to/file.py:FUNCTION` (`train.model`), with
`--model-args JSON` (`train.model_args`) as keyword arguments, or `harness.train.job.run(options, model_fn=...)`.

The function receives one frozen `ModelInputs` (what the input pipeline delivers) and returns a Keras model, of
Keras 3 (`import keras`) or tf-keras (`import tf_keras`): the run is of the model's kind (`harness.keras_kinds`),
mapping those inputs to logits (or to probabilities: a last layer that applies softmax, `keras_kinds.softmax_output`)
with a float32 last layer. `--seed` seeds the weights it builds (`seed_weights`). The harness calls it under the
strategy's scope (under Horovod, the default scope), once per worker, then checks the model before the first step:
  - what the harness would not use, refused by name: a `train_step`, `test_step` or `compute_loss` of the model's
    own class, a model compiled in the function (its optimizer: the harness builds its own from the flags);
  - its input: the shape the model declares against the delivered one, named with the bands and their count;
  - its output: `[batch, classes]` for table labels `[batch]`, `[batch, H, W, classes]` for masks `[batch, H, W]`;
  - its output dtype under a mixed policy: float32, else the layer to give `dtype="float32"` is named (Keras mixed
    precision guide: tensorflow.org/guide/mixed_precision#building_the_model).
`--init-from MODEL.keras|RUN_DIR` then copies trained weights layer by layer, matched by name (the model file recorded
in that `.keras` imported first: `harness.model_code`). The job then saves a user's model and loads it again before
the first step (`harness.train.model.loadable`), as `predict`, `evaluate`, `export` and `--init-from` will load it.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
from types import MappingProxyType
from typing import Callable, Mapping, Optional

from harness import model_code
from harness.errors import ConfigError, ModelError, UserCodeError


@dataclasses.dataclass(frozen=True)
class ModelInputs:
    """What the input pipeline delivers to the model, decided once per run (the argument of a user's model
    function).

    Attributes:
      input_shape: the model's input shape without the batch axis, channels-last: `(height, width, bands)` for
        image patches after crop/resize, `(bands,)` for table rows; with band groups a mapping {group: shape}
        (group_delivery "dict": one named input per group) or `(time, ..., bands)` (group_delivery "time").
      patch_size: the delivered patch side in pixels (after crop of the kernel margin or resize); None for tables.
      bands: every input band, in delivery order.
      band_groups: group name -> its bands (empty without groups).
      num_classes: classes of the label (the output's last axis); for regression the outputs per pixel (1: the
        model returns `[batch, *label_shape]` or `[batch, *label_shape, 1]`).
      task: "classification" or "regression".
      kind: "image" or "table".
      label_shape: the label's shape without the batch axis: `(height, width)` for masks, `()` for tables.
      policy: the Keras precision policy in force ("float32", "mixed_float16", "mixed_bfloat16"); the last
        layer must stay float32.
      mean, variance: per-band float statistics of a training sample, for a Normalization layer on the inputs
        (`harness.train.model.builtin.band_moments`): a tuple `(bands,)`; with group_delivery "time" `(bands per
        group,)`, each band position's over every time step; with group_delivery "dict" a mapping {group: tuple
        of the group's bands' statistics}, one Normalization per named input (see examples/temporal_pixel.py).
    """

    input_shape: object
    patch_size: Optional[int]
    bands: tuple
    band_groups: Mapping[str, tuple]
    num_classes: int
    task: str
    kind: str
    label_shape: tuple
    policy: str
    mean: object = ()
    variance: object = ()

    @classmethod
    def from_inputs(cls, inputs, policy: str) -> "ModelInputs":
        """From a run's `harness.train.inputs.Inputs` and the policy applied."""
        spec = inputs.spec
        shape = spec.input_shape
        if isinstance(shape, dict):
            shape = MappingProxyType({g: tuple(s) for g, s in shape.items()})
        return cls(input_shape=shape, patch_size=spec.output_size if spec.kind == "image" else None,
                   bands=tuple(spec.bands), band_groups=MappingProxyType(dict(spec.band_groups)),
                   num_classes=inputs.num_classes, task=spec.task, kind=spec.kind, label_shape=tuple(spec.label_shape),
                   policy=policy, mean=_statistics(inputs.mean), variance=_statistics(inputs.variance))


def _statistics(values):
    """Band statistics (an array, or a dict of them per group) as a tuple of floats (a read-only mapping of them)."""
    import numpy as np

    if isinstance(values, Mapping):
        return MappingProxyType({g: tuple(np.ravel(v).tolist()) for g, v in values.items()})
    return tuple(np.ravel(values).tolist())


def load_function(text: str, *, flag: str = "--model") -> Callable:
    """The function named by `MODULE:FUNCTION` (importable module) or `path/to/file.py:FUNCTION`.

    Raises:
      UserCodeError: naming the module (or file) and the error: no `:FUNCTION`, a file that does not exist, an
        import that fails (with its exception), no such attribute (with the names the module has), not callable.
    """
    return _load(text, flag)[1]


def _load(text: str, flag: str) -> tuple:
    """`(module, function)` of `load_function`."""
    module_name, sep, name = text.rpartition(":")
    if not sep or not module_name or not name:
        raise UserCodeError(f"{flag} {text!r}: expected MODULE:FUNCTION or path/to/file.py:FUNCTION")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            module = model_code.import_file(module_name, flag)
        else:
            module = importlib.import_module(module_name)
    except UserCodeError:
        raise
    except Exception as e:  # the user's module may raise anything while importing
        raise UserCodeError(f"{flag} {text!r}: cannot import module {module_name!r}: {type(e).__name__}: {e}") from e
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise UserCodeError(f"{flag} {text!r}: module {module_name!r} has no {name!r} (it has: {public[:20]})")
    fn = getattr(module, name)
    if not callable(fn):
        raise UserCodeError(f"{flag} {text!r}: {module_name}.{name} is a {type(fn).__name__}, not a function")
    return module, fn


class ModelBuilder:
    """Builds the run's model under the strategy's scope: the user's function (or the built-in model), then the
    checks, then `--init-from`.

    Args:
      fn: `fn(ModelInputs, **model_args) -> keras.Model` (Keras 3 or tf-keras).
      origin: how the user named it (for messages).
      model_args: keyword arguments for `fn`.
      init_from: a `.keras` file or a run folder holding `model.keras`, or None.
      code: the code `fn` comes from (`harness.model_code.ModelCode`), recorded in every `.keras` the run saves so
        that the commands that load it import it first; None for the built-in model and a function of `__main__`.
      seed: `--seed`: the random state the function builds the model from (`seed_weights`); None: not seeded.
    """

    def __init__(self, fn: Callable, origin: str, model_args: Optional[dict] = None, init_from: Optional[str] = None,
                 code: Optional[model_code.ModelCode] = None, seed: Optional[int] = None):
        self.fn, self.origin, self.model_args, self.init_from = fn, origin, dict(model_args or {}), init_from
        self.code, self.seed = code, seed

    @property
    def is_builtin(self) -> bool:
        """The harness's own model (`builtin`), whose layers are all Keras' own."""
        return self.fn is builtin

    def build(self, inputs, policy: str, say: Callable[..., None] = lambda *a, **k: None):
        """The checked model for a run's `Inputs` under `policy` (call under the strategy's scope).

        Raises:
          UserCodeError: the function fails (named with its error) or returns no Keras model.
          ModelError: from `check_model` and `init_weights`.
        """
        described = ModelInputs.from_inputs(inputs, policy)
        seed_weights(self.seed)
        try:
            model = self.fn(described, **self.model_args)
        except TypeError as e:
            raise UserCodeError(f"model {self.origin}: calling it with ModelInputs and model_args "
                                f"{self.model_args} failed: {e}") from e
        check_model(model, described, origin=self.origin)
        if self.init_from:
            say(init_weights(model, self.init_from))
        return model


def resolve(options, model_fn: Optional[Callable] = None) -> ModelBuilder:
    """The run's `ModelBuilder`, resolved before any data is read (an import failure stops the run there): `model_fn` (Python API), else `options.model`, else the built-in model.

    Raises:
      ConfigError: both `model_fn` and `options.model` given, or `model_args` without a model.
      UserCodeError: from `load_function`; a model object passed instead of a function.
    """
    args, init = getattr(options, "model_args", None), getattr(options, "init_from", None)
    seed = getattr(options, "seed", None)
    if init:
        _check_init_from(init)
    if model_fn is not None and options.model:
        raise ConfigError(f"both model_fn ({getattr(model_fn, '__name__', model_fn)!r}) and --model "
                          f"{options.model!r} given: give one")
    if model_fn is not None:
        if hasattr(model_fn, "trainable_variables"):
            raise UserCodeError(f"model_fn is a built model ({type(model_fn).__name__} {getattr(model_fn, 'name', '')!r}):"
                                " pass the function that builds it; the harness calls it under the strategy's scope")
        origin = getattr(model_fn, "__name__", repr(model_fn))
        _check_arguments(model_fn, origin, args)
        return ModelBuilder(model_fn, origin, args, init, code=model_code.of_function(model_fn), seed=seed)
    if options.model:
        module, fn = _load(options.model, "--model")
        _check_arguments(fn, options.model, args)
        return ModelBuilder(fn, options.model, args, init,
                            code=model_code.of_module(options.model, module, options.model.rpartition(":")[2]),
                            seed=seed)
    if args:
        raise ConfigError(f"--model-args {args} given without --model: the built-in models take no arguments")
    return ModelBuilder(builtin, "built-in", None, init, seed=seed)


def seed_weights(seed: Optional[int]) -> None:
    """`--seed` for the model's weights: Python's `random`, NumPy's and TensorFlow's global seed set, and each Keras
    the process imported seeded with its `utils.set_random_seed` (Keras 3 also starts its global SeedGenerator
    again), before the model function runs, so the same command twice on one device builds the same weights and
    trains to the same losses (the data's order: the same `--seed`, `harness.train.lifecycle.resume.data_seed`).
    None: nothing seeded."""
    if seed is None:
        return
    import random
    import sys

    import numpy as np
    import tensorflow as tf

    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    for name in ("keras", "tf_keras"):   # a Keras the model file did not import has no state to seed
        utils = getattr(sys.modules.get(name), "utils", None)
        if hasattr(utils, "set_random_seed"):
            utils.set_random_seed(seed)


def _check_arguments(fn: Callable, origin: str, model_args: Optional[dict]) -> None:
    """Refuse `model_args` that `fn(ModelInputs, **model_args)` cannot take (an unknown or missing keyword), before
    any data is read; a function whose signature cannot be read is left to the call.

    Raises:
      UserCodeError: naming the function, the arguments and what its signature takes.
    """
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, **dict(model_args or {}))
    except TypeError as e:
        raise UserCodeError(f"model {origin}: cannot be called with ModelInputs and model_args {dict(model_args or {})}: "
                            f"{e} (it takes {fn.__name__ if hasattr(fn, '__name__') else 'fn'}{signature})") from None


def _check_init_from(source: str) -> None:
    """`--init-from` names an existing `.keras` file or a run folder holding `model.keras`, checked before any data
    is read (local or `gs://`).

    Raises:
      ModelFileError (a ModelError): naming the path looked for.
    """
    from harness.run_folder import find_model

    find_model(source, flag="--init-from")


def builtin(inputs: ModelInputs):
    """The built-in model (`harness.train.model.builtin.builtin_model`) as a model function."""
    from harness.train.model import builtin

    expected = 1 if inputs.kind == "table" else 3
    if isinstance(inputs.input_shape, Mapping) or len(inputs.input_shape) != expected:
        one = "[bands]" if inputs.kind == "table" else "[height, width, bands]"
        raise ConfigError(f"the built-in {inputs.kind} model takes one input {one}; band_groups deliver "
                          f"{_shape_text(inputs.input_shape)}: give --model (e.g. examples/temporal_pixel.py:build for "
                          "a table export) or drop band_groups from the data config")
    return builtin.builtin_model(inputs.kind, inputs.input_shape, inputs.num_classes, mean=list(inputs.mean) or None,
                                variance=list(inputs.variance) or None)


def _shape_text(shape) -> str:
    if isinstance(shape, Mapping):
        return "{" + ", ".join(f"{g}: {list(s)}" for g, s in shape.items()) + "} (group_delivery: dict)"
    return f"{list(shape)} (group_delivery: time)"


def _zeros(shape, batch: int = 2):
    import tensorflow as tf
    if isinstance(shape, Mapping):
        return {g: tf.zeros([batch, *s]) for g, s in shape.items()}
    return tf.zeros([batch, *shape])


def check_model(model, inputs: ModelInputs, *, origin: str = "model") -> None:
    """Check a built model against what it will be trained on.

    Raises:
      UserCodeError: not a Keras model (`harness.keras_kinds.of_model`).
      ModelError: what the harness would not use: a `train_step`, `test_step` or `compute_loss` of the model's own
        class (`_check_own_steps`), a compiled model (`_check_not_compiled`); with group_delivery "dict",
        functional model inputs not named and shaped as the groups (`_check_named_inputs`); a declared input that
        is not the delivered shape (`_check_input_shape`: both shapes, the bands and their count), or a model that
        fails on it; several outputs; an output shape that does not fit the labels (`[batch, *label_shape,
        num_classes]`, the actual shape named); an output that is not float32 under a mixed policy (the layer
        named).
    """
    from harness import keras_kinds as kinds

    kinds.of_model(model, f"model {origin}")
    _check_own_steps(model, origin)
    _check_not_compiled(model, origin)
    graph = getattr(model, "_is_graph_network", False)
    if graph and isinstance(inputs.input_shape, Mapping):
        _check_named_inputs(model, inputs.input_shape, origin)
    elif not isinstance(inputs.input_shape, Mapping):
        _check_input_shape(model, inputs, origin)
    outputs = model.outputs if graph else None
    if outputs is None:
        try:
            outputs = model(_zeros(inputs.input_shape), training=False)
        except Exception as e:   # the user's model may raise anything on the delivered shape
            raise ModelError(f"model {origin}: fails on the input the export delivers, {_delivered(inputs)}: "
                             f"{_keras_error(e)}") from e
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    if len(outputs) != 1:
        raise ModelError(f"model {origin} has {len(outputs)} outputs; the harness trains one output of logits")
    out = outputs[0]
    want = (*inputs.label_shape, inputs.num_classes) if inputs.task == "classification" else tuple(inputs.label_shape)
    got = tuple(out.shape[1:])
    fits = len(got) == len(want) and all(g is None or g == w for g, w in zip(got, want))
    if inputs.task != "classification" and not fits:
        fits = got == (*want, 1)
    if not fits:
        def batch(shape) -> str:
            return f"[batch{''.join(f', {d}' for d in shape)}]"
        if inputs.task == "classification":
            raise ModelError(f"model {origin}: output shape {batch(got)} does not fit labels "
                             f"{batch(inputs.label_shape)} with {inputs.num_classes} classes: expected {batch(want)} "
                             "(logits, channels-last)")
        raise ModelError(f"model {origin}: output shape {batch(got)} does not fit regression labels "
                         f"{batch(inputs.label_shape)}: expected {batch(want)} or {batch((*want, 1))} (one value per "
                         f"{'pixel' if want else 'example'})")
    dtype = getattr(out.dtype, "name", str(out.dtype))
    if inputs.policy.startswith("mixed") and dtype != "float32":
        layer = getattr(getattr(out, "_keras_history", None), "layer", None) or model.layers[-1]
        raise ModelError(f"model {origin}: output is {dtype} under policy {inputs.policy}: give its last layer "
                         f"{layer.name!r} dtype=\"float32\" (logits and loss in float32; Keras mixed precision guide)")


# What the harness runs instead of a model's own methods, which it never calls (docs/model.md, "Your model function").
NOT_CALLED = {
    "train_step": "the harness runs its own step on every replica (the model's call(), --loss, the gradients summed "
                  "over the replicas, --optimizer, --clip-norm): put what it adds in call() (self.add_loss() for a "
                  "loss term of the model's) or in --loss MODULE:FUNCTION",
    "test_step": "validation scores the model's call() with the run's loss and metrics",
    "compute_loss": "the loss is --loss (a built-in, or MODULE:FUNCTION per example) plus the model's add_loss() "
                    "terms: give yours as --loss MODULE:FUNCTION",
}
OPTIMIZER_FLAGS = "--optimizer adam|adamw|sgd, --learning-rate, --schedule, --momentum, --weight-decay"


def _check_own_steps(model, origin: str) -> None:
    """Refuse a model whose own class (not Keras') defines a method of Keras' `fit` that the harness never calls.

    Raises:
      ModelError: naming the class, the method and what the harness runs instead.
    """
    from harness.train.model.loadable import LIBRARIES

    for method, instead in NOT_CALLED.items():
        owner = next((cls for cls in type(model).__mro__ if method in vars(cls)), None)
        if owner is not None and (owner.__module__ or "").split(".")[0] not in LIBRARIES:
            raise ModelError(f"model {origin}: {owner.__qualname__} defines {method}(), which the harness never "
                             f"calls: {instead}; then remove {method}() (docs/model.md)")


def _check_not_compiled(model, origin: str) -> None:
    """Refuse a model compiled in the model function: the harness trains with the optimizer and loss it builds
    itself, in the strategy's scope, from its flags (as it refuses a built optimizer object: `optim.refuse_built`).

    Raises:
      ModelError: naming the compiled optimizer's class and the flags that set the harness's.
    """
    if not (getattr(model, "compiled", False) or getattr(model, "_is_compiled", False)):   # Keras 3, tf-keras
        return
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer   # a LossScaleOptimizer's
    named = f" with optimizer {type(inner).__name__}" if inner is not None else ""
    raise ModelError(f"model {origin} was compiled{named} in the model function, which the harness does not use: it "
                     f"builds its own optimizer in the strategy's scope, from {OPTIMIZER_FLAGS} (the loss: --loss): "
                     "remove model.compile(...) and give those flags (a KerasHub task compiles itself: build it "
                     "with compile=False) (docs/model.md)")


def _declared_inputs(model) -> Optional[list]:
    """The input shapes (without the batch axis) a model declares (a functional model, a Sequential with an
    Input), else None (a subclassed model, known once called)."""
    try:
        declared = model.inputs
    except (AttributeError, ValueError):   # Keras 3: a subclassed model has none
        return None
    if not declared:
        return None
    return [tuple(t.shape)[1:] for t in declared]


def _check_input_shape(model, inputs: ModelInputs, origin: str) -> None:
    """The model's declared input against the one tensor the pipeline delivers (`[batch, *input_shape]`).

    Raises:
      ModelError: one line: the model's input shape, the delivered shape, the bands and their count, the fix.
    """
    declared = _declared_inputs(model)
    if declared is None:
        return
    want = tuple(inputs.input_shape)
    if len(declared) == 1 and len(declared[0]) == len(want) and all(d is None or d == w
                                                                     for d, w in zip(declared[0], want)):
        return
    takes = ", ".join(_batch(shape) for shape in declared)
    raise ModelError(f"model {origin} takes {'input' if len(declared) == 1 else f'{len(declared)} inputs'} {takes}; "
                     f"the export delivers {_delivered(inputs)}: build the model's input from the shape it is given "
                     "(keras.Input(inputs.input_shape))")


def _batch(shape) -> str:
    return "[" + ", ".join(["batch", *("None" if d is None else str(d) for d in shape)]) + "]"


def _delivered(inputs: ModelInputs) -> str:
    """The delivered input: its shape with the batch axis, the bands and their count (with groups: each group's)."""
    shape = inputs.input_shape
    if inputs.band_groups:
        groups = "; ".join(f"{g}: {', '.join(b)}" for g, b in inputs.band_groups.items())
        shapes = (", ".join(f"{g}: {_batch(s)}" for g, s in shape.items()) if isinstance(shape, Mapping)
                  else _batch(shape))
        return f"{shapes} (band groups {groups})"
    return f"{_batch(shape)} ({len(inputs.bands)} bands: {', '.join(inputs.bands)})"


def _keras_error(error: BaseException) -> str:
    """A Keras call's error in one line: its type, the layer Keras names ("Exception encountered when calling
    ..."), and the first line of what went wrong (terminal colours and TensorFlow's function names left out)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    prefix = "Exception encountered when calling "
    where = next((line[len(prefix):].rstrip(".") for line in lines if line.startswith(prefix)), None)
    what = next((line for line in lines if not line.startswith(prefix)), "")
    return f"{type(error).__name__}{f' calling {where}' if where else ''}: {what}".rstrip(": ")


def _check_named_inputs(model, delivered: Mapping, origin: str) -> None:
    """A functional model fed one tensor per group (group_delivery "dict") must name its inputs as the groups:
    Keras matches a dict to the inputs by name, and falls back to the keys' sorted order for other names.

    Raises:
      ModelError: naming the model's inputs and the groups delivered, with their shapes.
    """
    takes = {name: tuple(t.shape[1:]) for name, t in zip(model.input_names, model.inputs)}
    fits = set(takes) == set(delivered) and all(
        len(takes[g]) == len(s) and all(a is None or a == b for a, b in zip(takes[g], s)) for g, s in delivered.items())
    if not fits:
        def text(shapes):
            return "{" + ", ".join(f"{k}: {list(v)}" for k, v in shapes.items()) + "}"
        raise ModelError(f"model {origin}: takes inputs {text(takes)}; band_groups (group_delivery: dict) deliver "
                         f"{text(delivered)}: give the model one keras.Input per group, named as the group, of "
                         "its shape")


def _layers_by_name(model) -> dict:
    """Every layer with weights, nested models walked, by name (the outer name wins a clash)."""
    found = {}
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.weights:
            for name, inner in _layers_by_name(layer).items():
                found.setdefault(name, inner)
        if layer.weights:
            found.setdefault(layer.name, layer)
    return found


def init_weights(model, source: str) -> str:
    """Copy weights from a saved model (`--init-from MODEL.keras`, or a run folder holding `model.keras`) into
    `model`, layer by layer, matched by name; a layer whose weight shapes differ keeps its initialization.

    The saved model's classes load because the model file recorded in it is imported first
    (`harness.keras_kinds.load_model`, `harness.model_code`).

    Returns:
      a line naming the layers loaded, those whose shapes differ and those missing on either side.
    Raises:
      UserCodeError: a Keras 3 file for a tf-keras model; the recorded model file does not import and the model
        does not load without it (`harness.keras_kinds.load_model`).
      ModelError: the file cannot be loaded (with the error), or no layer matched.
    """
    from harness.run_folder import model_path
    from harness import keras_kinds as kinds

    path = model_path(source)
    try:
        saved = kinds.load_model(path, flag="--init-from", need=kinds.of_model(model))
    except UserCodeError:
        raise
    except Exception as e:  # missing file, custom objects: name it
        raise ModelError(f"--init-from {source}: cannot load {path}: {type(e).__name__}: {e}") from e
    ours, theirs = _layers_by_name(model), _layers_by_name(saved)
    loaded, shapes = [], []
    for name, layer in ours.items():
        if name not in theirs:
            continue
        mine, src = layer.get_weights(), theirs[name].get_weights()
        if [w.shape for w in mine] != [w.shape for w in src]:
            shapes.append(f"{name} {[tuple(w.shape) for w in mine]} vs saved {[tuple(w.shape) for w in src]}")
            continue
        layer.set_weights(src)
        loaded.append(name)
    if not loaded:
        raise ModelError(f"--init-from {source}: no layer of the model matches a layer of {path} by name and shape "
                         f"(model: {sorted(ours)[:20]}; saved: {sorted(theirs)[:20]})")
    missing = sorted(set(ours) - set(theirs))
    unused = sorted(set(theirs) - set(ours))
    return (f"init-from {path}: {len(loaded)} layers loaded; shapes differ (kept initialized): {shapes or 'none'}; "
            f"not in the saved model: {missing or 'none'}; saved but not in the model: {unused or 'none'}")
