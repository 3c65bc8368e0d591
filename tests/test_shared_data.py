"""The real exports: used from ../shared/data, fetched with pinned SHA-256 digests when it is absent, and the tests
that need them skipped, with the reason, when neither works (tests/shared_data.py)."""
import hashlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

import shared_data as sd

ROOT = pathlib.Path(__file__).resolve().parents[1]
REAL = ["tests/data/export/test_index.py::test_real_point_counts",
        "tests/data/spec/test_spec.py::test_infer_real_image_with_renamed_mixer"]


def test_without_shared_data_and_fetch_the_real_data_tests_are_skipped_with_the_reason(tmp_path):
    empty, cache = tmp_path / "empty", tmp_path / "cache"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "all_proxy")}
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens, every fetch is refused at once
    env.update(HARNESS_SHARED_DATA=str(empty), HARNESS_SHARED_DATA_CACHE=str(cache), HTTPS_PROXY=dead,
               https_proxy=dead, HTTP_PROXY=dead, http_proxy=dead)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *REAL],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^2 skipped in ", out.strip().splitlines()[-1]), out[-4000:]  # no error, no failure
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2, out[-4000:]
    for line in skipped:
        assert f"real exports not in {empty} (HARNESS_SHARED_DATA; {len(sd.FILES)} of {len(sd.FILES)}" in line
        assert f"fetching them into {cache}" in line
        assert "https://raw.githubusercontent.com/" in line and "ProxyError" in line
    assert not [p for p in cache.rglob("*") if p.is_file()]  # nothing half-fetched left behind


def _serve(payload: bytes, calls: list):
    def downloader(url, output_file, pooch):
        calls.append(url)
        pathlib.Path(output_file).write_bytes(payload)
    return downloader


def test_fetch_refuses_a_file_with_the_wrong_digest(tmp_path):
    local = "gee-aces-image/image_2021.json"
    calls = []
    with pytest.raises(ValueError, match=f"SHA256 hash of downloaded file .* does not match.*{sd.FILES[local]}"):
        sd.fetch(local, tmp_path, downloader=_serve(b'{"not": "the mixer"}', calls))
    assert calls == ["https://raw.githubusercontent.com/SERVIR/servir-aces/96adfa50473e1e89f8107f07f8198b75944fc609"
                     "/tests/test_data/images/image_2021.json"]
    assert not (tmp_path / local).exists()


def test_fetch_keeps_a_file_with_the_pinned_digest_and_reuses_it(shared_data, tmp_path):
    local = "gee-aces-points/testing.tfrecord.gz"
    payload, calls = (shared_data / local).read_bytes(), []
    path = sd.fetch(local, tmp_path, downloader=_serve(payload, calls))
    assert path == tmp_path / local and path.read_bytes() == payload
    assert sd.fetch(local, tmp_path, downloader=_serve(b"", calls)) == path  # cached: not downloaded again
    assert calls == ["https://raw.githubusercontent.com/SERVIR/servir-aces/96adfa50473e1e89f8107f07f8198b75944fc609"
                     "/tests/test_data/testing/testing.tfrecord.gz"]


def test_pinned_digests_are_those_of_the_shared_copies(shared_data):
    assert sd.missing(shared_data) == []
    for local, digest in sd.FILES.items():
        assert hashlib.sha256((shared_data / local).read_bytes()).hexdigest() == digest, local
    assert sd.url("tfx/tfx/components/testdata/penguin/schema/schema.pbtxt") == (
        "https://raw.githubusercontent.com/tensorflow/tfx/58435d68d561e9ba6c657a0ec111adba5176ee98"
        "/tfx/components/testdata/penguin/schema/schema.pbtxt")
