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
The per-band tensors are grouped as the run's pipeline delivers them (`harness.data.input.decode.stack_bands`): one
tensor of every band, or with band groups one tensor per group (group_delivery "dict") or the groups on a time axis
("time"). Image tiles are H = W = the model's input side (the stored patch P + k, or P); an output of the stored size is
cropped by k/2 per side as `harness predict` crops it, so the returned tile is P x P; a run that resized its patches
(`resize: R`) is served as predict serves it: tiles resized to R x R, outputs resized back before the crop.
Payload formats: https://developers.google.com/earth-engine/apidocs/ee-model-fromvertexai
"""
from __future__ import annotations

import json
import re

import tensorflow as tf

from harness import keras_kinds
from harness.data.input import decode
from harness.data.spec.dataspec import IMAGE, DataSpec
from harness.predict import model as model_lib
from harness.tracing import graph_function, user_code

PAYLOAD = "SERIALIZED_TF_TENSORS"


class ServingModule(tf.Module):
    """The Keras model with its post-processing, as the two signatures (see the module doc)."""

    def __init__(self, loaded: model_lib.LoadedModel, spec: DataSpec, geometry: model_lib.Geometry, *,
                 probabilities: bool, class_dtype: str = "int64"):
        super().__init__()
        self._class_dtype = tf.as_dtype(class_dtype)
        self.model = loaded.model
        # Keras 3 keeps a random layer's seed state (RandomFlip, RandomRotation: identity at inference, yet their call
        # reads it) in variables its TensorFlow tracking does not reach from the model: tracked here, else the save
        # fails with a KeyError (a captured "seed_generator_state" not reachable from the root).
        self._model_variables = list(loaded.model.variables)
        self._bands = tuple(spec.bands)
        self._image = spec.kind == IMAGE
        # Earth Engine sends each band on its own, an array band as [tile..., depth] (ee.Model's inputShapes), not
        # as the export stored it (collapsed, or one SequenceExample per pixel).
        self._depths = {b: spec.depth_of(b) for b in self._bands}
        # The pipeline's own stacking for tiles of the model's input side: float32 bands, stored as they come.
        self._spec = spec.replace(dtypes={}, collapsed={}, sequence=False, label=None,
                                  **({"patch_size": geometry.input_side, "kernel_margin": 0,
                                                 "crop_margin": False, "resize": geometry.resize or None}
                                                if self._image else {}))
        self._geometry = geometry
        self._probabilities = probabilities
        self._softmax = keras_kinds.softmax_output(loaded.model) is None   # else its outputs are probabilities
        tile = [None, geometry.input_side, geometry.input_side] if self._image else [None]
        dense = {b: tf.TensorSpec(tile + self._per_pixel(b), tf.float32, name=b) for b in self._bands}
        strings = {b: tf.TensorSpec([None], tf.string, name=b) for b in self._bands}
        # Traced as written; AutoGraph converts the user's model only (`harness.tracing`).
        self._forward = user_code(lambda x: self.model(x, training=False))
        self.grpc = graph_function(self._dense, input_signature=[dense])
        self.serialized = graph_function(self._serialized, input_signature=[strings])

    def _per_pixel(self, band: str) -> list:
        """[depth] for an array band, [] for a band of one value per pixel."""
        return [self._depths[band]] if self._depths[band] > 1 else []

    def _flat(self, band: str, x: tf.Tensor) -> tf.Tensor:
        """One band's tile [N, H, W(, D)] -> [N, D*H*W] with the depth outermost, as Earth Engine stores it."""
        x = tf.cast(x, tf.float32)
        if not self._image:
            return x
        if self._depths[band] > 1:
            x = tf.transpose(x, [0, 3, 1, 2])
        return tf.reshape(x, [tf.shape(x)[0], -1])

    def _dense(self, inputs):
        flat = {b: self._flat(b, inputs[b]) for b in self._bands}
        x = decode.stack_bands(self._spec, flat)
        y = tf.cast(self._forward(x), tf.float32)
        g = self._geometry
        if self._image:
            if y.shape.rank == 3:
                y = y[..., None]
            y = g.restore(y)
        elif y.shape.rank == 1:
            y = y[:, None]
        out = {"class": tf.cast(tf.argmax(y, axis=-1, output_type=tf.int64), self._class_dtype)}
        if self._probabilities:
            out["probabilities"] = tf.nn.softmax(y, axis=-1) if self._softmax else y
        return out

    def _serialized(self, inputs):
        side = self._geometry.input_side
        shape = [side, side] if self._image else []
        dense = {b: tf.map_fn(lambda s: tf.io.parse_tensor(s, tf.float32), inputs[b],
                              fn_output_signature=tf.TensorSpec(shape + self._per_pixel(b), tf.float32))
                 for b in self._bands}
        return {k: tf.map_fn(tf.io.serialize_tensor, v, fn_output_signature=tf.string)
                for k, v in self._dense(dense).items()}


def export_savedmodel(loaded: model_lib.LoadedModel, spec: DataSpec, output: str, *,
                      probabilities: bool = False) -> tuple[dict, dict]:
    """Write the SavedModel to `output` and return the matching `ee.Model.fromVertexAi` arguments and what it asks
    of Vertex AI (`harness.predict.vertex`).

    The class band is the smallest integer type that holds the model's classes (uint8 up to 256 classes).
    Args:
      spec: the model's input spec: bands in channel order, band groups and their delivery; for images P
        (patch_size) and k (kernel_margin).
    Returns:
      (arguments, facts). arguments: {"payloadFormat", "inputTileSize", "inputOverlapSize", "outputTileSize",
       "outputBands": {band: {"type", "dimensions"}}} for images, {"payloadFormat", "inputProperties",
       "outputProperties"} for tables, both with "outputMultiplier" (response / request bytes, >= 1) and
       "maxPayloadBytes" (Vertex AI's online request limit). facts: {"tensorflow_version", "classes",
       "class_dtype", "request_bytes", "response_bytes" (one tile or row, bytes), "limit_bytes", "largest_tile"
       (images: the largest input tile side whose request fits the limit, pixels)}; also written to
       `output/assets.extra/harness_export.json` (a folder TensorFlow Serving ignores).
    Raises:
      ModelMismatchError: as `harness.predict.model.check` (the model against the spec).
    """
    from harness.predict import vertex

    geometry = model_lib.check(loaded, spec, "the run's spec")
    shape = getattr(loaded.model, "output_shape", None)   # a subclassed model has none: its dry run's channels
    shape = shape[0] if isinstance(shape, list) else shape      # several outputs: the first is the class scores
    classes = (int(shape[-1]) if len(shape) in (2, 4) and shape[-1] else 1) if shape else geometry.channels
    dtype, pixel_type = vertex.class_dtype(classes)
    module = ServingModule(loaded, spec, geometry, probabilities=probabilities, class_dtype=dtype)
    tf.saved_model.save(module, output, signatures={"serving_default": module.serialized.get_concrete_function(),
                                                    "grpc": module.grpc.get_concrete_function()})
    image = spec.kind == IMAGE
    outputs = {"class": {"type": pixel_type, "dimensions": 0}}
    tile = [geometry.patch, geometry.patch] if image else []
    sizes = {"class": (tile, dtype)}
    if probabilities:
        outputs["probabilities"] = {"type": "ee.PixelType.float()", "dimensions": 1}
        sizes["probabilities"] = (tile + [classes], "float32")
    request = vertex.request_bytes(spec.channels, geometry.input_side if image else None)
    response = vertex.response_bytes(sizes)
    sizing = {"outputMultiplier": max(1.0, round(response / request + 0.005, 2)),
              "maxPayloadBytes": vertex.ONLINE_REQUEST_LIMIT}
    facts = {"tensorflow_version": tf.__version__, "classes": classes, "class_dtype": dtype,
             "request_bytes": request, "response_bytes": response, "limit_bytes": vertex.ONLINE_REQUEST_LIMIT,
             "largest_tile": vertex.largest_tile(spec.channels) if image else None}
    tf.io.gfile.makedirs(f"{output}/assets.extra")
    with tf.io.gfile.GFile(f"{output}/assets.extra/harness_export.json", "w") as f:
        f.write(json.dumps(facts, indent=1))
    # ee.Model.fromVertexAi's inputShapes: "a map from input band names to fixed shapes of input arrays".
    shapes = {"inputShapes": {b: [spec.depth_of(b)] for b in spec.bands if spec.depth_of(b) > 1}}
    shapes = shapes if shapes["inputShapes"] else {}
    if not image:
        return {"payloadFormat": PAYLOAD, "inputProperties": list(spec.bands), **shapes, "outputProperties": outputs,
                **sizing}, facts
    s, half = geometry.input_side, spec.kernel_margin // 2 if geometry.crop else 0
    return {"payloadFormat": PAYLOAD, "inputTileSize": [s, s], "inputOverlapSize": [half, half],
            **shapes, "outputTileSize": [geometry.patch, geometry.patch], "outputBands": outputs, **sizing}, facts


def size_lines(facts: dict) -> list[str]:
    """What `harness export` says of the Vertex AI limits: one tile's request and response, and where a request
    would not fit the online limit, the largest tile that fits and the alternative."""
    from harness.predict import vertex

    what = "tile" if facts["largest_tile"] is not None else "row"
    lines = [f"one {what}: request {facts['request_bytes']:,} bytes, response {facts['response_bytes']:,} bytes "
             f"(Vertex AI's online request limit: {facts['limit_bytes']:,} bytes); class band "
             f"{facts['class_dtype']} ({facts['classes']} classes)"]
    if facts["request_bytes"] > facts["limit_bytes"]:
        lines.append(f"one tile's request exceeds the online limit: tiles of at most {facts['largest_tile']} pixels "
                     "a side fit (export a model for patches that size), or serve the grpc signature "
                     "(payloadFormat=\"GRPC_TF_TENSORS\", raw tensors over gRPC)")
    lines.append(vertex.runtime_advice(facts["tensorflow_version"]))
    return lines


def format_arguments(arguments: dict) -> str:
    """The arguments as a Python call (`ee.PixelType...` unquoted), the endpoint left to the user."""
    parts = [f"{k}={_python(v)}" for k, v in arguments.items()]
    return "ee.Model.fromVertexAi(endpoint=ENDPOINT, " + ", ".join(parts) + ")"


def _python(value) -> str:
    return re.sub(r'"(ee\.PixelType\.\w+\(\))"', r"\1", json.dumps(value))
