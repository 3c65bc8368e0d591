"""A user's model saved and loaded again before the first step, as `predict`, `evaluate`, `export` and `--init-from`
load it after training (`harness.keras_kinds.load_model`, the model file imported first: `harness.model_code`), so that
a model that cannot be loaded is refused at the start, with its class named and the fix, not after hours of training.

Refused, each with one line (`ModelError`: a permanent exit, `harness.exit_codes`):
  - a class of the user's in the model (a layer, or the model's own class) that is not registered with Keras: Keras
    finds it by its registered name (`@keras.saving.register_keras_serializable()`, tf-keras: the same in `tf_keras`);
  - a `Lambda` layer of a Python lambda (tf-keras: any Lambda, whose function it saves as bytecode): Keras' safe mode
    refuses to load it (the fix: a registered Layer subclass);
  - a class of the user's whose `get_config()` Keras cannot make (its constructor took arguments it cannot
    serialize, or positional ones, and it defines none);
  - a model that does not save, or does not load again (the error's first line, and the classes it names);
  - a model holding classes of the user's whose copy loaded again computes other outputs on the same inputs (a
    `get_config()` that leaves out a constructor argument).
The built-in models hold only Keras' own layers and are not checked here (tests/train/model/test_loadable.py saves
and loads them).

Cost: the save, the load and, for a model holding the user's classes, one forward pass of each on 2 examples; on the
2-core test machine (`python tests/train/model/scripts/loadable_cost.py`) 0.04-0.06 CPU-s for a small subclassed model
with a custom layer, 0.33 (Keras 3) to 0.43 (tf-keras) for a U-Net of Keras' layers on 64x64 patches.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from typing import Optional

from harness import keras_kinds as kinds, model_code
from harness.errors import ModelError, UserCodeError

log = logging.getLogger(__name__)

LIBRARIES = ("keras", "tf_keras")   # module roots of Keras' own classes (Keras 3's live under keras.src)
DOC = 'docs/model.md, "What a model may hold"'


def check(model, inputs, *, origin: str, code: Optional[model_code.ModelCode] = None) -> float:
    """Refuse `model` (built, Keras 3 or tf-keras) if it cannot be loaded again after training; call on every
    worker outside the strategy's scope (the save reads every variable, as the final save does).

    Args:
      inputs: the `harness.train.model.user.ModelInputs` it was built for (the forward pass's shapes: float32
        `[2, *input_shape]`, or one such tensor per band group).
      origin: how the user named the model (`--model FILE.py:FUNCTION`), for the messages.
      code: the model file recorded in the saved copy, imported before the load as the other commands import it.
    Returns:
      the seconds the check took.
    Raises:
      ModelError: one line naming the class (or the layer) and the fix: unregistered classes, a Lambda of a
        Python lambda, a class without a `get_config()` Keras can make, a save or a load that fails, other outputs
        once loaded again.
      UserCodeError: the recorded model file does not import and the model does not load without it.
    """
    started = time.perf_counter()
    kind = kinds.of_model(model, f"model {origin}")
    layers = list(model._flatten_layers(include_self=True, recursive=True))
    own = [layer for layer in layers if _own(type(layer))]
    decorator = f"@{'keras' if kind == kinds.KERAS3 else 'tf_keras'}.saving.register_keras_serializable()"
    _check_registered(own, kind, origin, decorator)
    _check_lambdas(layers, kind, origin, decorator)
    _check_configs(own, origin)
    if own and code is None:
        log.warning("model %s holds %s, and its function is a script's (__main__), which the run cannot record: "
                    "predict, evaluate, export and --init-from find them only where that code is imported first "
                    "(define the model in a module, or give the file as --model FILE.py:FUNCTION)", origin, _names(own))
    folder = tempfile.mkdtemp(prefix="harness-loadable-")
    try:
        loaded = _save_and_load(model, os.path.join(folder, "model.keras"), own, origin, code, decorator)
        if own:
            _check_outputs(model, loaded, inputs, own, origin)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    seconds = time.perf_counter() - started
    log.info("model %s saved and loaded again in %.2f s, as predict, evaluate and export load it", origin, seconds)
    return seconds


def _own(cls) -> bool:
    """A class defined outside Keras (the user's, or a library's that must register it as the user's must)."""
    return (cls.__module__ or "").split(".")[0] not in LIBRARIES


def _name(layer) -> str:
    return f"{type(layer).__qualname__} (layer {layer.name!r})"


def _names(layers) -> str:
    seen = {}
    for layer in layers:
        seen.setdefault(type(layer), layer)
    return ", ".join(_name(layer) for layer in seen.values())


def _check_registered(own: list, kind: str, origin: str, decorator: str) -> None:
    saving = kinds.module(kind).saving
    missing = [layer for layer in own
               if saving.get_registered_object(saving.get_registered_name(type(layer))) is None]
    if missing:
        classes = {type(layer) for layer in missing}
        these, it = ("class {} is", "it") if len(classes) == 1 else ("classes {} are", "each")
        raise ModelError(f"model {origin}: {these.format(_names(missing))} not registered with Keras, so predict, "
                         f"evaluate, export and --init-from could not load the trained model: decorate {it} with "
                         f"{decorator} ({DOC})")


def _check_lambdas(layers: list, kind: str, origin: str, decorator: str) -> None:
    lambda_class = kinds.module(kind).layers.Lambda
    found = [layer for layer in layers if isinstance(layer, lambda_class)
             and (kind == kinds.TF_KERAS or getattr(layer.function, "__name__", "") == "<lambda>")]
    if found:
        names = ", ".join(repr(layer.name) for layer in found)
        saved = "saves its function as bytecode" if kind == kinds.TF_KERAS else "holds a Python lambda"
        also = "" if kind == kinds.TF_KERAS else " (or give Lambda a named function, registered the same way)"
        raise ModelError(f"model {origin}: Lambda layer {names} {saved}, which Keras' safe mode refuses to "
                         f"load (predict, evaluate and export load in safe mode): write it as a Layer subclass with "
                         f"call(), decorated with {decorator}{also} ({DOC})")


def _check_configs(own: list, origin: str) -> None:
    for layer in own:
        try:
            layer.get_config()
        except NotImplementedError:
            raise ModelError(f"model {origin}: class {_name(layer)} has no get_config(), and Keras cannot make one "
                             "from its constructor's arguments (positional ones, or values it cannot serialize): "
                             f"add get_config() returning them, and from_config() for those that are not plain "
                             f"values ({DOC})") from None


def _save_and_load(model, path: str, own: list, origin: str, code, decorator: str):
    try:
        model.save(path)
    except Exception as e:  # Keras' own error, whatever the class does
        raise ModelError(f"model {origin}: cannot be saved: {type(e).__name__}: {_first_line(e)}"
                         f"{_named(e, own, decorator)} ({DOC})") from e
    model_code.write(path, code)
    try:
        return kinds.load_model(path, flag=f"model {origin}:")
    except UserCodeError:
        raise
    except Exception as e:
        raise ModelError(f"model {origin}: saved, it does not load again as predict, evaluate and export load it: "
                         f"{type(e).__name__}: {_first_line(e)}{_named(e, own, decorator)} ({DOC})") from e


def _named(error: Exception, own: list, decorator: str) -> str:
    """What the error names: a class or function Keras could not locate (not registered), else the user's classes
    whose names it holds."""
    text = str(error)
    located = re.search(r"Could not locate (class|function) '([^']+)'", text)
    if located:
        return f"; {located.group(1)} {located.group(2)} is not registered: decorate it with {decorator}"
    named = [layer for layer in own if re.search(rf"\b{re.escape(type(layer).__name__)}\b", text)]
    if not named:
        return ""
    bare = [layer for layer in named if not _defines_config(type(layer))]
    if bare:
        return (f"; {_names(bare)} defines no get_config(): add one returning its constructor's arguments (and "
                "from_config() for those that are not plain values)")
    return f"; in {_names(named)}: check that get_config() returns every argument its constructor takes"


def _defines_config(cls) -> bool:
    """Whether the user's class (or a base of the user's) defines get_config, rather than Keras' own."""
    return any("get_config" in vars(base) for base in cls.__mro__ if _own(base))


def _check_outputs(model, loaded, inputs, own: list, origin: str) -> None:
    import numpy as np

    x = _sample(inputs.input_shape)
    built = np.asarray(model(x, training=False), np.float32)
    again = np.asarray(loaded(x, training=False), np.float32)
    scale = max(1.0, float(np.abs(built).max())) if built.size else 1.0
    if built.shape != again.shape or not np.allclose(built, again, rtol=1e-4, atol=1e-4 * scale):
        diff = (f"shape {again.shape}" if built.shape != again.shape
                else f"by up to {np.abs(built - again).max():.3g}")
        raise ModelError(f"model {origin}: loaded again, it computes other outputs than the model built ({diff}, "
                         f"same weights, same inputs): a get_config() of {_names(own)} leaves out an argument its "
                         f"constructor takes ({DOC})")


def _sample(shape, batch: int = 2):
    """Float32 normal values `[batch, *shape]` (a mapping of shapes: one tensor each), the same on every call."""
    import tensorflow as tf
    from collections.abc import Mapping

    if isinstance(shape, Mapping):
        return {g: _sample(s, batch) for g, s in shape.items()}
    return tf.random.stateless_normal([batch, *shape], seed=[64, 0])


def _first_line(error: BaseException, longest: int = 160) -> str:
    """The error's first line; past `longest` characters, its first sentence."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    line = lines[0].strip() if lines else type(error).__name__
    if len(line) > longest and ". " in line[:longest]:
        line = line[:line.index(". ") + 1]
    return line
