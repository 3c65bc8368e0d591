"""`examples/temporal_pixel.py`'s model, which also writes the band statistics it was given (`ModelInputs.mean`,
`.variance`) to `$HARNESS_TEST_INPUTS_DIR/<pid>.json`: the multi-worker test compares the workers'."""
import json
import os
import pathlib
import sys
from collections.abc import Mapping

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
import temporal_pixel  # noqa: E402


def _plain(value):
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return [float(v) for v in value]


def build(inputs, **kwargs):
    folder = os.environ.get("HARNESS_TEST_INPUTS_DIR")
    if folder:
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
            json.dump({"mean": _plain(inputs.mean), "variance": _plain(inputs.variance)}, f)
    return temporal_pixel.build(inputs, **kwargs)
