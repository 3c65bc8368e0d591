"""Shared fixtures: the real exports in ../shared/data and small synthetic exports."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(os.environ.get("HARNESS_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"real exports not found at {SHARED_DATA} (set HARNESS_SHARED_DATA)")
    return SHARED_DATA
