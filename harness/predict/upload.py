"""The commands that take predictions into Earth Engine: `earthengine upload image|table`, from Cloud Storage.

The Earth Engine CLI takes its sources from Cloud Storage only: `upload image` refuses any source that does not
start with `gs://` ("Invalid Cloud Storage URL", `_check_valid_files` in earthengine-api's ee/cli/commands.py)
and `upload table` takes exactly one ("Exactly one file must be specified"); see
developers.google.com/earth-engine/guides/command_line#upload. So predictions written to `gs://` are named where
they are, and predictions written to a local folder are first copied to a bucket with `gcloud storage cp`
(cloud.google.com/sdk/gcloud/reference/storage/cp), then uploaded from there. The asset id
`projects/my-project/assets/predictions` (an asset of one's Cloud project, as Earth Engine's docs write it; a bare
id is read as one of `earthengine-public`, the public catalogue) and `gs://BUCKET/PATH` (where the copies go) are
placeholders the user fills in.

An image's sources are its TFRecord files in patch order, then the mixer (the TFRecord upload of an image:
developers.google.com/earth-engine/guides/tfrecord#uploading-tfrecords-to-earth-engine). `upload_lines` gives a
`harness predict` run's commands; an image export without a mixer gets none (`NO_MIXER` is said instead).
"""
from __future__ import annotations

import posixpath
import shlex
from typing import Sequence

from harness.distribute.sharding import files_with_records
from harness.predict import identity
from harness.predict.options import CSV

ASSET = "projects/my-project/assets/predictions"
STAGING = "gs://BUCKET/PATH"

# Earth Engine's TfRecordImageExportOptions: "maxMaskedRatio: Maximum allowed proportion of masked pixels in a
# patch. Patches which exceed this allowance will be dropped rather than written to files. If this field is set to
# anything but 1, the JSON sidecar will not be produced." (docs/GEE_FORMAT.md, "Layout options")
NO_MIXER = ("no upload: the export has no mixer.json, which Earth Engine writes only when no patch was dropped "
            "(maxMaskedRatio below 1 drops patches with more masked pixels and then writes no sidecar), so neither "
            "Earth Engine nor a GeoTIFF can place these patches (no map is written); the predictions above are in "
            "the export's patch order. "
            "To upload a mosaic, export the image again with maxMaskedRatio 1 (the default; masked pixels are then "
            "filled with defaultValue) and predict on that export")


def is_cloud(path: str) -> bool:
    """Whether `path` names a Cloud Storage object (`gs://bucket/...`)."""
    return path.startswith("gs://")


def commands(files: Sequence[str], *, image: bool, staging: str = STAGING,
             table_flags: Sequence[str] = ()) -> list[list[str]]:
    """The argv of each command, in the order to run them, that uploads `files` as one Earth Engine asset.

    files: for an image, its TFRecord files in patch order and the mixer last; for a table, its files (one CSV, or
      TFRecord files: the CLI takes one file per table, so each becomes its own table, `...ASSET-00000`, ...).
      All on Cloud Storage, or all local (then the first command copies them to `staging`).
    table_flags: for a table, the flags that give its rows their location (`harness.predict.identity`).
    Raises:
      ValueError: if `files` is empty, or mixes `gs://` objects and local files."""
    if not files:
        raise ValueError("nothing to upload: no output file has records")
    cloud = {is_cloud(f) for f in files}
    if len(cloud) > 1:
        raise ValueError(f"outputs both on Cloud Storage and local: {', '.join(files)}")
    out = []
    if cloud == {False}:
        out.append(["gcloud", "storage", "cp", *files, staging.rstrip("/") + "/"])
        files = [posixpath.join(staging, posixpath.basename(f)) for f in files]
    if image:
        out.append(["earthengine", "upload", "image", f"--asset_id={ASSET}", *files])
    elif len(files) == 1:
        out.append(["earthengine", "upload", "table", f"--asset_id={ASSET}", *table_flags, files[0]])
    else:
        out += [["earthengine", "upload", "table", f"--asset_id={ASSET}-{i:05d}", *table_flags, f]
                for i, f in enumerate(files)]
    return out


def lines(files: Sequence[str], *, image: bool, staging: str = STAGING, table_flags: Sequence[str] = ()) -> list[str]:
    """`commands` as shell lines (shlex-quoted), in order."""
    return [shlex.join(c) for c in commands(files, image=image, staging=staging, table_flags=table_flags)]


def upload_lines(job) -> list[str]:
    """The commands that upload the outputs of `job` (`harness.predict.job.Job`) to Earth Engine, in order
    (`lines`): zero-record shards left out; for images the mixer copy last; for tables the whole CSV (or the
    TFRecord files). Local outputs are copied to a bucket first (the CLI reads only gs://)."""
    files = files_with_records([(out, n) for out, (_, n) in zip(job.outputs, job.shards.counts)])
    if job.image and job.shards.mixer is None:
        return []
    if job.image:
        return lines([*files, job.mixer_copy], image=True) if files else []
    flags = identity.location_flags(job.kept_columns)
    if flags is None:   # no location in the rows: `identity.NO_LOCATION` is said instead
        return []
    files = [job.merged_csv] if job.options.format == CSV else files
    return lines(files, image=False, table_flags=flags) if files else []
