"""Cloud Storage credentials checked before any work (harness/data/export/gcs.py), with real processes and a metadata
server stand-in on loopback: no traffic leaves this host (GCE_METADATA_HOST always names 127.0.0.1, and no test
gets past the check to a real bucket)."""
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from harness.data.export import gcs

HARNESS = [sys.executable, "-m", "harness.cli"]


def _env(home, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "CLOUDSDK_CONFIG")}
    env.update(HOME=str(home), CUDA_VISIBLE_DEVICES="", **extra)
    return env


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_server():
    """A loopback port that accepts connections and never answers (a firewall that drops, a hung server)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"127.0.0.1:{s.getsockname()[1]}"
    s.close()


@pytest.fixture
def metadata_server():
    """A stand-in Compute Engine metadata server on loopback: answers with the header Metadata-Flavor: Google."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.headers.get("Metadata-Flavor") == "Google"
            self.send_response(200 if ok else 403)
            self.send_header("Metadata-Flavor", "Google")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _fresh_probe():
    gcs.reset()
    yield
    gcs.reset()


@pytest.mark.parametrize("command", [["inspect", "gs://bucket/export/*.tfrecord.gz"],
                                     ["train", "--data", "gs://bucket/export", "--output", "/tmp/never"],
                                     ["predict", "--model", "gs://bucket/run", "--data", "gs://bucket/scene",
                                      "--output", "gs://bucket/preds"]])
def test_no_credentials_is_one_line_naming_the_path_and_every_source(tmp_path, command):
    t0 = time.monotonic()
    r = subprocess.run([*HARNESS, *command], env=_env(tmp_path, GCE_METADATA_HOST=f"127.0.0.1:{_closed_port()}"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    line = lines[0]
    assert line.startswith(f"harness {command[0]}: CredentialsError: gs://bucket/"), line
    assert "tried GOOGLE_APPLICATION_CREDENTIALS (unset); gcloud's application-default file " \
           f"{tmp_path}/.config/gcloud/application_default_credentials.json (no such file); the metadata server " \
           "127.0.0.1:" in line and "Connection refused" in line, line
    assert "Set GOOGLE_APPLICATION_CREDENTIALS" in line and "gcloud auth application-default login" in line
    assert not os.path.exists("/tmp/never")
    assert time.monotonic() - t0 < 60           # TensorFlow alone spends ~70 s on the metadata server's retries


def test_a_metadata_server_that_never_answers_costs_the_probe_s_and_no_more(tmp_path, silent_server):
    t0 = time.monotonic()
    r = subprocess.run([*HARNESS, "inspect", "gs://bucket/export"],
                       env=_env(tmp_path, GCE_METADATA_HOST=silent_server, HARNESS_GCS_PROBE_S="1"),
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 2 and f"the metadata server {silent_server} (no answer in 1 s (not on Google Cloud?))" \
        in r.stderr, r.stderr
    # Bounded by the probe: 1 s of it plus this interpreter's start (importing TensorFlow: seconds under load).
    assert took < 45, took


def test_a_named_key_file_that_is_missing_or_not_a_key_is_named(tmp_path):
    missing = tmp_path / "key.json"
    r = subprocess.run([*HARNESS, "inspect", "gs://bucket/export"],
                       env=_env(tmp_path, GOOGLE_APPLICATION_CREDENTIALS=str(missing),
                                GCE_METADATA_HOST=f"127.0.0.1:{_closed_port()}"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"tried GOOGLE_APPLICATION_CREDENTIALS={missing} (no such file)." in r.stderr, r.stderr
    missing.write_text("[1, 2]")
    source, tried = gcs.find_credentials(_env(tmp_path, GOOGLE_APPLICATION_CREDENTIALS=str(missing)))
    assert source is None and tried == [f"GOOGLE_APPLICATION_CREDENTIALS={missing} (not a JSON credential file "
                                        "(AttributeError))"]


def test_each_source_found_in_tensorflows_order(tmp_path, metadata_server):
    closed = f"127.0.0.1:{_closed_port()}"
    key = tmp_path / "key.json"
    key.write_text(json.dumps({"type": "service_account", "private_key": "not a real key"}))
    adc = tmp_path / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir()
    adc.write_text(json.dumps({"type": "authorized_user"}))
    env = _env(tmp_path, GCE_METADATA_HOST=closed)
    assert gcs.find_credentials(dict(env, GOOGLE_APPLICATION_CREDENTIALS=str(key), CLOUDSDK_CONFIG=str(adc.parent))
                                )[0] == f"GOOGLE_APPLICATION_CREDENTIALS={key}"
    assert gcs.find_credentials(dict(env, CLOUDSDK_CONFIG=str(adc.parent)))[0] == \
        f"gcloud's application-default file {adc}"
    assert gcs.find_credentials(_env(tmp_path, GCE_METADATA_HOST=metadata_server))[0] == \
        f"the metadata server {metadata_server}"
    assert gcs.find_credentials(dict(env, GOOGLE_AUTH_TOKEN_FOR_TESTING="t"))[0] == "GOOGLE_AUTH_TOKEN_FOR_TESTING"


def test_local_paths_are_not_probed_and_the_probe_runs_once(tmp_path, metadata_server):
    assert gcs.check_access(["/data/export", "runs/x", None, 3], environ={}) is None
    env = _env(tmp_path, GCE_METADATA_HOST=metadata_server)
    assert gcs.check_access(["gs://b/x"], environ=env) == f"the metadata server {metadata_server}"
    # Once per process: the outcome is kept (a second probe would find the closed port).
    assert gcs.check_access(["gs://b/y"], environ=_env(tmp_path, GCE_METADATA_HOST="127.0.0.1:1")) == \
        f"the metadata server {metadata_server}"
