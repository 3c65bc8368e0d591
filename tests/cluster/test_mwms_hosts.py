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

import procs
from cluster import bed as bedmod
from harness.data.export import synth

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "host_worker.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]
HOSTS = 4
PORT = 20000
EPOCHS = 2
BATCH = 8                 # per replica; one replica per worker
SHARDS, RECORDS = 4, 256  # one file of 64 records per worker: 8 steps per epoch
RUN_TIMEOUT_S = 420       # 4 TensorFlow processes on 2 shared cores


def _worker_env(tf_config: dict) -> dict:
    """This process's environment without launcher variables, the worktree first on PYTHONPATH, and TF_CONFIG."""
    env = procs.outer_free()
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


def _run_workers(bed, args: list, logs: pathlib.Path, *, watch=None) -> tuple[list[int], list[str]]:
    """Run args as one worker per bed host (TF_CONFIG task index = host index, PORT on every host), each in its own
    session, to their end within RUN_TIMEOUT_S; watch() is called about every second meanwhile.

    Returns every worker's exit code and output. Fails the test on a hang; kills every worker's group at the end."""
    workers = [f"{h.address}:{PORT}" for h in bed.hosts]
    files, running = [], []
    try:
        for i, h in enumerate(bed.hosts):
            files.append(open(logs / f"worker{i}.log", "w"))
            config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            running.append(h.popen(args, env=_worker_env(config), stdout=files[-1], stderr=files[-1], cwd=str(ROOT),
                                   start_new_session=True))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            if watch:
                watch()
            time.sleep(1.0)
        hung = [i for i, p in enumerate(running) if p.poll() is None]
        texts = [(logs / f"worker{i}.log").read_text() for i in range(len(bed.hosts))]
        assert not hung, f"workers {hung} still running after {RUN_TIMEOUT_S} s (a hang)\n" + texts[hung[0]][-3000:]
        return [p.returncode for p in running], texts
    finally:
        for p in running:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        for f in files:
            f.close()


def _train_args(data, output, epochs: int, *, cli: bool = False) -> list:
    """`host_worker.py ARGS` (the job and its reports), or with cli `harness train ARGS` as users run it."""
    run = [sys.executable, "-m", "harness.cli", "train"] if cli else [sys.executable, str(SCRIPT)]
    return [*run, "--data", str(data), "--output", str(output), "--epochs", str(epochs),
            "--per-replica-batch-size", str(BATCH), "--learning-rate", "0.01"]


def test_mwms_on_four_hosts_every_record_once_same_steps_same_weights(make_bed, tmp_path):
    """Each host has its own /tmp (private_tmp), the data and the output are on storage they share: the output
    folder check lets the run through (the refusal where it is not shared: the next test) and the chief writes
    there."""
    bed = make_bed(HOSTS, private_tmp=True)
    data, output = pathlib.Path(bed.shared_dir) / "points", pathlib.Path(bed.shared_dir) / "run"
    synth.write_table_export(str(data), prefix="points", shards=SHARDS, records=RECORDS, seed=11)
    before = [_bytes(h) for h in bed.hosts]
    seen = set()   # host0's connections, sampled while the job runs
    codes, texts = _run_workers(bed, _train_args(data, output, EPOCHS), tmp_path,
                                watch=lambda: seen.update(_connections(bed.hosts[0])))
    for i, code in enumerate(codes):
        assert code == 0, f"worker {i} exit {code}\n{texts[i][-4000:]}"
    assert {"backup", "model.keras", "summary.json"} <= {p.name for p in output.iterdir()}
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
    # host, all on the bed's subnet (none on loopback), and each host's link carried at least its share of a ring
    # all-reduce of the gradients every step: (n - 1) / n of the parameters' float32 bytes each way (half of what
    # a ring sends: 2 (n - 1) / n of them, Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms").
    cluster_port = [(local, remote) for local, remote in seen if PORT in (local[1], remote[1])]
    assert {remote[0] for _, remote in cluster_port} >= {h.address for h in bed.hosts[1:]}, seen
    assert all(a.startswith(bedmod.SUBNET + ".") for pair in seen for a, _ in pair), seen
    floor = EPOCHS * steps * host[0]["params"] * 4 * (HOSTS - 1) / HOSTS
    for i in range(HOSTS):
        sent, got = after[i]["tx"] - before[i]["tx"], after[i]["rx"] - before[i]["rx"]
        assert sent >= floor and got >= floor, (i, sent, got, floor)


def test_an_output_folder_private_to_each_host_is_refused_before_training(make_bed, tmp_path):
    """--output on each host's own disk (/tmp private per host), the data on storage they share. Trained, such a
    run would end well and its first resume would find the chief's backup on host0 and none on host1: refused on
    both workers before any data is read (exit 2, one named error, no traceback), nothing left on either host.
    A run on storage the hosts share trains: the previous test (hosts with a private /tmp, the output shared)."""
    bed = make_bed(2, private_tmp=True)
    data = pathlib.Path(bed.shared_dir) / "points"
    synth.write_table_export(str(data), prefix="points", shards=2, records=2 * 64, seed=12)
    codes, texts = _run_workers(bed, _train_args(data, "/tmp/run", 1, cli=True), tmp_path)
    assert codes == [2, 2], texts[0][-3000:] + texts[1][-3000:]
    for i, text in enumerate(texts):
        assert ("ClusterConfigError: --output /tmp/run is not one folder for all workers: worker(s) 0, 1 do not see "
                "the files the other workers write there; this worker (host%d) sees only its own" % i) in text, \
            text[-3000:]
        assert "epoch 1/1" not in text and "counting records" not in text and "Traceback" not in text
    for host in bed.hosts:   # no marker left behind
        assert host.run(["ls", "-A", "/tmp/run"], check=True).stdout.split() == []

