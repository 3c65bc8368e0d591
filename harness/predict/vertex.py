"""What an exported model asks of Vertex AI online prediction: request and response sizes, the arguments
`ee.Model.fromVertexAi` sizes its requests by, and the serving runtime that matches the exporting TensorFlow.

Sizes are those of the JSON body Vertex AI's online prediction takes, one instance per tile, each input band's
serialized TensorProto base64-encoded (`{"instances": [{"B2": {"b64": "..."}, ...}]}`:
cloud.google.com/vertex-ai/docs/predictions/get-online-predictions, "Send an online inference request"; binary
inputs as `{"b64": ...}`), and likewise the response (`{"predictions": [{"class": {"b64": ...}}]}`). The payload of
Earth Engine's SERIALIZED_TF_TENSORS format is exactly these tensors (developers.google.com/earth-engine/apidocs/
ee-model-fromvertexai); the JSON framing around them is a few dozen bytes of a megabyte-sized body.

Limits and facts, with their sources:
  ONLINE_REQUEST_LIMIT: "the payload limit size (currently, 1.5MB)" of an online request
    (cloud.google.com/sdk/gcloud/reference/ai/endpoints/predict).
  `outputMultiplier`: "an approximation to how much larger the output payload will be than the input", >= 1, and
  `maxPayloadBytes`: the size Earth Engine keeps each request under (ee.Model.fromVertexAi's reference).
  PREBUILT_TENSORFLOW: the TensorFlow versions of Vertex AI's prebuilt prediction containers
    (cloud.google.com/vertex-ai/docs/predictions/pre-built-containers, read 2026-12-01: 2.1 to 2.15); a runtime
    older than the exporting TensorFlow can fail to load the model ("Op type not registered").
"""
from __future__ import annotations

import json
from typing import Mapping, Optional, Sequence

import numpy as np

ONLINE_REQUEST_LIMIT = 1_500_000       # bytes
PREBUILT_TENSORFLOW = tuple(f"2.{m}" for m in range(1, 16))
PREBUILT_IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/tf2-{device}.{version}:latest"


def _serialized_bytes(shape: Sequence[int], dtype) -> int:
    """Bytes of `tf.io.serialize_tensor` of a tensor of `shape` and `dtype` (zeros: the size does not depend on
    the values, the data being stored as raw tensor_content)."""
    import tensorflow as tf

    return len(tf.io.serialize_tensor(tf.zeros(shape, dtype)).numpy())


def _body_bytes(key: str, fields: Mapping[str, int]) -> int:
    """Bytes of `{key: [{name: {"b64": <base64 of n bytes>}, ...}]}` for fields {name: n}, as json.dumps writes it."""
    instance = {name: {"b64": "A" * (4 * -(-n // 3))} for name, n in fields.items()}   # base64: 4 chars per 3 bytes
    return len(json.dumps({key: [instance]}))


def request_bytes(bands: Sequence[str], tile: Optional[int]) -> int:
    """Bytes of one instance's online request: per band a float32 [tile, tile] tensor (an image tile of side
    `tile`, pixels) or a float32 scalar (a table row: `tile` None)."""
    shape = [tile, tile] if tile else []
    one = _serialized_bytes(shape, "float32")
    return _body_bytes("instances", {b: one for b in bands})


def response_bytes(outputs: Mapping[str, tuple]) -> int:
    """Bytes of one instance's response: outputs {band: (shape, dtype)}, e.g. {"class": ([256, 256], "uint8")}."""
    return _body_bytes("predictions", {name: _serialized_bytes(shape, dtype) for name, (shape, dtype) in
                                       outputs.items()})


def largest_tile(bands: Sequence[str], limit: int = ONLINE_REQUEST_LIMIT, multiple: int = 1) -> int:
    """The largest input tile side (pixels, a multiple of `multiple`) whose one-instance request fits in `limit`
    bytes; 0 if none does."""
    lo, hi = 0, 1
    while request_bytes(bands, hi * multiple) <= limit:
        lo, hi = hi, hi * 2
    while hi - lo > 1:                       # request_bytes grows with the side: bisect
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if request_bytes(bands, mid * multiple) <= limit else (lo, mid)
    return lo * multiple


def class_dtype(classes: int) -> tuple[str, str]:
    """The smallest integer type holding class ids 0 .. classes-1: (numpy/TensorFlow dtype name, ee.PixelType)."""
    for name in ("uint8", "uint16", "int32"):
        if classes - 1 <= np.iinfo(name).max:
            return name, f"ee.PixelType.{name}()"
    return "int64", "ee.PixelType.int64()"


def prebuilt_container(tensorflow_version: str, *, gpu: bool = False) -> Optional[str]:
    """The Vertex AI prebuilt prediction image for the major.minor of `tensorflow_version` ("2.15.1"), or None
    where Vertex AI has none."""
    major_minor = ".".join(tensorflow_version.split(".")[:2])
    if major_minor not in PREBUILT_TENSORFLOW:
        return None
    return PREBUILT_IMAGE.format(device="gpu" if gpu else "cpu", version=major_minor.replace(".", "-"))


def runtime_advice(tensorflow_version: str) -> str:
    """One line: the container that serves a SavedModel exported with `tensorflow_version`, or how to serve it."""
    image = prebuilt_container(tensorflow_version)
    if image:
        return f"serving container: {image} (TensorFlow {tensorflow_version} exported it; GPU: tf2-gpu)"
    newest = PREBUILT_TENSORFLOW[-1]
    major_minor = ".".join(tensorflow_version.split(".")[:2])
    return (f"serving container: none prebuilt: Vertex AI's prebuilt TensorFlow prediction containers end at "
            f"{newest} and TensorFlow {tensorflow_version} exported this model (an older runtime can fail with 'Op "
            f"type not registered'); serve it from a custom container running TensorFlow Serving "
            f"{major_minor} (tensorflow/serving:{tensorflow_version}, "
            "cloud.google.com/vertex-ai/docs/predictions/use-custom-container)")
