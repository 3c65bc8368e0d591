"""A lost peer and a stuck worker with real worker processes on localhost (issue 20.3): every survivor ends within
HARNESS_PEER_TIMEOUT_S (plus a margin) with one line naming the lost or stuck worker, its host, the step and the
backup a re-run resumes from, no traceback, exit 138 (retryable); and the late peer's wait: printed while waiting,
carried into Gloo's timeout and the printed horovodrun line.

Each run trains `harness train` through the CLI (tests/distribute/scripts/cli_worker.py: every batch waits 0.2 s;
one worker's input can be made to block) on 2 x 128 records, 16 steps per epoch, a backup at each epoch end.
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
import procs
from procs import ended_within, kill_groups, one_line, wait_for_backup

from harness.data.export import synth
from harness.launch.local import free_ports

pytestmark = pytest.mark.waits("peer timeouts of 15 s and a rank 38 s late: wall about twice its CPU")

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "cli_worker.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
BOUND_S = 15      # HARNESS_PEER_TIMEOUT_S in these tests (a stuck worker lingers a quarter of it: 3.75 s)
MARGIN_S = 25     # a process's exit after its line (TensorFlow's shutdown) on 2 shared cores
START_S = 240     # importing TensorFlow, tracing, the first epoch on 2 shared cores
STEPS = 16


def _env(**extra) -> dict:
    env = procs.outer_free()
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HARNESS_TEST_STEP_DELAY_S="0.2",
               HARNESS_PEER_TIMEOUT_S=str(BOUND_S), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
               **extra)
    return env


@pytest.fixture(scope="module")
def table_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("points")
    synth.write_table_export(str(folder), prefix="points", shards=4, records=256, seed=5)
    return folder


def _args(data, output) -> list[str]:
    return [sys.executable, str(SCRIPT), "--data", str(data), "--output", str(output), "--epochs", "4",
            "--per-replica-batch-size", "8", "--learning-rate", "0.01", "--steps-per-loop", "auto"]


def _start(cmd, env, log: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=ROOT)


def _workers(data, output, tmp_path, **extra) -> list[subprocess.Popen]:
    ports = free_ports(2)
    procs = []
    for i in range(2):
        config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]}, "task": {"type": "worker", "index": i}}
        procs.append(_start(_args(data, output), _env(TF_CONFIG=json.dumps(config), **extra), tmp_path / f"w{i}.log"))
    return procs


def test_a_lost_peer_is_named_and_the_same_loss_on_the_retry_is_permanent(table_export, tmp_path):
    """Worker 1 ends at the batch of step 20 on every attempt (tests/distribute/scripts/cli_worker.py: `os._exit`
    in the middle of the step, as a killed process), as a message over protobuf's 2 GB limit fails at the same
    step on every retry. The first attempt is a lost peer: worker 0 ends within the bound of worker 1's end, exit
    138 (retried), with one line naming worker 1 with its host, the step and the backup; the retry, resumed at step
    16, meets it after the same step and exits permanent (2), naming both. (One launch carries the lost peer's
    assertions and the retry's first attempt: a peer lost at a step of its own choosing ends the same as one
    SIGKILLed there; a SIGKILLed worker and host: tests/launch/test_fault_tolerance.py, tests/cluster/test_faults.py.)
    """
    output = tmp_path / "run"
    lines = []
    for attempt in (1, 2):
        procs = _workers(table_export, output, tmp_path, HARNESS_TEST_CRASH_RANK="1",
                         HARNESS_TEST_CRASH_AT_STEP=str(STEPS + 4))
        try:
            ended_within(procs[1], time.monotonic(), START_S)   # worker 1 ends itself at step 20
            took = ended_within(procs[0], time.monotonic(), BOUND_S + MARGIN_S)
        finally:
            kill_groups(*procs)
        log = tmp_path / "w0.log"
        kind = "PeerLostError" if attempt == 1 else "RepeatedFaultError"
        assert procs[0].returncode == (138 if attempt == 1 else 2), log.read_text()[-4000:]
        lines.append(one_line(log, kind))
        if attempt == 1:
            assert took < BOUND_S + MARGIN_S, took
    m = re.fullmatch(r"harness train: PeerLostError: worker 1 on localhost is lost \(UnavailableError on worker 0 on "
                     rf"localhost after step (\d+): .+\); a re-run resumes from (.+) at step (\d+)", lines[0])
    assert m, lines[0]
    # the last step a K-step call completed, the backup of epoch 1's end
    assert STEPS <= int(m[1]) <= STEPS + 4 and m[2] == str(output / "backup") and int(m[3]) == STEPS, lines[0]
    again = re.match(r"harness train: RepeatedFaultError: the same fault after step (\d+) as in the last attempt "
                     r"\(after step (\d+)\), which resumed from the backup before it: not a lost peer", lines[1])
    assert again and all(STEPS + 3 <= int(s) <= STEPS + 5 for s in again.groups()), lines[1]   # the updates made
    assert lines[0][len("harness train: PeerLostError: "):] in lines[1], lines   # the first cause, named


def test_stuck_worker_ends_every_worker_within_the_bound(table_export, tmp_path):
    """Worker 1's input blocks in the second epoch: both workers stop at the bound, naming the step and backup."""
    output = tmp_path / "run"
    procs = _workers(table_export, output, tmp_path, HARNESS_TEST_STALL_RANK="1",
                     HARNESS_TEST_STALL_AFTER=str(STEPS + 4))
    try:
        wait_for_backup(output, procs, START_S)
        t0 = time.monotonic()
        took = [ended_within(p, t0, BOUND_S + MARGIN_S + 10) for p in procs]
    finally:
        kill_groups(*procs)
    for i, p in enumerate(procs):
        log = tmp_path / f"w{i}.log"
        assert p.returncode == 138, log.read_text()[-4000:]
        line = one_line(log, "StalledWorkerError")
        tail = rf"; a re-run resumes from (.+) at step (\d+); HARNESS_PEER_TIMEOUT_S={BOUND_S} sets the bound"
        if i == 1:   # the stuck worker names itself
            m = re.fullmatch(rf"harness train: StalledWorkerError: worker 1 on localhost has waited (\d+) s for the "
                             rf"batch after step (\d+): its own input is stuck, unless a collective before the step "
                             rf"waits for a peer \(peers: worker 0 on localhost\)" + tail, line)
            seconds, step = (int(m[1]), int(m[2])) if m else (None, None)
        else:        # worker 0 has its batch and waits for worker 1 in the all-reduce
            m = re.fullmatch(rf"harness train: StalledWorkerError: no step progress on worker 0 on localhost for "
                             rf"(\d+) s after step (\d+): it has its batch and waits in the step's all-reduce for a "
                             rf"peer that is lost or stuck: worker 1 on localhost" + tail, line)
            seconds, step = (int(m[1]), int(m[2])) if m else (None, None)
        assert m, line
        assert BOUND_S <= seconds < BOUND_S + 5 and STEPS <= step <= STEPS + 4, line
        assert m[3] == str(output / "backup") and int(m[4]) == STEPS, line
        assert BOUND_S <= took[i] < BOUND_S + MARGIN_S + 10, took


LATE_S = 38   # later than Gloo's own 30 s default (with a margin for the ranks' imports), within the harness's 120 s


def test_late_rank_joins_under_launch_horovod_and_a_stuck_rank_ends_every_rank_within_the_bound(table_export,
                                                                                                  tmp_path):
    """Rank 1 starts Horovod LATE_S after rank 0 (a pod scheduled late: cli_worker.py sleeps before `harness
    train`), later than Gloo's 30 s default: under `harness launch horovod` (whose printed horovodrun line carries
    the harness's 120 s wait into `--gloo-timeout-seconds`) rank 0 says why it waits, and both train epoch 1. Then
    rank 1's input blocks in epoch 2: the job ends within the bound, the ranks naming the step and the backup."""
    output = tmp_path / "run"
    cmd = [sys.executable, "-m", "harness.cli", "launch", "horovod", "--np", "2", "--timeout", "400", "--",
           *_args(table_export, output), "--backend", "horovod"]
    log = tmp_path / "hvd.log"
    env = {k: v for k, v in _env(HARNESS_TEST_LATE_S=str(LATE_S), HARNESS_TEST_STALL_RANK="1",
                                 HARNESS_TEST_STALL_AFTER=str(STEPS + 4)).items()
           if k not in ("HARNESS_WORKER_WAIT_S", "HOROVOD_GLOO_TIMEOUT_SECONDS")}
    launcher = _start(cmd, env, log)
    try:
        wait_for_backup(output, [launcher], LATE_S + START_S)   # the late rank joined: epoch 1 trained on both
        t0 = time.monotonic()
        took = ended_within(launcher, t0, BOUND_S + MARGIN_S + 10)
    finally:
        kill_groups(launcher)
    text = log.read_text()
    # rank 0 says why nothing happens while it waits for rank 1 in Horovod's rendezvous (every 15 s)
    assert re.search(r"harness: rank 0 waits in hvd.init\(\) for the other ranks \(Horovod's rendezvous\), 15 of "
                     r"120 s \(HOROVOD_GLOO_TIMEOUT_SECONDS\)", text), text[-3000:]
    ranks_lines = "\n".join(line for line in text.splitlines() if re.match(r"\[\d+\]<std(out|err)>:", line))
    # the ranks print no traceback (horovodrun's own RuntimeError follows theirs) and end with the retryable code
    assert launcher.returncode != 0 and "Traceback" not in ranks_lines, text[-4000:]
    assert re.search(r"Process name: [01]\s+Exit code: 138", text), text[-4000:]
    # the first rank whose watchdog fires ends; horovodrun then stops the other, which may not get to print
    tail = rf"; a re-run resumes from (.+) at step (\d+); HARNESS_PEER_TIMEOUT_S={BOUND_S} sets the bound"
    stuck = list(re.finditer(rf"\[(1)\]<stderr>:harness train: StalledWorkerError: rank 1 on \S+ has waited (\d+) s "
                             rf"for the batch after step (\d+): its own input is stuck, unless a collective before the "
                             rf"step waits for a peer \(peers: rank 0 on \S+\)" + tail, text))
    waiting = list(re.finditer(rf"\[(0)\]<stderr>:harness train: StalledWorkerError: no step progress on rank 0 on "
                               rf"\S+ for (\d+) s after step (\d+): (?:it has its batch and waits in the step's "
                               rf"all-reduce|it waits in a collective between calls) for a peer that is lost or "
                               rf"stuck: rank 1 on \S+" + tail, text))
    assert stuck or waiting, text[-4000:]
    # rank 1 got the backup's step by broadcast from rank 0, which wrote it
    for m, (seconds, step) in [(m, (m[2], m[3])) for m in stuck] + [(m, (m[2], m[3])) for m in waiting]:
        assert BOUND_S <= int(seconds) < BOUND_S + 5 and STEPS <= int(step) <= STEPS + 4, m[0]
        assert m[4] == str(output / "backup") and int(m[5]) == STEPS, m[0]
    assert BOUND_S <= took < BOUND_S + MARGIN_S + 10, took
