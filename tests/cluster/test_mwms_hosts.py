"""`harness train` under MultiWorkerMirroredStrategy on 4 hosts of the bed: one worker per host, TF_CONFIG naming
the hosts' addresses (the same port on every host, as on a real cluster).

Every record is drawn once per epoch over all workers (counted where the training loop draws its batches), every
worker takes the same steps and ends with the same weights, worker 0 is the chief, each worker runs on its own
host, and the collectives' traffic goes over the hosts' links between their addresses."""
import json
import os
import pathlib
import signal
import sys
import time

import pytest

import procs
from cluster import bed as bedmod
from harness.data import synth

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "host_worker.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]
HOSTS = 4
PORT = 20000
EPOCHS = 2
BATCH = 8                 # per replica; one replica per worker
SHARDS, RECORDS = 4, 256  # one file of 64 records per worker: 8 steps per epoch
RUN_TIMEOUT_S = 420       # 4 TensorFlow processes on 2 shared cores


@pytest.fixture(scope="module")
def table_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("points")
    synth.write_table_export(str(folder), prefix="points", shards=SHARDS, records=RECORDS, seed=11)
    return folder


def _worker_env(tf_config: dict) -> dict:
    """This process's environment without launcher variables, the worktree first on PYTHONPATH, and TF_CONFIG."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith(("HOROVOD_", "OMPI_"))}
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), TF_CONFIG=json.dumps(tf_config))
    return env


def _connections(host) -> set[tuple[str, str]]:
    """((local address, port), (peer address, port)) of the host's established TCP connections."""
    out = host.run(["ss", "-tnH", "state", "established"], timeout=30).stdout
    return {(_address(cols[-2]), _address(cols[-1])) for cols in (line.split() for line in out.splitlines())
            if len(cols) >= 4}


def _address(text: str) -> tuple[str, int]:
    """("198.18.0.1", 20000) from ss's "198.18.0.1:20000" or "[::ffff:198.18.0.1]:20000"."""
    address, port = text.rsplit(":", 1)
    address = address.strip("[]")
    return address.removeprefix("::ffff:"), int(port)


def _bytes(host) -> dict:
    stats = f"/sys/class/net/{host.interface}/statistics"
    got = host.run(["cat", f"{stats}/tx_bytes", f"{stats}/rx_bytes"], timeout=30, check=True).stdout.split()
    return {"tx": int(got[0]), "rx": int(got[1])}


def test_mwms_on_four_hosts_every_record_once_same_steps_same_weights(make_bed, table_export, tmp_path):
    bed = make_bed(HOSTS)
    workers = [f"{h.address}:{PORT}" for h in bed.hosts]
    before = [_bytes(h) for h in bed.hosts]
    args = [sys.executable, str(SCRIPT), "--data", str(table_export), "--output", str(tmp_path / "run"),
            "--epochs", str(EPOCHS), "--per-replica-batch-size", str(BATCH), "--learning-rate", "0.01"]
    logs, running = [], []
    try:
        for i, h in enumerate(bed.hosts):
            log = open(tmp_path / f"worker{i}.log", "w")
            logs.append(log)
            config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            running.append(h.popen(args, env=_worker_env(config), stdout=log, stderr=log, cwd=str(ROOT),
                                   start_new_session=True))
        seen = set()   # host0's connections with the other hosts, sampled while the job runs
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            seen |= _connections(bed.hosts[0])
            time.sleep(1.0)
        hung = [i for i, p in enumerate(running) if p.poll() is None]
        texts = [(tmp_path / f"worker{i}.log").read_text() for i in range(HOSTS)]
        assert not hung, f"workers {hung} still running after {RUN_TIMEOUT_S} s (a hang)\n" + texts[hung[0]][-3000:]
        for i, p in enumerate(running):
            assert p.returncode == 0, f"worker {i} exit {p.returncode}\n{texts[i][-4000:]}"
    finally:
        for p in running:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        for log in logs:
            log.close()
    after = [_bytes(h) for h in bed.hosts]

    result = {i: procs.tagged(t, "RESULT")[-1] for i, t in enumerate(texts)}
    host = {i: procs.tagged(t, "HOST")[-1] for i, t in enumerate(texts)}
    # Worker i (TF_CONFIG task index i) is rank i, runs on host i, and only worker 0 is the chief.
    for i in range(HOSTS):
        assert result[i]["rank"] == host[i]["rank"] == i
        assert host[i]["hostname"] == bed.hosts[i].name
        assert host[i]["context"].startswith(f"rank {i}/{HOSTS} (worker:{i},")
        assert (", chief)" in host[i]["context"]) == (i == 0), host[i]["context"]
        assert host[i]["context"].endswith(f"{HOSTS} replicas in sync (multi_worker)"), host[i]["context"]
    # Equal steps, identical weights.
    steps = RECORDS // HOSTS // BATCH
    for r in result.values():
        assert r["steps_per_epoch"] == steps
        assert r["final_step"] == r["optimizer_iterations"] == EPOCHS * steps
        assert r["batches_drawn"] == EPOCHS * steps
        assert r["epochs_run"] == list(range(1, EPOCHS + 1))
    assert len({r["weights_sha256"] for r in result.values()}) == 1
    # Every record once per epoch over the 4 workers: RECORDS draws of RECORDS distinct records in each epoch,
    # the same records in every epoch (so no key is a record changed on its way).
    per_epoch = steps * BATCH
    epochs = []
    for e in range(EPOCHS):
        drawn = [k for h in host.values() for k in h["records"][e * per_epoch:(e + 1) * per_epoch]]
        assert len(drawn) == RECORDS and len(set(drawn)) == RECORDS, (e, len(drawn), len(set(drawn)))
        epochs.append(set(drawn))
    assert all(e == epochs[0] for e in epochs)
    assert all(len(h["records"]) == EPOCHS * per_epoch for h in host.values())
    # The traffic went between the hosts' addresses: host0 held connections on the cluster port with every other
    # host, all on the bed's subnet (none on loopback), and each host's link carried at least its share of a ring all-reduce of the
    # gradients every step: (n - 1) / n of the parameters' float32 bytes each way (half of what a ring sends).
    cluster_port = [(local, remote) for local, remote in seen if PORT in (local[1], remote[1])]
    assert {remote[0] for _, remote in cluster_port} >= {h.address for h in bed.hosts[1:]}, seen
    assert all(a.startswith(bedmod.SUBNET + ".") for pair in seen for a, _ in pair), seen
    floor = EPOCHS * steps * host[0]["params"] * 4 * (HOSTS - 1) / HOSTS
    for i in range(HOSTS):
        sent, got = after[i]["tx"] - before[i]["tx"], after[i]["rx"] - before[i]["rx"]
        assert sent >= floor and got >= floor, (i, sent, got, floor)
