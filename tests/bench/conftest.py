"""Fixtures for the benchmark commands: a tiny image export."""
import pytest

from harness.data.export import synth


@pytest.fixture(scope="session")
def small_images(tmp_path_factory):
    """4 GZIP shards of 16x16 patches, 4 bands, 3 classes, 64 records; returns the folder."""
    out = tmp_path_factory.mktemp("small_images")
    synth.write_image_export(str(out), prefix="img", shards=4, records=64, patch_size=16, classes=3, seed=3)
    return out
