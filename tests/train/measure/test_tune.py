"""`harness train --tune` (harness/train/measure/tune.py): the levers decided before the first epoch from this worker's
probes, the chief's decision applied on every worker, the decision and its numbers in summary.json. Real processes:
one worker, and two Horovod ranks under `harness launch mpi`, each `harness train` through
scripts/short_probes.py (the probes' windows shortened: every code path runs, ~4 CPU-s less a process) with the
model of scripts/one_conv.py (a 1x1 convolution: the built-in U-Net's three traces cost ~5 CPU-s more a process)."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types

import pytest

from harness.data.export import synth
from harness.data.tune import levers as tune_lib
from harness.errors import ConfigError
from harness.train.measure import tune

CLI = [sys.executable, "-m", "harness.cli"]
SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"
HARNESS = [sys.executable, str(SCRIPTS / "short_probes.py")]
MODEL = ["--model", f"{SCRIPTS / 'one_conv.py'}:build"]
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="")
APPLIES = re.compile(r"tune: worker (\d) applies (parse=[a-z]+ parallel_reads=[\da-z]+ map_parallelism=[\da-z]+ "
                     r"prefetch=[\da-z]+ cache=[a-z]+)")   # Horovod's ranks under mpirun: the next tag may follow on the line


@pytest.fixture(scope="module")
def small_images(tmp_path_factory):
    """4 GZIP shards of 16x16 patches, 4 bands, 3 classes, 64 records (as tests/bench's); returns the folder."""
    out = tmp_path_factory.mktemp("small_images")
    synth.write_image_export(str(out), prefix="img", shards=4, records=64, patch_size=16, classes=3, seed=3)
    return str(out)


def _train(*args, workers=1, timeout=500):
    train = [*HARNESS, "train", "--tune", *MODEL, *map(str, args)]
    cmd = train if workers == 1 else [*CLI, "launch", "local", "--workers", str(workers), "--timeout", "400", "--",
                                      *train]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def _levers(text: str) -> dict:
    """`parse=batches parallel_reads=1 ...` -> {"parse": "batches", "parallel_reads": 1, ...}."""
    pairs = dict(p.split("=") for p in text.split())
    return {k: (int(v) if v.isdigit() else v) for k, v in pairs.items()}


def _check_plan_line(line: str, levers: dict) -> None:
    """The training pipeline's plan (`PipelinePlan.describe`) applies the levers: a number as set, a default
    ("auto", "autotune") as `harness train` does without the flag."""
    if levers["parallel_reads"] != "auto":
        assert f"read: {levers['parallel_reads']} file(s) at once" in line, line
    assert (f"{levers['map_parallelism']} calls in flight" in line if levers["map_parallelism"] != "autotune"
            else "calls in flight" not in line), line
    assert (f"prefetch: {levers['prefetch']} batches" if levers["prefetch"] != "autotune" else "prefetch: autotune") \
        in line, line
    if levers["cache"] != "auto":
        assert f"cache: {levers['cache']} (cache='{levers['cache']}')" in line, line
    if levers["parse"] != "auto":
        assert ("read batches of" in line) == (levers["parse"] == "batches"), line


def test_one_worker_trains_with_the_tuned_levers_and_records_them(small_images, tmp_path):
    out = _train("--data", small_images, "--epochs", "1", "--per-replica-batch-size", "8", "--augment",
                 "--prefetch", "1", "--output", tmp_path / "run")   # a lever given: replaced, said so
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    record = summary["tune"]
    applied = record["applied"]
    assert set(applied) == set(tune.LEVERS)
    assert [_levers(m[2]) for m in APPLIES.finditer(out)] == [applied]
    printed = dict(re.findall(r"^tune: (parse|parallel_reads|map_parallelism|prefetch|cache): (\S+) \(", out, re.M))
    assert printed == {k: str(v) for k, v in applied.items()}, out[-3000:]
    assert re.search(r"^tune: predicted: [\d,]+ examples/s from the pipeline", out, re.M)
    # the decision with its numbers: the chief's own, which is the one applied
    mine = record["this_worker"]
    assert mine["rank"] == 0 and record["by_worker"][0]["levers"] == applied
    assert {c["name"]: c["value"] for c in mine["choices"]}["prefetch"] == applied["prefetch"]
    assert all(mine["measured"][s]["per_core"] > 0 for s in ("read", "inflate", "parse_records", "parse_batches",
                                                               "decode_records", "decode_batches", "unbatch", "augment",
                                                               "batch"))
    assert mine["compute_examples_per_s"] > 0 and mine["workload"]["records"] == 64 and mine["workload"]["files"] == 4
    # against harness train's defaults: AUTOTUNE kept for the map calls and prefetch (no term of the model beats it)
    assert applied["map_parallelism"] == applied["prefetch"] == "autotune"
    assert record["replaced"] == [{"lever": "prefetch", "given": 1, "tuned": applied["prefetch"]}]
    assert f"tune: prefetch 1 was given; --tune applies the tuned {applied['prefetch']!r}" in out
    # trained to the end with them: the training pipeline's plan (the last logged; the sample's is planned first)
    line = [s for s in out.splitlines() if "input pipeline 0/1" in s and "repeat:" in s][-1]
    _check_plan_line(line, applied)
    assert summary["final_step"] == summary["plan"]["steps_per_epoch"] == 8
    assert json.loads((tmp_path / "run" / "tune.json").read_text())["applied"] == applied

    # a resume keeps the decision (the files read at once set the records' order): not probed again
    again = _train("--data", small_images, "--epochs", "2", "--per-replica-batch-size", "8", "--augment",
                   "--output", tmp_path / "run")
    resumed = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert resumed["initial_step"] == 8 and resumed["final_step"] == 16
    assert "tune: resuming: the levers decided when this run started" in again and "tune: parse: " not in again
    assert [_levers(m[2]) for m in APPLIES.finditer(again)] == [applied]
    assert resumed["tune"]["applied"] == applied and resumed["tune"]["kept_from"].endswith("tune.json")
    _check_plan_line([s for s in again.splitlines() if "input pipeline 0/1" in s and "repeat:" in s][-1], applied)


def _check_two_workers(out: str, summary: dict) -> None:
    """Both workers applied the chief's decision, printed once; each worker's training pipeline applies it; every
    record read once per epoch."""
    record = summary["tune"]
    applied = {int(m[1]): _levers(m[2]) for m in APPLIES.finditer(out)}
    assert sorted(applied) == [0, 1], out[-3000:]
    assert applied[0] == applied[1] == record["applied"] == record["by_worker"][0]["levers"]   # the chief's
    assert len(record["by_worker"]) == 2   # each worker's own decision kept beside it
    for rank in (0, 1):   # each worker's training pipeline applies them
        lines = [s for s in out.splitlines() if f"input pipeline {rank}/2" in s and "repeat:" in s]
        assert lines, out[-3000:]
        _check_plan_line(lines[-1], applied[rank])
    assert len(re.findall(r"tune: parse: ", out)) == 1   # the decision printed once, by the chief
    # every record read once per epoch: the workers' files are disjoint and cover the export, 32 records each
    plan = summary["plan"]
    files = [f for w in plan["per_worker"] for f in w["files"]]
    assert len(files) == len(set(files)) == 4 and [w["records"] for w in plan["per_worker"]] == [32, 32]
    assert plan["records_per_epoch"] == 64 and plan["dropped"] == 0
    assert summary["final_step"] == plan["steps_per_epoch"] == 4   # one epoch: the decision is made before it
    assert len(set(summary["workers_weights_sha256"])) == 1


@pytest.mark.skipif(not shutil.which("mpirun"), reason="no mpirun (Open MPI not installed)")
def test_two_horovod_ranks_apply_the_same_decision(small_images, tmp_path):
    """Two ranks probe, the chief's decision applied on both (`tune.agree`: its rows decoded in-process by
    `test_agreement_applies_the_chiefs_decision_on_every_worker`), over Horovod's control plane
    (`HorovodBackend.allgather`). tf.distribute's all-gather (`TrainingBackend.allgather`) carries every
    multi-worker run's statistics and resume; its `launch local` tune run was dropped for the suite's time."""
    cmd = [*CLI, "launch", "mpi", "--np", "2", "--timeout", "400", "--", *HARNESS, "train", "--tune", *MODEL,
           "--backend", "horovod", "--data", small_images, "--epochs", "1", "--per-replica-batch-size", "8",
           "--output", str(tmp_path / "run")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _check_two_workers(done.stdout + done.stderr, json.loads((tmp_path / "run" / "summary.json").read_text()))


class _Gathering:
    """A backend whose all-gather returns the rows given (rank order), as `TrainingBackend.allgather` does."""

    def __init__(self, rank, rows):
        self.context = types.SimpleNamespace(num_workers=len(rows), rank=rank)
        self.rows = rows
        self.sent = None

    def allgather(self, values):
        import numpy as np
        self.sent = list(values)
        rows = [list(r) for r in self.rows]
        rows[self.context.rank] = list(values)
        return np.asarray(rows, np.float64)


def _decision(parse, reads, maps, prefetch, cache, steady=100.0):
    levers = (tune_lib.Choice("parse", parse, "r"), tune_lib.Choice("parallel_reads", reads, "r"),
              tune_lib.Choice("map_parallelism", maps, "r"), tune_lib.Choice("prefetch", prefetch, "r"),
              tune_lib.Choice("cache", cache, "r"), tune_lib.Choice("reshard", None, "r"))
    return tune_lib.Decision(levers=levers, first_epoch=50.0, steady=steady, end_to_end=40.0, compute=80.0)


def test_agreement_applies_the_chiefs_decision_on_every_worker():
    chief = _decision("batches", 2, 3, 4, "memory", steady=900.0)
    other = _decision("records", 1, 1, 2, "none", steady=300.0)
    on_worker_1, rows = tune.agree(_Gathering(1, [tune.encode(chief), [0] * 9]), other)
    on_chief, rows_chief = tune.agree(_Gathering(0, [[0] * 9, tune.encode(other)]), chief)
    want = {"parse": "batches", "parallel_reads": 2, "map_parallelism": 3, "prefetch": 4, "cache": "memory"}
    assert on_worker_1 == on_chief == want
    assert rows == rows_chief
    assert rows[1]["levers"] == {"parse": "records", "parallel_reads": 1, "map_parallelism": 1, "prefetch": 2,
                                 "cache": "none"}
    assert rows[0]["predicted"] == {"first_epoch": 50.0, "steady": 900.0, "end_to_end": 40.0, "compute": 80.0}


def test_a_decision_of_the_wrong_shape_is_refused():
    with pytest.raises(ConfigError, match="3 numbers, expected 9"):
        tune.decode([0, 1, 2])
    with pytest.raises(ConfigError, match="cache index 7"):
        tune.decode([0, 1, 1, 2, 7, 0, 0, 0, 0])


def test_only_levers_given_and_changed_are_replaced():
    from harness.train.options import TrainOptions
    options = TrainOptions(data=("x",), prefetch=4, cache="none", parallel_reads=2)
    got = tune.replaced(options, {"parse": "batches", "parallel_reads": 2, "map_parallelism": 3, "prefetch": 5,
                                  "cache": "memory"})
    assert got == [("prefetch", 4, 5), ("cache", "none", "memory")]   # parse and map_parallelism were defaults
