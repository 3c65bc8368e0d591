"""Real processes on CPU: 2 MultiWorkerMirroredStrategy workers on localhost, the chief-only write rule, and
resume after a killed run."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from harness.data.export import synth
from harness.launch.local import run_local

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "train_worker.py"


def _results(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if "RESULT " in line:
            r = json.loads(line.split("RESULT ", 1)[1])
            out[r["rank"]] = r
    return out


@pytest.fixture(scope="module")
def table_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("table")
    return synth.write_table_export(str(folder), prefix="points", shards=4, records=1024, seed=3)


@pytest.fixture(scope="module")
def two_workers(table_export, tmp_path_factory):
    """One launch of 2 workers (train_worker.py) carrying three tests, each job in both workers' processes over
    their one strategy (a launch of its own cost 7-12 CPU-s): a job whose output folder is private to each worker
    (refused, printed), the run of the first test, then a job in which worker 1 reports other final weights (it
    ends the launch). Its output, the exception the launch ended with, and the jobs' folders."""
    import io

    from harness.errors import WorkerFailedError

    tmp = tmp_path_factory.mktemp("two_workers")
    seen, val = tmp / "seen", tmp / "val"
    seen.mkdir()
    groups = {"band_groups": {"before": ["B2", "B3"], "during": ["B4", "B8"]}, "group_delivery": "dict"}
    files = [synth.write_table_export(str(val / name), prefix=name, shards=1, records=n, seed=s)
             for name, n, s in (("a", 100, 7), ("b", 50, 8))]
    paths = [p for f in files for p in f if ".tfrecord" in p]
    out, failed = io.StringIO(), None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_TEST_INPUTS_DIR", str(seen))
        mp.setenv("HARNESS_TEST_SEED_BY_RANK", "1")  # another sample on each worker, as on a busy reader
        try:
            # 3 steps per call, which does not divide the 16 steps of an epoch: calls of 3, 3, 3, 3, 3 and 1.
            run_local([sys.executable, str(SCRIPT), str(tmp / "run"), *table_export, "--", "epochs=2",
                       "scale_lr=linear", "base_batch_size=32", "schedule=cosine", "warmup_steps=4",
                       "steps_per_loop=3", f"validation_data={','.join(paths)}",
                       f"model={SCRIPT.parent / 'recording_model.py'}:build", f"data_config={json.dumps(groups)}",
                       f"private_first={tmp / 'private'}", f"differ_after={tmp / 'differ'}"],
                      workers=2, timeout_s=300, out=out)
        except WorkerFailedError as e:
            failed = e
    return dict(out=out.getvalue(), failed=failed, run=tmp / "run", seen=seen, private=tmp / "private",
                differ=tmp / "differ")


def test_two_workers_same_loss_identical_weights_chief_only_writes_every_validation_record_once(two_workers):
    """One run of 2 workers: the same loss and identical weights, only the chief writes, the learning rate of every
    step is the schedule's closed form; with validation data and band groups delivered as a dict.

    150 validation records over 2 workers (files of 100 and 50 records), per-replica batch 32: the equal-steps
    rule of training would score one batch per worker (64 records); every record is scored once, and both workers
    report the same metrics (issue 19, item 6).

    group_delivery "dict": the band statistics are one array per group; each worker samples its own files, and
    all must build the model with the chief's (the all-gather flattens and repacks the dict); here each worker
    samples with its own seed, so that their own statistics differ. The model function
    (examples/temporal_pixel.py, one Normalization per group) writes what it was given; the Normalization
    constants are not weights, so the weights digest alone would not see a difference."""
    text, run = two_workers["out"], two_workers["run"]
    results = _results(text)
    assert sorted(results) == [0, 1], text[-3000:]
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    assert results[0]["loss"] == results[1]["loss"]
    # 4 files of 256 records, 2 workers -> 512 records each; per-replica 32 -> 16 steps per epoch.
    assert results[0]["final_step"] == results[1]["final_step"] == 32
    assert results[0]["optimizer_iterations"] == 32
    # Training and validation shards discovered, counted, checked and assigned once each per run: each plan's
    # assignment (one per worker) reaches its pipeline, which neither stats the files again nor re-splits them.
    for r in results.values():
        assert r["calls"] == {"discover_shards": 2, "find_mixer": 2, "record_stats": 2, "validate_spec": 2,
                              "assign_nonempty": 4}, r["calls"]
    # The record counts split across the workers (issue 62): on a cold record index each counted its share (shards
    # rank::2) and took the other's from the gather, and the later job of the launch read them from its index.
    import re
    index_ = r"from the record index \(\S+record_index\.json\)"
    assert re.search(rf"training data: 4 shard\(s\), 1,024 records: 2 counted here, 0 {index_}, 2 by the other "
                     r"workers; [\d.]+ s$", text, re.M), text[-3000:]
    assert re.search(rf"validation data: 2 shard\(s\), 150 records: 1 counted here, 0 {index_}, 1 by the other "
                     r"workers", text, re.M), text[-3000:]
    assert re.search(rf"training data: 4 shard\(s\), 1,024 records: 0 counted here, 2 {index_}, 2 by the other "
                     r"workers", text, re.M), text[-3000:]
    # ... and every shard's first record checked once in the job, each worker its share (the two jobs' specs
    # differ: band groups; a later run of the same spec reads none: tests/data/spec/test_heads.py)
    for what, share in (("training", 2), ("validation", 1)):
        assert re.search(rf"{what} data: first records of {share} shard\(s\) checked here, 0 passed the same checks "
                         rf"in an earlier run \(record index\), {share} by the other workers; [\d.]+ s$", text, re.M), \
            text[-3000:]
    # Chief-only writes: the shared output folder holds the chief's files and nothing else (no marker of the
    # shared-folder check, no other worker's backup or model).
    written = sorted(p.name for p in run.iterdir())
    assert written == ["backup", "logs", "model.keras", "summary.json"]
    events = list((run / "logs" / "train").glob("events.out.tfevents.*"))
    assert events
    # --scale-lr linear on 2 workers: peak = 1e-2 x global 64 / base 32; the rate of every step in TensorBoard is
    # the closed form of the schedule (a function of the global step).
    from harness.train.model.optim import ScheduleConfig
    cfg = results[0]["learning_rate"]
    assert results[1]["learning_rate"] == cfg
    assert cfg == {"peak": 0.02, "total_steps": 32, "warmup_steps": 4, "kind": "cosine", "decay_steps": 16,
                   "decay_rate": 0.1}
    logged = _scalars(events, "learning_rate")
    assert sorted(logged) == list(range(1, 33))
    import numpy as np
    for step, value in logged.items():
        assert value == np.float32(ScheduleConfig(**cfg).at(step - 1)), step
    # Validation: every record scored once per epoch over both workers.
    summary = json.loads((run / "summary.json").read_text())
    assert summary["evaluation"]["records_expected"] == 150
    assert [e["records"] for e in summary["evaluation"]["per_epoch"]] == [150, 150]
    assert [e["pixels"] for e in summary["evaluation"]["per_epoch"]] == [150, 150]
    assert "validation: 150 records, each scored once" in text
    # Band groups as a dict: both workers built the model with the chief's statistics.
    given = [json.loads(p.read_text()) for p in sorted(two_workers["seen"].glob("*.json"))]
    assert len(given) == 2 and given[0] == given[1]
    assert sorted(given[0]["mean"]) == ["before", "during"] and len(given[0]["mean"]["before"]) == 2
    assert all(v > 0 for g in given[0]["variance"].values() for v in g)


def _scalars(events, tag: str) -> dict:
    """{step: value} of one scalar tag in TensorBoard event files."""
    import tensorflow as tf
    found = {}
    for path in events:
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for v in event.summary.value:
                if v.tag == tag:
                    found[event.step] = tf.make_ndarray(v.tensor).item() if v.HasField("tensor") else v.simple_value
    return found


def test_output_folders_private_to_each_worker_are_refused_before_training(two_workers):
    """Each worker given its own output folder (as with a node's own /tmp, or an emptyDir): training would run, and
    the first resume would find the chief at step 16 and worker 1 at step 0. Refused before any data is read, on
    both workers, naming the folder and the workers that do not see the others' files (issue 20, item 2). The
    first job of `two_workers`: each worker's lines up to its refusal."""
    text, private = two_workers["out"], two_workers["private"]
    for w in (0, 1):
        lines = [line for line in text.splitlines() if line.startswith(f"[worker {w}] ")]
        refused = [i for i, line in enumerate(lines) if " REFUSED " in line]
        assert refused, text[-3000:]
        assert (f"[worker {w}] REFUSED ClusterConfigError: --output {private / f'worker{w}'} is not one folder for "
                "all workers: worker(s) 0, 1 do not see the files the other workers write there") in lines[refused[0]]
        before = "\n".join(lines[:refused[0]])
        assert "epoch 1/1" not in before and "records" not in before   # before the data was counted
    assert sorted(p.name for p in (private / "worker0").iterdir()) == []   # no marker left behind


def test_ranks_whose_final_weights_differ_fail(two_workers):
    """The weight check at the end only logged an error and ended with exit 0 (issue 11, item 12): here worker
    1 reports other weights (the last job of `two_workers`), and the run fails naming it, before the model is
    saved."""
    from harness.errors import WorkerFailedError

    text = two_workers["out"]
    assert isinstance(two_workers["failed"], WorkerFailedError), text[-3000:]
    assert "final weights differ between ranks: rank(s) [1] differ from rank 0" in text, text[-3000:]
    assert not (two_workers["differ"] / "model.keras").exists()


def _latest_step(folder: pathlib.Path):
    """Global step of the latest complete backup (the `checkpoint` state file is written last), or None."""
    state = folder / "checkpoint"
    if not state.exists():
        return None
    line = state.read_text().splitlines()[0]          # model_checkpoint_path: "ckpt-128"
    return int(line.rsplit("-", 1)[1].strip('"'))


def test_resume_after_killed_run(table_export, tmp_path):
    """Kill a run after its first epoch's backup; the restart continues at epoch 2, with no step repeated or
    lost: final global step and optimizer iterations = epochs x steps per epoch. 3 epochs: the kill lands in epoch
    2 or 3 (a whole epoch of margin for a late kill on loaded cores), and the restart has at least one to run."""
    cmd = [sys.executable, str(SCRIPT), str(tmp_path), *table_export, "--", "epochs=3", "per_replica_batch_size=8"]
    env = dict(os.environ, TF_CONFIG="")
    backup = tmp_path / "backup"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while _latest_step(backup) is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    last_backup = _latest_step(backup)
    assert last_backup is not None, proc.stdout.read()[-3000:]
    steps_per_epoch = 1024 // 8
    assert last_backup % steps_per_epoch == 0 and last_backup < 3 * steps_per_epoch

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = _results(done.stdout)[0]
    assert result["initial_step"] == last_backup and result["initial_step"] >= steps_per_epoch
    assert result["epochs_run"] == list(range(last_backup // steps_per_epoch + 1, 4))
    assert result["final_step"] == result["optimizer_iterations"] == 3 * steps_per_epoch
