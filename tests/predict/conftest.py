"""Fixtures for the predict tests: a synthetic image export with a kernel margin in 5 shards of unequal size, and a
model that returns one input band (helpers: tests/predict_support.py)."""
import pathlib

import pytest
from predict_support import BANDS, K, P, RECORDS, band_picker

from harness.data.export import synth


@pytest.fixture(scope="session")
def margin_export(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("margin_export")
    synth.write_image_export(str(out), prefix="scene", shards=5, records=RECORDS, bands=BANDS, label=None,
                             patch_size=P, kernel_size=K, seed=3)
    return out


@pytest.fixture(scope="session")
def b3_model(tmp_path_factory) -> pathlib.Path:
    """Returns band B3 as its one output channel (a regression model, any patch side)."""
    return band_picker(tmp_path_factory.mktemp("b3") / "b3.keras", [[0, 1, 0, 0]])


