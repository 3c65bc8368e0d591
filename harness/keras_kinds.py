"""The two kinds of Keras a model is written in, and which one a run uses.

- Keras 3 (`import keras`; what `pip install tensorflow` brings since TF 2.16, the keras.io guides and KerasHub);
- tf-keras (Keras 2, `import tf_keras`, still released with each TensorFlow; what `tf.keras` resolves to once
  `harness` is imported, which sets TF_USE_LEGACY_KERAS=1 unless the user set it).

A run's kind is the kind of the model the user's function returns (`of_model`); every other Keras object of the run
is made in that kind (the optimizer, its schedule and loss scale: `harness.train.model.optim`, `precision`) or must
be of it (a loss object, callbacks): one of the other kind is refused by name (`check_same`), since the two share no
classes (a tf-keras loss cannot read a Keras 3 model's tensors' Keras history, a tf-keras callback cannot drive a Keras 3
model). A `.keras` file says which Keras saved it (`of_file`: its `metadata.json` "keras_version"); Keras 3 loads
tf-keras files, tf-keras cannot load Keras 3 files.

What differs in the harness's step (`harness.train.loop.trainer`), each measured in issue 43:
- Keras 3's `LossScaleOptimizer` tests one replica's own gradients for finiteness, before the cross-replica sum:
  an overflow on one replica applied NaN weights (MirroredStrategy) or deadlocked the workers
  (MultiWorkerMirroredStrategy). The harness sums a Keras 3 model's gradients itself, then hands the sum to the
  optimizer with its own all-reduce turned off (`no_second_sum`), so every replica tests the same gradients.
- Keras 3's `global_clipnorm` clips each replica's share before the sum; the harness clips after its sum.
- Keras 3's BatchNormalization keeps a moving mean and variance per replica (variables with aggregation NONE,
  each replica updating its own copy); the harness averages them before evaluation, backup and save
  (`harness.distribute.backend.TrainingBackend.align_model_state`). On TensorFlow it normalizes with
  `tf.nn.moments` where tf-keras runs one fused kernel (16% slower steps on the built-in U-Net): the trainer puts
  it on the fused kernel with Keras 3's numbers (`harness.train.model.keras3_batch_norm`).
- Keras 3's dynamic loss scale halves below 1 (tf-keras stops at 1): `LOSS_SCALE_FLOOR`; a skipped update does not
  advance its step counter (tf-keras's does): the harness advances it, so the schedule and the step agree.
"""
from __future__ import annotations

import importlib
import json
import types
import zipfile
from typing import Optional

from harness.errors import UserCodeError

TF_KERAS, KERAS3 = "tf_keras", "keras3"
KINDS = (TF_KERAS, KERAS3)
NAMES = {TF_KERAS: "tf-keras (Keras 2, `import tf_keras`)", KERAS3: "Keras 3 (`import keras`)"}
# The loss scale below which halving cannot help, per kind. tf-keras's dynamic LossScaleOptimizer never goes below 1
# (tf_keras/src/mixed_precision/loss_scale_optimizer.py, `_DynamicLossScaleState.update`); Keras 3's halves without
# a floor (keras/src/optimizers/loss_scale_optimizer.py, `_stateful_handle_non_finite_grads`), so the harness sets
# one: float16's smallest normal number, 2**-14 (IEEE 754 binary16), below which a scaled loss of order 1 is itself
# subnormal and scaling down loses the gradients' precision instead of saving their range.
LOSS_SCALE_FLOOR = {TF_KERAS: 1.0, KERAS3: 2.0 ** -14}


def module(kind: str) -> types.ModuleType:
    """The Keras package of `kind`: `tf_keras` or `keras` (Keras 3)."""
    return importlib.import_module("tf_keras" if kind == TF_KERAS else "keras")


def of(obj) -> Optional[str]:
    """KERAS3 for an object (or function, or class) of Keras 3, TF_KERAS for tf-keras's, else None.

    A class is judged by the modules of its bases (Keras 3's live under `keras.`, tf-keras's under `tf_keras.`); a
    function by the Keras modules its own module's globals hold (`import keras` or `import tf_keras` at the top of
    the user's file), None when it holds neither or both."""
    if not isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        cls = obj if isinstance(obj, type) else type(obj)
        for base in cls.__mro__:
            root = (base.__module__ or "").split(".")[0]
            if root == "keras":
                return KERAS3
            if root == "tf_keras":
                return TF_KERAS
        return None
    roots = {getattr(v, "__name__", "").split(".")[0] for v in getattr(obj, "__globals__", {}).values()
             if isinstance(v, types.ModuleType)}
    found = [kind for kind, root in ((KERAS3, "keras"), (TF_KERAS, "tf_keras")) if root in roots]
    return found[0] if len(found) == 1 else None


def of_model(model, origin: str = "model") -> str:
    """The kind of a built model.

    Raises:
      UserCodeError: `model` is not a Keras model of either kind (naming what it is).
    """
    kind = of(model)
    if kind is None or not isinstance(model, module(kind).Model):
        raise UserCodeError(f"{origin} returned {type(model).__module__}.{type(model).__name__}, not a Keras model "
                            f"(a keras.Model of Keras 3 or tf_keras)")
    return kind


def check_same(kind: str, obj, what: str) -> None:
    """Refuse `obj` (a loss object, a callback) of the other kind than the run's model.

    Raises:
      UserCodeError: naming `what`, its kind and the model's, and what to import instead.
    """
    theirs = of(obj)
    if theirs is not None and theirs != kind:
        raise UserCodeError(f"{what} is {NAMES[theirs]}; the model is {NAMES[kind]}: the two Keras share no "
                            f"classes, so write it with `{'import keras' if kind == KERAS3 else 'import tf_keras'}`, "
                            "as the model is")


def of_file(path: str) -> Optional[str]:
    """The kind that saved a `.keras` file (its `metadata.json` "keras_version": 2.x tf-keras, 3.x Keras 3); None
    when the file holds no such entry (not a `.keras` zip). Local or `gs://`."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "rb") as f, zipfile.ZipFile(f) as z:
            version = json.loads(z.read("metadata.json")).get("keras_version", "")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, tf.errors.OpError):
        return None
    major = version.split(".")[0]
    return {"2": TF_KERAS, "3": KERAS3}.get(major)


def load_model(path: str, *, flag: str, need: Optional[str] = None):
    """Load a `.keras` file with the Keras that saved it (`of_file`), after importing the code it was trained with
    (`harness.model_code.prepare`: the model file recorded in it, so that its registered classes are found); with
    `need`, refuse a file that kind cannot be given.

    Raises:
      UserCodeError: `need` is TF_KERAS and the file is Keras 3's (tf-keras cannot read it); the recorded model
        file is gone or does not import and the model does not load without it (one line: the file, the error,
        what to do).
      Whatever `load_model` raises for an unreadable file (callers name it).
    """
    from harness import model_code

    kind = of_file(path) or TF_KERAS
    if need == TF_KERAS and kind == KERAS3:
        raise UserCodeError(f"{flag} {path}: a Keras 3 model file; this model is {NAMES[TF_KERAS]}, which cannot "
                            "read Keras 3 files: give a tf-keras file, or write the model with `import keras`")
    if need == KERAS3:
        kind = KERAS3   # Keras 3 reads tf-keras files too
    missing = model_code.prepare(path)
    try:
        model = module(kind).models.load_model(path, compile=False)
    except Exception as e:
        if missing is None:
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserCodeError(f"{flag} {missing} (without it: {type(e).__name__}: {first})") from e
    if missing is not None:
        import logging

        logging.getLogger(__name__).warning("%s; the model loaded without it", missing)
    return model


def no_second_sum(optimizer) -> None:
    """Turn off a Keras 3 optimizer's own cross-replica sum of the gradients (`TFOptimizer._all_reduce_sum_gradients`,
    keras/src/backend/tensorflow/optimizer.py), for gradients the harness has summed already; the wrapped
    optimizer of a LossScaleOptimizer too. tf-keras's optimizers take `skip_gradients_aggregation=True` instead."""
    inner = getattr(optimizer, "inner_optimizer", None)
    for opt in (optimizer, inner) if inner is not None else (optimizer,):
        if not hasattr(type(opt), "_all_reduce_sum_gradients"):
            raise RuntimeError(f"{type(opt).__name__} has no _all_reduce_sum_gradients: this Keras "
                               f"{getattr(module(KERAS3), '__version__', '?')} sums gradients elsewhere; the harness "
                               "cannot sum them once")
        opt._all_reduce_sum_gradients = list


# What applies softmax as a model's last step: a layer's `activation` (Dense(activation="softmax"),
# Activation("softmax")), a Softmax layer (Keras 3 also names its `keras.ops.softmax` node so), tf-keras's
# `tf.nn.softmax` on a Keras tensor (a TFOpLambda of that symbol).
_SOFTMAX_SYMBOLS = ("nn.softmax", "math.softmax")


def softmax_output(model) -> Optional[str]:
    """The name of the layer that applies softmax to the model's output (its outputs are then probabilities, not
    logits), else None; Keras 3 or tf-keras. The one place the harness decides it: the loss takes a softmax
    model's outputs as probabilities (`harness.train.model.losses.of_probabilities`), predict and export do not
    apply softmax again (`harness.predict.stream`, `harness.predict.serving`).

    The output's layer is the one its Keras history names (a functional model, a Sequential), else the model's
    last layer (a subclassed model's last layer assigned); a nested model's own output layer, recursively."""
    layer = _output_layer(model)
    for _ in range(8):   # nested models
        if layer is None or not hasattr(layer, "layers") or layer is model:
            break
        model, layer = layer, _output_layer(layer)
    if layer is None:
        return None
    activation = getattr(layer, "activation", None)
    if (getattr(activation, "__name__", "") == "softmax" or type(layer).__name__ == "Softmax"
            or getattr(layer, "symbol", None) in _SOFTMAX_SYMBOLS):
        return getattr(layer, "name", type(layer).__name__)
    return None


def _output_layer(model):
    """The layer (or Keras 3 operation) that makes the model's first output, else its last layer, else None."""
    try:
        outputs = model.outputs
    except AttributeError:   # a Keras 3 subclassed model
        outputs = None
    if outputs:
        history = getattr(outputs[0] if isinstance(outputs, (list, tuple)) else outputs, "_keras_history", None)
        if history:
            return history[0]
    layers = getattr(model, "layers", None)
    return layers[-1] if layers else None
