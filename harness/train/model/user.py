"""A user's own model: `--model MODULE:FUNCTION` or `--model path/to/file.py:FUNCTION` (`train.model`), with
`--model-args JSON` (`train.model_args`) as keyword arguments, or `harness.train.job.run(options, model_fn=...)`.

The function receives one frozen `ModelInputs` (what the input pipeline delivers) and returns a Keras model, of
Keras 3 (`import keras`) or tf-keras (`import tf_keras`): the run is of the model's kind (`harness.keras_kinds`),
mapping those inputs to logits with a float32 last layer. The harness calls it under the strategy's scope (under
Horovod, the default scope), once per worker, then checks the model before the first step:
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
    """

    def __init__(self, fn: Callable, origin: str, model_args: Optional[dict] = None, init_from: Optional[str] = None,
                 code: Optional[model_code.ModelCode] = None):
        self.fn, self.origin, self.model_args, self.init_from = fn, origin, dict(model_args or {}), init_from
        self.code = code

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
        return ModelBuilder(model_fn, origin, args, init, code=model_code.of_function(model_fn))
    if options.model:
        module, fn = _load(options.model, "--model")
        _check_arguments(fn, options.model, args)
        return ModelBuilder(fn, options.model, args, init,
                            code=model_code.of_module(options.model, module, options.model.rpartition(":")[2]))
    if args:
        raise ConfigError(f"--model-args {args} given without --model: the built-in models take no arguments")
    return ModelBuilder(builtin, "built-in", None, init)


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
      ModelError: with group_delivery "dict", functional model inputs not named and shaped as the groups
        (`_check_named_inputs`); several outputs; an output shape that does not fit the labels (`[batch, *label_shape,
        num_classes]`, the actual shape named); an output that is not float32 under a mixed policy (the layer
        named).
    """
    from harness import keras_kinds as kinds

    kinds.of_model(model, f"model {origin}")
    graph = getattr(model, "_is_graph_network", False)
    if graph and isinstance(inputs.input_shape, Mapping):
        _check_named_inputs(model, inputs.input_shape, origin)
    outputs = model.outputs if graph else None
    if outputs is None:
        outputs = model(_zeros(inputs.input_shape), training=False)
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
