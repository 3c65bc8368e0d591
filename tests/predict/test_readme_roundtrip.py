"""docs/predictions.md's Earth Engine round trip, run as printed (issue 23): the fenced block that opens "## Predictions back
to Earth Engine", every line that reads or writes the bucket or Earth Engine a real process, on the loopback bed of
tests/gcs_bed.py; the one that touches neither (`harness export` of the local run) runs word for word in this
process (`predict_support.cli_in_process`: it saves a process that imports TensorFlow).

Real: the commands, word for word as the page prints them (split as a shell splits them: `\\`-newline joins a
line, `#` starts a comment), with `harness` the installed console script and `earthengine` earthengine-api's own
CLI, both from this virtual environment's bin; TensorFlow's `gs://` file system reading and writing the bucket; the
Earth Engine client's credentials, discovery, token refresh and import request. Stand-ins: the bucket
(gcp-storage-emulator behind the bed's proxy), the Compute Engine metadata server, and Earth Engine's API and
OAuth endpoints (tests/earthengine_bed.py: it records the import request and answers a pending Operation; nothing
is ingested). The export is synthetic (harness.data.export.synth): 4 patches of 16 x 16 in 2 shards, with its mixer. The
`gcs` fixture fails the test if the proxy refused anything (something tried to leave loopback)."""
import contextlib
import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
from predict_support import cli_in_process

from harness.data.export import synth

if importlib.util.find_spec("ee") is None:
    pytest.skip("earthengine-api (setup.cfg's test extra) not installed", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECTION = "## Predictions back to Earth Engine"
BIN = os.path.dirname(sys.executable)            # the venv's bin: `harness` and `earthengine`
ASSET = "projects/my-project/assets/predictions"
PRINTED = re.compile(r"^(?:\[worker \d+\] )?((?:earthengine|gcloud) .*)$")   # an upload line, a worker's prefixed


def readme_commands() -> list[str]:
    """The commands of the first fenced block of docs/predictions.md's Earth Engine section, one per logical line
    (`\\`-newline removed, as the shell removes it)."""
    text = (ROOT / "docs" / "predictions.md").read_text()
    _, found, section = text.partition(f"\n{SECTION}\n")
    assert found, f"docs/predictions.md has no section {SECTION!r}"
    section = section.split("\n## ", 1)[0]
    fence = re.search(r"^```\n(.*?)^```$", section, re.S | re.M)
    assert fence, f"docs/predictions.md's section {SECTION!r} has no fenced block of commands"
    return [line for line in fence.group(1).replace("\\\n", "").splitlines() if line.strip()]


def _env(home: pathlib.Path) -> dict:
    """This process's environment (the `gcs` fixture routed it to the bed) with the venv's bin first on PATH, a
    HOME of the test's own (the Earth Engine CLI's credentials), and the CPU-only TensorFlow of the other
    subprocess tests."""
    return dict(os.environ, PATH=os.pathsep.join([BIN, os.environ.get("PATH", "")]), HOME=str(home),
                CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")


def _exports(gcs, tmp_path) -> None:
    """The training export gs://bucket/export (label `landcover`) and the scene to predict gs://bucket/scene."""
    for name, label, seed in (("export", "landcover", 0), ("scene", None, 1)):
        local = tmp_path / name
        synth.write_image_export(str(local), prefix=name, shards=2, records=4, patch_size=16, label=label,
                                 seed=seed)
        gcs.upload_tree(str(local), gcs.url(name))


def _records(data: bytes, tmp_path) -> int:
    import tensorflow as tf

    path = tmp_path / "shard.tfrecord"
    path.write_bytes(data)
    return sum(1 for _ in tf.data.TFRecordDataset(str(path)))


def test_the_readme_round_trip_runs_as_printed_and_uploads_what_harness_wrote(gcs, tmp_path):
    import earthengine_bed

    lines = readme_commands()
    uploads = [line for line in lines if line.startswith("earthengine upload image ")]
    assert len(uploads) == 1, lines
    for name in ("export", "scene", "preds"):
        assert not gcs.objects(gcs.url(name, "")), f"{gcs.url(name)} is not fresh"
    _exports(gcs, tmp_path)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    earthengine_bed.write_credentials(str(home))
    env, before = _env(home), len(gcs.earthengine())

    printed = []
    for line in lines:
        argv = shlex.split(line, comments=True)
        if argv[:2] == ["harness", "export"] and "gs://" not in line:
            with contextlib.chdir(work):
                done = cli_in_process(*argv[1:], ok=False)
        else:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=work)
        assert done.returncode == 0, f"exit {done.returncode}: {line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert not (work / "gs:").exists(), f"{line}: a gs:// path was written as a local folder named gs:"
        said = [m[1] for m in map(PRINTED.match, done.stdout.splitlines()) if m]
        if "predict" in argv:        # `harness predict`, alone or under `harness launch local` (its chief)
            assert said == uploads, f"{line} printed other upload lines than the page's:\n" + "\n".join(said)
            printed.append(line)
        else:
            assert said == [], f"{line}: {said}"
        if argv[0] == "earthengine":
            assert re.fullmatch(r"Started upload task with ID: IMPORT\d{4}\n", done.stdout), done.stdout
    assert [shlex.split(p)[1] for p in printed] == ["predict", "launch"], printed

    objects = sorted(u for u in gcs.objects(gcs.url("preds", "")) if not u.endswith("/"))
    shards = [u for u in objects if u.endswith(".tfrecord")]
    written = shards + [gcs.url("preds", "scene-mixer.json")]
    assert shards == [gcs.url("preds", f"scene-0000{i}.tfrecord") for i in (0, 1)] and written[-1] in objects, objects
    assert gcs.get(written[-1]) == (tmp_path / "scene" / "scene-mixer.json").read_bytes()
    assert [_records(gcs.get(u), tmp_path) for u in shards] == [2, 2]     # one Example per patch of its shard
    calls = gcs.earthengine()[before:]
    assert all(c["status"] == 200 for c in calls), calls
    asked = {(c["method"], c["host"], c["path"].split("?")[0]) for c in calls}
    assert asked == {("POST", "oauth2.googleapis.com", "/token"),
                     ("GET", "earthengine.googleapis.com", "/$discovery/rest"),
                     ("GET", "earthengine.googleapis.com", "/v1/projects/my-project/algorithms"),
                     ("GET", *earthengine_bed.CATALOG),
                     ("POST", "earthengine.googleapis.com", "/v1/projects/my-project/image:import")}, calls
    imports = [c for c in calls if c["method"] == "POST" and c["path"].split("?")[0].endswith("/image:import")]
    assert len(imports) == 1, calls
    (call,) = imports
    assert call["host"] == "earthengine.googleapis.com"
    assert call["path"] == "/v1/projects/my-project/image:import?alt=json"     # the CLI config's project
    manifest = call["body"]["imageManifest"]
    assert manifest["name"] == ASSET and call["body"]["overwrite"] is False
    # the TFRecord upload: one tileset, one source of every file, in shard order, the mixer last
    assert manifest["tilesets"] == [{"id": "ts", "sources": [{"uris": written}]}]
    assert shlex.split(uploads[0])[3:] == [f"--asset_id={ASSET}", *written]


def test_the_earth_engine_stand_ins_want_the_refresh_token_then_the_access_token(gcs):
    """The stand-ins' own checks, through the proxy and its TLS as the CLI reaches them (requests reads the
    proxy and the CA from the environment the `gcs` fixture set): a wrong refresh token is refused, the API
    wants the access token the refresh gave."""
    import requests

    import earthengine_bed

    def token(refresh):
        return requests.post("https://oauth2.googleapis.com/token", timeout=60,
                             data={"grant_type": "refresh_token", "refresh_token": refresh})

    discovery = "https://earthengine.googleapis.com/$discovery/rest?version=v1"
    assert token("not-the-one").status_code == 400
    assert requests.get(discovery, timeout=60).status_code == 401
    good = token(earthengine_bed.REFRESH_TOKEN)
    assert good.status_code == 200
    answer = requests.get(discovery, timeout=60, headers={"Authorization": f"Bearer {good.json()['access_token']}"})
    assert answer.status_code == 200 and answer.json()["name"] == "earthengine"
