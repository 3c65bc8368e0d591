"""The printed upload commands against the Earth Engine CLI's own argument rules (earthengine-api's
ee/cli/commands.py, offline: its parsers and `manifest_from_args`, which refuses a source outside Cloud Storage
and a table of more than one file), for outputs on local disk and on gs://."""
import argparse
import shlex

import pytest

from harness.predict import upload

commands = pytest.importorskip("ee.cli.commands", reason="earthengine-api (setup.cfg's test extra) not installed")

IMAGE_LOCAL = ["/runs/preds/scene-00000.tfrecord", "/runs/preds/scene-00001.tfrecord", "/runs/preds/scene-mixer.json"]
IMAGE_GCS = ["gs://b/preds/scene-00000.tfrecord", "gs://b/preds/scene-00001.tfrecord", "gs://b/preds/scene-mixer.json"]


def _manifest(line: str) -> dict:
    """What `earthengine upload image|table ...` would send, from the CLI's own parser and manifest builder."""
    words = shlex.split(line)
    assert words[:2] == ["earthengine", "upload"], line
    command = {"image": commands.UploadImageCommand, "table": commands.UploadTableCommand}[words[2]]
    parser = argparse.ArgumentParser()
    cmd = command(parser)
    return cmd.manifest_from_args(parser.parse_args(words[3:]))


def test_the_line_harness_printed_before_is_refused_by_the_cli():
    """The old line (local files as sources) is what the issue found the CLI refuses: the check can fail."""
    with pytest.raises(Exception, match="Invalid Cloud Storage URL: /runs/preds/scene-00000.tfrecord"):
        _manifest(shlex.join(["earthengine", "upload", "image", "--asset_id=ASSET", *IMAGE_LOCAL]))


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
    (line,) = upload.lines(["gs://b/preds/points.csv"], image=False)
    assert _manifest(line)["sources"] == [{"uris": ["gs://b/preds/points.csv"]}]


def test_a_table_of_several_files_is_one_table_per_file():
    files = ["/runs/p/points-00000.tfrecord", "/runs/p/points-00001.tfrecord"]
    copy, *uploads = upload.lines(files, image=False)
    assert shlex.split(copy) == ["gcloud", "storage", "cp", *files, "gs://BUCKET/PATH/"]
    names = [_manifest(line)["name"] for line in uploads]
    assert names == ["projects/my-project/assets/predictions-00000", "projects/my-project/assets/predictions-00001"]
    with pytest.raises(ValueError, match="Exactly one file must be specified"):   # what one line of both would get
        _manifest(shlex.join(["earthengine", "upload", "table", "--asset_id=ASSET",
                              "gs://BUCKET/PATH/points-00000.tfrecord", "gs://BUCKET/PATH/points-00001.tfrecord"]))


def test_mixed_or_empty_outputs_are_refused():
    with pytest.raises(ValueError, match="both on Cloud Storage and local"):
        upload.commands([IMAGE_LOCAL[0], IMAGE_GCS[1]], image=True)
    with pytest.raises(ValueError, match="nothing to upload"):
        upload.commands([], image=False)
