"""The model to predict with: loaded from a run folder or a `.keras` file, and checked against the export.

`Geometry` says, for image exports, which patch the model is fed (the stored (P+k) x (P+k) patch, or its central
P x P when the model was built for cropped patches) and how much of its output to crop (k/2 per side when the
output has the stored size, nothing when it is already P x P). Every check runs on the model's shapes and one
dry call on zeros, before any record is predicted.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Optional

import tensorflow as tf

from harness.data.spec import IMAGE, DataSpec
from harness.errors import ModelMismatchError, PredictError


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A Keras model and what its run says of it.

    Attributes:
      model: the `tf_keras.Model`.
      path: the `.keras` file it was loaded from.
      sha256: hex digest of that file (a re-run with another model is another run).
      spec: the run's `DataSpec` from `summary.json` (`spec`), or None for a bare model.
    """

    model: object
    path: str
    sha256: str
    spec: Optional[DataSpec]


def load(path: str) -> LoadedModel:
    """Load `path`: a run folder (`model.keras`, `summary.json`) or a `.keras` file (a `summary.json` beside it
    is read when present).

    Raises:
      PredictError: if the model file is missing or cannot be loaded.
    """
    import tf_keras as keras

    model_path = os.path.join(path, "model.keras") if tf.io.gfile.isdir(path) else path
    if not tf.io.gfile.exists(model_path):
        raise PredictError(f"--model {path}: {model_path} not found (give a run folder holding model.keras, or a "
                           ".keras file)")
    with tf.io.gfile.GFile(model_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    try:
        model = keras.models.load_model(model_path, compile=False)
    except (OSError, ValueError, TypeError) as e:
        raise PredictError(f"{model_path}: cannot load the Keras model: {e}") from e
    summary = os.path.join(os.path.dirname(model_path), "summary.json")
    spec = None
    if tf.io.gfile.exists(summary):
        with tf.io.gfile.GFile(summary) as f:
            config = json.load(f).get("spec")
        spec = DataSpec.from_config(config) if config else None
    return LoadedModel(model=model, path=model_path, sha256=digest, spec=spec)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How patches go through the model (images); tables have side 0 and crop 0.

    Attributes:
      input_side: side of the patch fed to the model: stored S = P + k, or P (the central crop).
      crop: pixels cut from each side of the model's output: k/2 when the output is S x S, else 0.
      patch: P, the side of every written band (P*P values).
      channels: the model's output channels (classes, or regression outputs).
    """

    input_side: int
    crop: int
    patch: int
    channels: int


def check(loaded: LoadedModel, spec: DataSpec, where: str) -> Geometry:
    """Check the model against the export's spec (bands, patch size, kernel margin) and find its geometry.

    Args:
      spec: the export's spec (bands in the model's channel order, P from the mixer, k from the records).
      where: the export's first shard, named in the errors.
    Raises:
      ModelMismatchError: for several model inputs; an input whose channels differ from the bands; an image
        input whose side is neither S nor P (or the run's patch size differing from the export's); an odd
        kernel margin; an output whose side is neither S nor P, or whose rank is not that of a per-pixel
        (image) or per-row (table) output.
    """
    model, name = loaded.model, loaded.path
    if len(model.inputs) != 1:
        raise ModelMismatchError(f"{name}: the model takes {len(model.inputs)} inputs; predict feeds one tensor "
                                 "of every band")
    shape = tuple(model.inputs[0].shape)
    channels = shape[-1]
    if channels is not None and channels != len(spec.bands):
        raise ModelMismatchError(f"{name}: the model takes {channels} bands, {where} gives {len(spec.bands)} "
                                 f"({', '.join(spec.bands)})")
    if spec.kind != IMAGE:
        if len(shape) != 2:
            raise ModelMismatchError(f"{name}: input shape {shape} is not [batch, bands], as a table export needs")
        out = _dry_run(model, [1, len(spec.bands)])
        if out.shape.rank not in (1, 2):
            raise ModelMismatchError(f"{name}: output shape {out.shape} is not [batch] or [batch, outputs]")
        return Geometry(0, 0, 0, 1 if out.shape.rank == 1 else int(out.shape[-1]))
    p, k = spec.patch_size, spec.kernel_margin
    s = p + k
    run = loaded.spec
    if run is not None and run.kind == IMAGE and run.patch_size != p:
        raise ModelMismatchError(f"{name}: the run was trained on {run.patch_size}x{run.patch_size} patches, "
                                 f"{where} holds {p}x{p} patches (mixer patchDimensions)")
    if k % 2:
        raise ModelMismatchError(f"{where}: stored patches of {s}x{s} for patchDimensions {p}x{p} imply an odd "
                                 f"kernel margin {k}: it cannot be cropped by k/2 on each side")
    if len(shape) != 4:
        raise ModelMismatchError(f"{name}: input shape {shape} is not [batch, height, width, bands]")
    side = shape[1]
    if side not in (None, s, p):
        trained = f" (the run's spec: P={run.patch_size}, margin {run.kernel_margin})" if run else ""
        raise ModelMismatchError(f"{name}: the model takes {side}x{side} patches{trained}; {where} stores "
                                 f"{s}x{s} (P={p} + kernel margin {k}), cropped {p}x{p}")
    side = side or s
    out = _dry_run(model, [1, side, side, len(spec.bands)])
    if out.shape.rank not in (3, 4) or out.shape[1] != out.shape[2] or out.shape[1] not in (s, p):
        raise ModelMismatchError(f"{name}: on {side}x{side} patches the model returns {list(out.shape)}; expected "
                                 f"[batch, {s}, {s}(, outputs)] (the stored patch, cropped by {k // 2} per side) "
                                 f"or [batch, {p}, {p}(, outputs)] (already cropped)")
    crop = (out.shape[1] - p) // 2
    return Geometry(side, crop, p, 1 if out.shape.rank == 3 else int(out.shape[-1]))


def _dry_run(model, shape) -> tf.Tensor:
    return tf.convert_to_tensor(model(tf.zeros(shape, tf.float32), training=False))


def applies_softmax(model) -> bool:
    """Whether the model's last layer already returns probabilities (a softmax activation), so predict does not
    apply softmax again."""
    activation = getattr(model.layers[-1], "activation", None)
    return getattr(activation, "__name__", "") == "softmax" or type(model.layers[-1]).__name__ == "Softmax"
