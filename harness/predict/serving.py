"""`harness export --format savedmodel`: a SavedModel for Earth Engine's hosted-model path (`ee.Model.fromVertexAi`).

Two signatures, both with one input per band named exactly as the band (any key order), both returning the
declared output bands (`class`, and `probabilities` when asked), the model's own preprocessing (its
Normalization layer) included:
  serving_default  Earth Engine's default payload, SERIALIZED_TF_TENSORS: per band a string [batch], each a
                   serialized TensorProto (float32 [H, W] per image tile, a float32 scalar per table row);
                   returns per output band a string [batch] of serialized tensors: class int64 [P, P] (or
                   scalar), probabilities float32 [P, P, classes] (or [classes]).
  grpc             GRPC_TF_TENSORS: per band float32 [batch, H, W] (image) or [batch] (table); returns class
                   int64 [batch, P, P] / [batch] and probabilities float32 [batch, P, P, classes] / [batch,
                   classes].
The per-band tensors are grouped as the run's pipeline delivers them (`harness.data.pipeline.stack_bands`): one
tensor of every band, or with band groups one tensor per group (group_delivery "dict") or the groups on a time axis
("time"). Image tiles are H = W = the model's input side (the stored patch P + k, or P); an output of the stored size is
cropped by k/2 per side as `harness predict` crops it, so the returned tile is P x P; a run that resized its patches
(`resize: R`) is served as predict serves it: tiles resized to R x R, outputs resized back before the crop.
Payload formats: https://developers.google.com/earth-engine/apidocs/ee-model-fromvertexai
"""
from __future__ import annotations

import json

import tensorflow as tf

from harness.data import pipeline
from harness.data.spec import IMAGE, DataSpec
from harness.predict import model as model_lib

PAYLOAD = "SERIALIZED_TF_TENSORS"


class ServingModule(tf.Module):
    """The Keras model with its post-processing, as the two signatures (see the module doc)."""

    def __init__(self, loaded: model_lib.LoadedModel, spec: DataSpec, geometry: model_lib.Geometry, *,
                 probabilities: bool):
        super().__init__()
        self.model = loaded.model
        self._bands = tuple(spec.bands)
        self._image = spec.kind == IMAGE
        # The pipeline's own stacking for tiles of the model's input side: float32 bands, stored as they come.
        self._spec = spec.replace(dtypes={}, **({"patch_size": geometry.input_side, "kernel_margin": 0,
                                                 "crop_margin": False, "resize": geometry.resize or None}
                                                if self._image else {}))
        self._geometry = geometry
        self._probabilities = probabilities
        self._softmax = not model_lib.applies_softmax(loaded.model)
        tile = [None, geometry.input_side, geometry.input_side] if self._image else [None]
        dense = {b: tf.TensorSpec(tile, tf.float32, name=b) for b in self._bands}
        strings = {b: tf.TensorSpec([None], tf.string, name=b) for b in self._bands}
        self.grpc = tf.function(self._dense, input_signature=[dense])
        self.serialized = tf.function(self._serialized, input_signature=[strings])

    def _dense(self, inputs):
        flat = {b: tf.reshape(tf.cast(inputs[b], tf.float32), [tf.shape(inputs[b])[0], -1]) if self._image
                else tf.cast(inputs[b], tf.float32) for b in self._bands}
        x = pipeline.stack_bands(self._spec, flat)
        y = tf.cast(self.model(x, training=False), tf.float32)
        g = self._geometry
        if self._image:
            if y.shape.rank == 3:
                y = y[..., None]
            y = g.restore(y)
        elif y.shape.rank == 1:
            y = y[:, None]
        out = {"class": tf.argmax(y, axis=-1, output_type=tf.int64)}
        if self._probabilities:
            out["probabilities"] = tf.nn.softmax(y, axis=-1) if self._softmax else y
        return out

    def _serialized(self, inputs):
        side = self._geometry.input_side
        shape = [side, side] if self._image else []
        dense = {b: tf.map_fn(lambda s: tf.io.parse_tensor(s, tf.float32), inputs[b],
                              fn_output_signature=tf.TensorSpec(shape, tf.float32)) for b in self._bands}
        return {k: tf.map_fn(tf.io.serialize_tensor, v, fn_output_signature=tf.string)
                for k, v in self._dense(dense).items()}


def export_savedmodel(loaded: model_lib.LoadedModel, spec: DataSpec, output: str, *,
                      probabilities: bool = False) -> dict:
    """Write the SavedModel to `output` and return the matching `ee.Model.fromVertexAi` arguments.

    Args:
      spec: the model's input spec: bands in channel order, band groups and their delivery; for images P
        (patch_size) and k (kernel_margin).
    Returns:
      {"payloadFormat", "inputTileSize", "inputOverlapSize", "outputTileSize", "outputBands": {band: {"type",
       "dimensions"}}} for images; {"payloadFormat", "inputProperties", "outputProperties"} for tables.
    Raises:
      ModelMismatchError: as `harness.predict.model.check` (the model against the spec).
    """
    geometry = model_lib.check(loaded, spec, "the run's spec")
    module = ServingModule(loaded, spec, geometry, probabilities=probabilities)
    tf.saved_model.save(module, output, signatures={"serving_default": module.serialized.get_concrete_function(),
                                                    "grpc": module.grpc.get_concrete_function()})
    outputs = {"class": {"type": "ee.PixelType.int64()", "dimensions": 0}}
    if probabilities:
        outputs["probabilities"] = {"type": "ee.PixelType.float()", "dimensions": 1}
    if spec.kind != IMAGE:
        return {"payloadFormat": PAYLOAD, "inputProperties": list(spec.bands), "outputProperties": outputs}
    s, half = geometry.input_side, spec.kernel_margin // 2 if geometry.crop else 0
    return {"payloadFormat": PAYLOAD, "inputTileSize": [s, s], "inputOverlapSize": [half, half],
            "outputTileSize": [geometry.patch, geometry.patch], "outputBands": outputs}


def format_arguments(arguments: dict) -> str:
    """The arguments as a Python call (`ee.PixelType...` unquoted), the endpoint left to the user."""
    parts = [f"{k}={_python(v)}" for k, v in arguments.items()]
    return "ee.Model.fromVertexAi(endpoint=ENDPOINT, " + ", ".join(parts) + ")"


def _python(value) -> str:
    text = json.dumps(value)
    for kind in ("int64", "float"):
        text = text.replace(f'"ee.PixelType.{kind}()"', f"ee.PixelType.{kind}()")
    return text
