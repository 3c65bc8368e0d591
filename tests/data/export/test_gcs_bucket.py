"""gs:// end to end through a bucket on loopback (tests/gcs_bed.py): real `harness` processes read and write it with
TensorFlow's own GCS file system (no tensorflow-io), through a local proxy that refuses every host but Google Cloud
Storage's two, which it serves itself (the `gcs` fixture fails a test in which it refused anything). The local side
a bucket's result is compared with runs in this process (`predict_support.cli_in_process`): only what reads or
writes the bucket is a `harness` process of its own."""
import json
import os
import subprocess
import sys
import time
import urllib.parse
import uuid

import pytest
from predict_support import cli_in_process

from harness.data.export import synth

CLI = [sys.executable, "-m", "harness.cli"]


def _run(*args, cwd, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    r = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert r.returncode == 0, f"exit {r.returncode}: {' '.join(map(str, args))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert not os.path.exists(os.path.join(cwd, "gs:")), "a gs:// path was written as a local folder named gs:"
    return r


@pytest.fixture
def folder(gcs):
    """A fresh folder of the bucket for one test: gs://bucket/<random>."""
    return gcs.url(uuid.uuid4().hex[:12])


def _table(tmp_path, records=64, shards=2, seed=2):
    out = tmp_path / f"table-{records}-{seed}"
    synth.write_table_export(str(out), prefix="points", shards=shards, records=records, bands=["a", "b", "c", "d"],
                             label="class", classes=3, seed=seed)
    return out


def _reads(gcs, url) -> list[str]:
    """The proxy's media reads (GET storage.googleapis.com/BUCKET/OBJECT) of objects under `url`."""
    bucket, _, name = url[len("gs://"):].partition("/")
    path = f"/{bucket}/{urllib.parse.quote(name, safe='')}"          # TensorFlow escapes the object's name
    return [r for r in gcs.requests() if r.startswith(f"GET storage.googleapis.com {path}")]


def test_inspect_reads_a_bucket_folder_as_the_local_export(gcs, folder, tmp_path):
    """The folder reads as the local export reads (a glob of its shards: the plan's test below; a list of them: the
    reshard's, each command finding the shards as every other does, `harness.data.export.shards.discover_shards`); then
    the record index counts a shard re-uploaded under the same name again (its size in the key) and leaves the other's
    count as it was."""
    local = _table(tmp_path)                                     # 32 + 32 rows
    gcs.upload_tree(str(local), f"{folder}/export")
    want = json.loads(cli_in_process("inspect", "--json", local).stdout)
    shards = [f"{folder}/export/points-0000{i}.tfrecord.gz" for i in range(2)]
    got = json.loads(_run("inspect", "--json", f"{folder}/export", cwd=tmp_path).stdout)
    assert json.loads(json.dumps(got).replace(folder + "/export", os.path.realpath(local))) == want
    assert len(_reads(gcs, f"{folder}/export/")) >= 2          # through TensorFlow's own reads, over the proxy

    # the record index: a re-upload under the same name is counted again (was test_record_index_counts_a_reupload_
    # under_the_same_name_again, whose first inspect of the folder is the one above)
    shard, first = shards[0], got
    keys = [k for k in _index(tmp_path) if k.startswith(shard + "|")]
    replacement = _table(tmp_path, records=40, seed=5)           # 20 + 20 rows, the same names
    gcs.put(shard, (replacement / "points-00000.tfrecord.gz").read_bytes())
    second = json.loads(_run("inspect", "--json", f"{folder}/export", cwd=tmp_path).stdout)
    size = int(gcs.objects(shard)[shard]["size"])
    new = [k for k in _index(tmp_path) if k.startswith(shard + "|") and k not in keys]
    assert len(keys) == 1 and len(new) == 1 and new[0].split("|")[1] == str(size)
    assert _counts(first) == [32, 32] and _counts(second) == [20, 32]


def _files(gcs, url) -> dict:
    """{name: bytes} of the objects in the folder `url` (TensorFlow's `DIR/` folder markers left out)."""
    return {u.rsplit("/", 1)[1]: gcs.get(u) for u in gcs.objects(url) if not u.endswith("/")}


def _index(tmp_path) -> dict:
    """The record index the processes share (HARNESS_CACHE_DIR: tests/conftest.py's `_isolated_index`)."""
    with open(os.path.join(os.environ["HARNESS_CACHE_DIR"], "record_index.json")) as f:
        return json.load(f)


def _counts(report: dict) -> list[int]:
    return [s["records"] for s in report["shards"]]


def test_train_from_a_bucket_writes_the_model_and_backup_there_and_resumes_from_them(gcs, folder, tmp_path):
    """The first epoch on two local workers reading one bucket, each shard by one worker (was test_two_local_workers_
    read_one_bucket_each_shard_by_one_worker, a run of its own), the second on one worker, resumed from their backup
    at the epoch's end (where another worker count may continue it: harness/train/lifecycle/resume.py).

    Also TensorBoard on a bucket, each events file uploaded once (was test_tensorboard_on_a_bucket_uploads_each_
    events_file_once, 3 epochs of its own): the writer's context flushed at every step and each flush uploaded the
    whole events object again (198 uploads of a growing object for 3 x 64 steps, past Cloud Storage's one write
    per second per object). Now one events file per epoch (the chief's): uploaded when TensorFlow creates it (its
    header) and once whole at the epoch's end; TensorBoard reads them all: every step's rate is there, the resumed
    epoch's too (here 2 epochs of 4 steps, the second in the resumed run: a flush per step would be 4 uploads a
    file)."""
    gcs.upload_tree(str(_table(tmp_path, records=64, shards=4)), f"{folder}/export")   # 4 shards of 16 rows
    run = f"{folder}/run"
    args = ["train", "--data", f"{folder}/export", "--label", "class", "--global-batch-size", "16", "--output", run,
            "--monitor", "loss"]                                    # also keeps best/model.keras
    # --network host: a private namespace (the default) has its own loopback, where the bed is not
    _run("launch", "local", "--workers", "2", "--network", "host", "--timeout", "400", "--", *CLI, *args,
         "--epochs", "1", cwd=tmp_path, timeout=500)
    written = gcs.objects(run)
    for name in ("model.keras", "best/model.keras", "summary.json", "backup/checkpoint", "backup/run.json"):
        assert f"{run}/{name}" in written, "\n".join(sorted(written))
    first = json.loads(gcs.get(f"{run}/summary.json"))
    assert (first["initial_step"], first["final_step"]) == (0, 4)          # 64 rows, global batch 16
    workers = first["plan"]["per_worker"]
    files = [f for w in workers for f in w["files"]]
    assert sorted(files) == [f"{folder}/export/points-0000{i}.tfrecord.gz" for i in range(4)]   # disjoint, all
    assert [w["records"] for w in workers] == [32, 32]
    assert len(set(first["workers_weights_sha256"])) == 1
    for f in files:                                               # every shard read through the bucket
        assert _reads(gcs, f), f
    out = _run(*args, "--epochs", "2", cwd=tmp_path)
    second = json.loads(gcs.get(f"{run}/summary.json"))
    assert (second["initial_step"], second["final_step"], second["optimizer_iterations"]) == (4, 8, 8), out.stdout
    assert second["model"] == f"{run}/model.keras"
    for name in ("model.keras", "best/model.keras"):     # each a whole .keras archive, as tf_keras loads it
        assert gcs.get(f"{run}/{name}")[:4] == b"PK\x03\x04", name

    name = urllib.parse.quote(f"{run[len('gs://bucket/'):]}/logs/train/events.out.tfevents", safe="")
    uploads = [r for r in gcs.requests() if r.startswith("POST www.googleapis.com /upload/") and name in r]
    events = sorted(o for o in gcs.objects(run) if "/logs/train/events.out.tfevents" in o)
    assert len(events) == 2 and len(uploads) == 2 * 2, (events, uploads)
    import tensorflow as tf

    steps = []
    for url in events:
        local = tmp_path / url.rpartition("/")[2]
        local.write_bytes(gcs.get(url))
        steps += [e.step for e in tf.compat.v1.train.summary_iterator(str(local))
                  if any(v.tag == "learning_rate" for v in e.summary.value)]
    assert sorted(steps) == list(range(1, 9))


def test_predict_from_and_to_a_bucket_writes_what_a_local_run_writes_with_the_mixer_copy(gcs, folder, tmp_path):
    from predict_support import BANDS, K, P, band_picker, check_map

    local = tmp_path / "scene"
    synth.write_image_export(str(local), prefix="scene", shards=2, records=5, bands=BANDS, label=None,
                             patch_size=P, kernel_size=K, seed=3)
    model = band_picker(tmp_path / "b3.keras", [[0, 1, 0, 0]])
    gcs.upload_tree(str(local), f"{folder}/scene")
    gcs.put(f"{folder}/b3.keras", model.read_bytes())
    out = _run("predict", "--model", f"{folder}/b3.keras", "--data", f"{folder}/scene", "--output",
               f"{folder}/preds", cwd=tmp_path)
    cli_in_process("predict", "--model", model, "--data", local, "--output", tmp_path / "preds")
    mine = {p.name: p.read_bytes() for p in (tmp_path / "preds").iterdir()}
    theirs = _files(gcs, f"{folder}/preds/")
    assert sorted(theirs) == sorted(mine) and "scene-mixer.json" in theirs
    assert theirs["scene-mixer.json"] == (local / "scene-mixer.json").read_bytes()
    for name in mine:
        if name.endswith(".tfrecord"):
            assert theirs[name] == mine[name], name
    assert f"{folder}/preds/scene-mixer.json" in out.stdout      # the upload line names the objects
    # The map written to the bucket: the local run's bytes, and (downloaded) right by the mixer and the records
    assert {"scene.tif", "scene.png"} <= set(theirs) and theirs["scene.tif"] == mine["scene.tif"]
    (tmp_path / "downloaded").mkdir()
    for name, data in theirs.items():
        (tmp_path / "downloaded" / name).write_bytes(data)
    assert check_map(tmp_path / "downloaded", "scene")["profile"]["dtype"] == "uint8"


def test_reshard_from_and_to_a_bucket_writes_what_a_local_reshard_writes(gcs, folder, tmp_path):
    """The bucket's shards given as a list of files (the local export as its folder)."""
    local = _table(tmp_path)
    gcs.upload_tree(str(local), f"{folder}/export")
    shards = [f"{folder}/export/points-0000{i}.tfrecord.gz" for i in range(2)]
    _run("reshard", *shards, "--output", f"{folder}/resharded", "--workers", "3", cwd=tmp_path)
    cli_in_process("reshard", local, "--output", tmp_path / "resharded", "--workers", "3")
    theirs = _files(gcs, f"{folder}/resharded/")
    mine = {p.name: p.read_bytes() for p in (tmp_path / "resharded").iterdir()}
    assert sorted(theirs) == sorted(mine) == ["points-00000.tfrecord", "points-00001.tfrecord",
                                              "points-00002.tfrecord", "points-index.json"]
    for name in mine:
        if name.endswith(".tfrecord"):
            assert theirs[name] == mine[name], name
    index = json.loads(theirs["points-index.json"])
    assert [s["records"] for s in index["shards"]] == [22, 21, 21]
    assert [s["path"] for s in index["shards"]] == [f"{folder}/resharded/points-0000{i}.tfrecord" for i in range(3)]


def test_the_proxy_refuses_every_other_host_and_plain_http(gcs_bed):
    """The bed's proxy dials nothing: other hosts, other ports and plain-HTTP requests get 403 and are recorded."""
    import http.client

    before = len(gcs_bed.refused())
    requests = [("CONNECT", "example.com:443"), ("CONNECT", "storage.googleapis.com:80"),
                ("GET", "http://storage.googleapis.com/bucket/x")]
    for method, target in requests:
        conn = http.client.HTTPConnection("127.0.0.1", gcs_bed.info["proxy"], timeout=30)
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        conn.endheaders()
        assert conn.getresponse().status == 403, target
        conn.close()
    assert gcs_bed.refused()[before:] == [f"{m} {t} HTTP/1.1" for m, t in requests]


def test_plan_of_a_bucket_export_is_the_plan_of_the_local_export(gcs, folder, tmp_path):
    """The bucket's shards given as a glob (the local export as its folder)."""
    local = _table(tmp_path, records=70, shards=3)
    gcs.upload_tree(str(local), f"{folder}/export")
    args = ["--workers", "2", "--replicas-per-worker", "2", "--per-replica-batch-size", "4", "--json"]
    want = json.loads(cli_in_process("plan", local, *args).stdout)
    got = json.loads(_run("plan", f"{folder}/export/*.tfrecord.gz", *args, cwd=tmp_path).stdout)
    assert json.loads(json.dumps(got).replace(f"{folder}/export", os.path.realpath(local))) == want
    assert want["steps_per_epoch"] >= 1 and sum(w["records"] for w in want["per_worker"]) <= 70


def _fails(*args, env, cwd) -> tuple[subprocess.CompletedProcess, float]:
    t = time.monotonic()
    r = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd,
                       env=dict(env, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2"))
    return r, time.monotonic() - t


def test_a_bucket_that_does_not_exist_is_one_line_before_any_work(gcs, tmp_path):
    for command in (["inspect", "gs://no-such-bucket/export"],
                    ["train", "--data", "gs://no-such-bucket/export", "--output", tmp_path / "never"]):
        r, _ = _fails(*command, env=os.environ, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
        assert lines[0].startswith("harness ") and ": BucketError: gs://no-such-bucket/export: no bucket " \
            "'no-such-bucket' (HTTP 404) (credentials: the metadata server 127.0.0.1:" in lines[0], lines[0]
    assert not (tmp_path / "never").exists()


@pytest.fixture
def silent_port():
    """A loopback port that accepts connections and never answers (a proxy or firewall that drops)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


def test_an_endpoint_that_never_answers_or_refuses_costs_the_probe_s_and_no_more(gcs, folder, tmp_path,
                                                                                 silent_port):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    gcs.upload_tree(str(_table(tmp_path)), f"{folder}/export")   # the bucket exists: only the route is broken
    for port, why in ((silent_port, "gave no answer in 1 s through the proxy"),
                      (closed, "could not be reached through the proxy")):
        env = dict(os.environ, https_proxy=f"http://127.0.0.1:{port}", HARNESS_GCS_PROBE_S="1")
        r, seconds = _fails("inspect", f"{folder}/export", env=env, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
        assert f"BucketError: {folder}/export: www.googleapis.com {why} http://127.0.0.1:{port}" in lines[0], lines[0]
        assert seconds < 30, seconds    # imports and the 1 s probe; TensorFlow alone retries for minutes


def test_a_bucket_file_is_read_in_one_request_per_read_buffer_unless_the_user_set_a_block(gcs, folder, tmp_path):
    """Importing harness turns TensorFlow's per-file GCS block off (GCS_READ_CACHE_BLOCK_SIZE_MB=0,
    harness/__init__.py), so each fill of the reader's buffer (`shards.read_buffer_bytes`: 16 MiB for gs://) is one
    media request: a 40 MiB TFRecord file costs ceil(40 / 16) = 3 reads. A block the user exported wins: with 64,
    TensorFlow fetches the whole file in its first 64 MiB block, 1 read."""
    import tensorflow as tf

    from harness.data.export.shards import read_buffer_bytes

    local = str(tmp_path / "big.tfrecord")
    with tf.io.TFRecordWriter(local) as w:
        for i in range(10):
            w.write(os.urandom(4 * 2 ** 20))                 # 10 records of 4 MiB: 40 MiB and 160 bytes of framing
    url = f"{folder}/big.tfrecord"
    gcs.put(url, open(local, "rb").read())
    assert read_buffer_bytes(url) == 16 * 2 ** 20 and read_buffer_bytes(local) == 4 * 2 ** 20
    count = ("import harness, tensorflow as tf; from harness.data.export.shards import read_buffer_bytes as b; "
             f"print(sum(1 for _ in tf.data.TFRecordDataset({url!r}, buffer_size=b({url!r}))))")
    for user, want in ((None, 3), ("64", 1)):
        env = {k: v for k, v in os.environ.items() if k != "GCS_READ_CACHE_BLOCK_SIZE_MB"}
        if user:
            env["GCS_READ_CACHE_BLOCK_SIZE_MB"] = user
        before = len(_reads(gcs, url))
        r = subprocess.run([sys.executable, "-c", count], capture_output=True, text=True, timeout=120,
                           env=dict(env, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2"))
        assert r.returncode == 0 and r.stdout.split() == ["10"], r.stderr[-2000:]
        assert len(_reads(gcs, url)) - before == want, (user, _reads(gcs, url)[before:])


def test_a_bucket_that_stops_serving_mid_run_is_a_storage_fault_naming_the_object(gcs, folder, tmp_path):
    """HTTP 429 on the training data once the first epoch's backup exists (egress limits mid-run,
    tensorflow/datasets#4051): TensorFlow's retries give up ("All 2 retry attempts failed", its retry settings
    exported as GCS_*); the run ends in one StorageError line naming the object, the worker and the step, not a
    traceback or a lost peer, with the retryable exit code."""
    from harness import exit_codes

    gcs.upload_tree(str(_table(tmp_path)), f"{folder}/export")
    run = f"{folder}/run"
    gcs.fail(f"{folder}/export/points-00001", when=f"{run}/backup/run.json")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", GCS_RETRY_CONFIG_MAX_RETRIES="2",
               GCS_RETRY_CONFIG_INIT_DELAY_TIME_US="1000", GCS_RETRY_CONFIG_MAX_DELAY_TIME_US="10000")
    try:
        r = subprocess.run([*CLI, "train", "--data", f"{folder}/export", "--label", "class", "--global-batch-size",
                            "16", "--epochs", "3", "--cache", "none", "--output", run], capture_output=True, text=True,
                           timeout=300, env=env, cwd=tmp_path)
    finally:
        gcs.clear_faults()
    assert r.returncode == exit_codes.RETRYABLE and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = [x for x in r.stderr.splitlines() if "StorageError" in x]
    assert len(line) == 1 and f"Cloud Storage failed on {folder}/export/points-00001.tfrecord.gz (" in line[0], \
        r.stderr[-2000:]
    import re

    m = re.search(r" on worker 0 on \S+ after step (\d+): All 2 retry attempts failed", line[0])
    assert m and int(m.group(1)) >= 4, line      # after the first epoch (4 steps), whose backup set the fault off
    assert f"not a peer: a re-run resumes from {run}/backup at step " in line[0] and "lost" not in line[0], line
