"""Fixtures for the data tests: tiny synthetic exports."""
import pytest

from harness.data.export import synth


@pytest.fixture(scope="session")
def image_export(tmp_path_factory):
    """3 GZIP shards, 10 patches of 8x8 + margin 4 (stored 12x12), 3 float bands, 3 classes; returns the folder."""
    out = tmp_path_factory.mktemp("image_export")
    synth.write_image_export(str(out), prefix="tiny", shards=3, records=10, bands=["B2", "B3", "B4"],
                             label="landcover", classes=3, patch_size=8, kernel_size=4, seed=1)
    return out


@pytest.fixture(scope="session")
def table_export(tmp_path_factory):
    """2 GZIP shards, 64 rows, 4 float bands and a float `class` label in 0..2; returns the folder."""
    out = tmp_path_factory.mktemp("table_export")
    synth.write_table_export(str(out), prefix="points", shards=2, records=64, bands=["a", "b", "c", "d"],
                             label="class", classes=3, seed=2)
    return out
