"""What `harness export` says of Vertex AI: one tile's request and response bytes as the JSON body carries them,
`outputMultiplier` and `maxPayloadBytes` among the printed `ee.Model.fromVertexAi` arguments, a tile over the
online limit named with the largest that fits, the class band's smallest integer type, and the serving runtime
for the exporting TensorFlow (harness/predict/vertex.py)."""
import base64
import json
import re

import numpy as np
import pytest
import tensorflow as tf
from predict_support import run_cli

from harness.predict import vertex

BANDS = ["B2", "B3", "B4", "B8"]


def _json_request(tiles: dict) -> bytes:
    """The online request body of one instance, built from real serialized tensors."""
    instance = {b: {"b64": base64.b64encode(tf.io.serialize_tensor(t).numpy()).decode()} for b, t in tiles.items()}
    return json.dumps({"instances": [instance]}).encode()


def test_request_bytes_are_those_of_a_real_request():
    rng = np.random.default_rng(0)
    for side in (16, 100, 288):
        tiles = {b: rng.normal(size=(side, side)).astype(np.float32) for b in BANDS}
        assert vertex.request_bytes(BANDS, side) == len(_json_request(tiles))
    # The issue's own measurement: a 256 x 256 tile with a 32-pixel margin, 4 bands, 1,769,661 bytes.
    assert vertex.request_bytes(BANDS, 256 + 32) == 1_769_661
    rows = {b: np.float32(1.5) for b in BANDS}
    assert vertex.request_bytes(BANDS, None) == len(_json_request(rows))


def test_the_largest_tile_is_the_last_that_fits():
    side = vertex.largest_tile(BANDS)
    assert vertex.request_bytes(BANDS, side) <= vertex.ONLINE_REQUEST_LIMIT < vertex.request_bytes(BANDS, side + 1)
    assert vertex.largest_tile(BANDS, multiple=16) % 16 == 0


def test_the_class_type_is_the_smallest_that_holds_the_classes():
    assert [vertex.class_dtype(c)[0] for c in (2, 256, 257, 65536, 65537)] == \
        ["uint8", "uint8", "uint16", "uint16", "int32"]


def test_the_runtime_advice_names_a_prebuilt_image_only_where_one_exists():
    assert vertex.prebuilt_container("2.15.1") == "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"
    assert vertex.prebuilt_container("2.12.0", gpu=True) == "us-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-12:latest"
    assert vertex.prebuilt_container("2.18.1") is None
    assert "tensorflow/serving:2.18.1" in vertex.runtime_advice("2.18.1")


@pytest.fixture(scope="module")
def big_tile_model(tmp_path_factory):
    """A 10-class per-pixel model for 256 x 256 tiles with a 32-pixel margin (288 x 288 input), 4 bands."""
    import tf_keras as keras

    x = keras.Input((288, 288, 4))
    model = keras.Model(x, keras.layers.Conv2D(10, 1)(x))
    path = tmp_path_factory.mktemp("big") / "m.keras"
    model.save(str(path))
    return path


def test_an_export_over_the_online_limit_says_so_with_the_tile_that_fits(big_tile_model, tmp_path):
    out = tmp_path / "sm"
    r = run_cli("export", "--model", big_tile_model, "--output", out, "--bands", *BANDS, "--patch-size", 256,
                "--kernel-margin", 32, "--probabilities")
    facts = json.loads((out / "assets.extra" / "harness_export.json").read_text())
    assert facts["tensorflow_version"] == tf.__version__ and facts["classes"] == 10
    assert facts["class_dtype"] == "uint8" and facts["request_bytes"] == 1_769_661
    expected_response = vertex.response_bytes({"class": ([256, 256], "uint8"),
                                               "probabilities": ([256, 256, 10], "float32")})
    assert facts["response_bytes"] == expected_response
    assert (f"one tile: request 1,769,661 bytes, response {expected_response:,} bytes (Vertex AI's online request "
            "limit: 1,500,000 bytes); class band uint8 (10 classes)") in r.stdout
    assert (f"one tile's request exceeds the online limit: tiles of at most {vertex.largest_tile(BANDS)} pixels a "
            "side fit") in r.stdout and 'payloadFormat="GRPC_TF_TENSORS"' in r.stdout
    multiplier = float(re.search(r"outputMultiplier=([\d.]+)", r.stdout).group(1))
    assert multiplier == pytest.approx(expected_response / 1_769_661, abs=0.01) and multiplier >= 1
    assert "maxPayloadBytes=1500000" in r.stdout
    assert '"class": {"type": ee.PixelType.uint8(), "dimensions": 0}' in r.stdout
    assert f"TensorFlow {tf.__version__}" in r.stdout and "serving container: " in r.stdout
    # The served class band is that type.
    serve = tf.saved_model.load(str(out)).signatures["grpc"]
    got = serve(**{b: tf.zeros([1, 288, 288]) for b in BANDS})["class"]
    assert got.dtype == tf.uint8 and got.shape == (1, 256, 256)
