"""The printed upload commands against the Earth Engine CLI's own argument rules (earthengine-api's
ee/cli/commands.py, offline: its parsers and `manifest_from_args`, which refuses a source outside Cloud Storage
and a table of more than one file), for outputs on local disk and on gs://. The CLI runs in its own process
(scripts/ee_manifests.py: importing it turns off TensorFlow's eager execution in the importing process)."""
import importlib.util
import json
import pathlib
import shlex
import subprocess
import sys

import pytest

from harness.predict import identity, upload

if importlib.util.find_spec("ee") is None:
    pytest.skip("earthengine-api (setup.cfg's test extra) not installed", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "ee_manifests.py"
IMAGE_LOCAL = ["/runs/preds/scene-00000.tfrecord", "/runs/preds/scene-00001.tfrecord", "/runs/preds/scene-mixer.json"]
IMAGE_GCS = ["gs://b/preds/scene-00000.tfrecord", "gs://b/preds/scene-00001.tfrecord", "gs://b/preds/scene-mixer.json"]
NAME = "projects/my-project/assets/predictions"


def _manifests(*lines: str) -> list[dict]:
    """What `earthengine upload image|table ...` would send for each line: {"manifest": ...} or {"error": ...}."""
    done = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps(lines), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _manifest(line: str) -> dict:
    (got,) = _manifests(line)
    assert "manifest" in got, got
    return got["manifest"]


def test_the_line_harness_printed_before_is_refused_by_the_cli():
    """The old line (local files as sources) is what the issue found the CLI refuses: the check can fail."""
    (got,) = _manifests(shlex.join(["earthengine", "upload", "image", "--asset_id=ASSET", *IMAGE_LOCAL]))
    assert got == {"error": "EEException: Invalid Cloud Storage URL: /runs/preds/scene-00000.tfrecord"}


def test_local_image_outputs_are_copied_then_uploaded_in_order_mixer_last():
    first, second = upload.lines(IMAGE_LOCAL, image=True)
    assert shlex.split(first) == ["gcloud", "storage", "cp", *IMAGE_LOCAL, "gs://BUCKET/PATH/"]
    manifest = _manifest(second)
    assert manifest["name"] == "projects/my-project/assets/predictions"
    assert manifest["tilesets"] == [{"id": "ts", "sources": [{"uris": [
        "gs://BUCKET/PATH/scene-00000.tfrecord", "gs://BUCKET/PATH/scene-00001.tfrecord",
        "gs://BUCKET/PATH/scene-mixer.json"]}]}]       # one source of many uris: the TFRecord upload


def test_outputs_on_cloud_storage_are_uploaded_where_they_are():
    (line,) = upload.lines(IMAGE_GCS, image=True)
    assert _manifest(line)["tilesets"][0]["sources"] == [{"uris": IMAGE_GCS}]
    (line,) = upload.lines(["gs://b/preds/points.csv"], image=False, table_flags=identity.location_flags(
        ["system:index", "longitude", "latitude"]))
    assert _manifest(line)["sources"] == [{"uris": ["gs://b/preds/points.csv"], "x_column": "longitude",
                                           "y_column": "latitude"}]   # the points placed by their coordinates


def test_a_table_of_several_files_is_one_table_per_file():
    files = ["/runs/p/points-00000.tfrecord", "/runs/p/points-00001.tfrecord"]
    copy, *uploads = upload.lines(files, image=False)
    assert shlex.split(copy) == ["gcloud", "storage", "cp", *files, "gs://BUCKET/PATH/"]
    names = [_manifest(line)["name"] for line in uploads]
    assert names == [NAME + "-00000", NAME + "-00001"]
    (got,) = _manifests(shlex.join(["earthengine", "upload", "table", "--asset_id=ASSET",   # one line of both
                                    "gs://BUCKET/PATH/points-00000.tfrecord", "gs://BUCKET/PATH/points-00001.tfrecord"]))
    assert got == {"error": "ValueError: Exactly one file must be specified."}


def test_mixed_or_empty_outputs_are_refused():
    with pytest.raises(ValueError, match="both on Cloud Storage and local"):
        upload.commands([IMAGE_LOCAL[0], IMAGE_GCS[1]], image=True)
    with pytest.raises(ValueError, match="nothing to upload"):
        upload.commands([], image=False)
