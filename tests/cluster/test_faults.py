"""Faults of a cluster on 2 bed hosts (issue 20.3), each bounded, named and resumable: a host lost (its processes
SIGKILLed; separately, its link down) and a worker alive but stuck, under MultiWorkerMirroredStrategy (TF_CONFIG
with the hosts' addresses) and under Horovod (horovodrun -H across the hosts, Gloo).

Every survivor ends within HARNESS_PEER_TIMEOUT_S (BOUND_S here) plus a margin with one line naming the lost or
stuck worker or rank, its host, the step, and the backup a re-run resumes from; no traceback; exit 138. Workers run
`harness train` through the CLI (tests/distribute/scripts/cli_worker.py: 0.2 s per batch; one worker's input can
be made to block), 16 steps per epoch, a backup at each epoch end, in the shared /tmp (the backup folder is the
same path on both hosts).
"""
import json
import os
import pathlib
import re
import signal
import sys
import time

import pytest
import procs
from procs import ended_within, kill_groups, one_line, wait_for_backup, wait_for_line

from harness.data.export import synth

pytestmark = pytest.mark.waits("peer timeouts of 15 s and a worker 15 s late: wall about twice its CPU")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "distribute" / "scripts" / "cli_worker.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
PORT = 20000
BOUND_S = 15      # HARNESS_PEER_TIMEOUT_S in these tests (a stuck worker lingers a quarter of it: 3.75 s)
MARGIN_S = 25     # a process's exit after its line (TensorFlow's shutdown) on 2 shared cores
START_S = 240     # importing TensorFlow, tracing and the first epoch on 2 shared cores
STEPS = 16


@pytest.fixture(scope="module")
def table_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("points")
    synth.write_table_export(str(folder), prefix="points", shards=4, records=256, seed=5)
    return folder


def _env(bed, **extra) -> dict:
    env = procs.outer_free()
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="",
               HARNESS_TEST_STEP_DELAY_S="0.2", HARNESS_PEER_TIMEOUT_S=str(BOUND_S),
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return bed.env(env)


def _args(data, output) -> list[str]:
    return [sys.executable, str(SCRIPT), "--data", str(data), "--output", str(output), "--epochs", "4",
            "--per-replica-batch-size", "8", "--learning-rate", "0.01", "--steps-per-loop", "auto"]


def _mwms(bed, data, output, tmp_path, **extra):
    workers = [f"{h.address}:{PORT}" for h in bed.hosts]
    procs = []
    for i, h in enumerate(bed.hosts):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
        log = open(tmp_path / f"w{i}.log", "w")
        procs.append(h.popen(_args(data, output), env=_env(bed, TF_CONFIG=json.dumps(config), **extra), stdout=log,
                             stderr=log, cwd=str(ROOT), start_new_session=True))
    return procs


LOST = (r"harness train: PeerLostError: worker {lost} on {lost_host} is lost \(\w+ on worker {me} on {me_host} after "
        r"step (\d+)(: .+)?\); a re-run resumes from (.+) at step (\d+)")


def _check_lost(line: str, bed, me: int, lost: int, output) -> None:
    m = re.fullmatch(LOST.format(lost=lost, lost_host=re.escape(bed.hosts[lost].address), me=me,
                                 me_host=re.escape(bed.hosts[me].address)), line)
    assert m, line
    assert STEPS < int(m[1]) < 2 * STEPS and m[3] == str(output / "backup") and int(m[4]) == STEPS, line


def test_mwms_host_killed_the_survivor_names_it(make_bed, table_export, tmp_path):
    bed = make_bed(2)
    output = tmp_path / "run"
    procs = _mwms(bed, table_export, output, tmp_path)
    try:
        wait_for_backup(output, procs, START_S)
        time.sleep(1.0)   # ~5 steps into the second epoch
        os.killpg(procs[1].pid, signal.SIGKILL)   # every process of worker 1 on host1
        took = ended_within(procs[0], time.monotonic(), BOUND_S + MARGIN_S)
    finally:
        kill_groups(*procs)
    assert procs[0].returncode == 138, (tmp_path / "w0.log").read_text()[-4000:]
    _check_lost(one_line(tmp_path / "w0.log", "PeerLostError"), bed, 0, 1, output)
    assert took < BOUND_S + MARGIN_S


def test_mwms_link_down_both_workers_end_within_the_bound_naming_the_other(make_bed, table_export, tmp_path):
    bed = make_bed(2)
    output = tmp_path / "run"
    procs = _mwms(bed, table_export, output, tmp_path)
    try:
        wait_for_backup(output, procs, START_S)
        time.sleep(1.0)
        bed.hosts[1].link_down()
        t0 = time.monotonic()
        took = [ended_within(p, t0, BOUND_S + MARGIN_S) for p in procs]
    finally:
        kill_groups(*procs)
    for me in (0, 1):
        log = tmp_path / f"w{me}.log"
        assert procs[me].returncode == 138, log.read_text()[-4000:]
        text = log.read_text()
        assert "Traceback" not in text, text[-4000:]
        line = [x for x in text.splitlines() if x.startswith("harness train: ")]
        assert len(line) == 1, text[-4000:]
        if line[0].startswith("harness train: PeerLostError"):
            _check_lost(line[0], bed, me, 1 - me, output)
        else:   # no TensorFlow error within the bound: the watchdog's line; it has its batch, names the peer
            assert re.fullmatch(
                rf"harness train: StalledWorkerError: no step progress on worker {me} on "
                rf"{re.escape(bed.hosts[me].address)} for \d+ s after step \d+: (it has its batch and waits in the "
                rf"step's all-reduce|it waits in a collective between calls) for a peer that is lost or stuck: "
                rf"worker {1 - me} on "
                rf"{re.escape(bed.hosts[1 - me].address)}; a re-run resumes from {re.escape(str(output / 'backup'))}"
                rf" at step {STEPS}; HARNESS_PEER_TIMEOUT_S={BOUND_S} sets the bound", line[0]), line[0]
    assert max(took) < BOUND_S + MARGIN_S, took


def test_mwms_stuck_worker_every_worker_ends_within_the_bound(make_bed, table_export, tmp_path):
    bed = make_bed(2)
    output = tmp_path / "run"
    procs = _mwms(bed, table_export, output, tmp_path, HARNESS_TEST_STALL_RANK="1",
                  HARNESS_TEST_STALL_AFTER=str(STEPS + 4))
    try:
        wait_for_backup(output, procs, START_S)
        t0 = time.monotonic()
        took = [ended_within(p, t0, BOUND_S + MARGIN_S + 10) for p in procs]
    finally:
        kill_groups(*procs)
    for me in (0, 1):
        log = tmp_path / f"w{me}.log"
        assert procs[me].returncode == 138, log.read_text()[-4000:]
        line = one_line(log, "StalledWorkerError")
        me_at, peer_at = re.escape(bed.hosts[me].address), re.escape(bed.hosts[1 - me].address)
        tail = (rf"; a re-run resumes from {re.escape(str(output / 'backup'))} at step {STEPS}; "
                rf"HARNESS_PEER_TIMEOUT_S={BOUND_S} sets the bound")
        if me == 1:   # the stuck worker names itself: its input has not delivered
            m = re.fullmatch(rf"harness train: StalledWorkerError: worker 1 on {me_at} has waited (\d+) s for the "
                             rf"batch after step (\d+): its own input is stuck, unless a collective before the step "
                             rf"waits for a peer \(peers: worker 0 on {peer_at}\)" + tail, line)
            seconds, step = (int(m[1]), int(m[2])) if m else (None, None)
        else:         # its peer has its batch and waits in the all-reduce, naming worker 1
            m = re.fullmatch(rf"harness train: StalledWorkerError: no step progress on worker 0 on {me_at} for (\d+) "
                             rf"s after step (\d+): it has its batch and waits in the step's all-reduce for a peer "
                             rf"that is lost or stuck: worker 1 on {peer_at}" + tail, line)
            seconds, step = (int(m[1]), int(m[2])) if m else (None, None)
        assert m and BOUND_S <= seconds < BOUND_S + 5 and STEPS <= step <= STEPS + 4, line
    assert max(took) < BOUND_S + MARGIN_S + 10, took


def test_horovod_link_down_ends_the_job_within_the_bound_naming_the_ranks_hosts(make_bed, table_export, tmp_path):
    bed = make_bed(2)
    output = tmp_path / "run"
    hosts = ",".join(f"{h.name}:1" for h in bed.hosts)
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", hosts, "--gloo", "--network-interfaces", "eth0",
           *_args(table_export, output), "--backend", "horovod"]
    log = open(tmp_path / "hvd.log", "w")
    launcher = bed.hosts[0].popen(cmd, env=_env(bed), stdout=log, stderr=log, cwd=str(ROOT), start_new_session=True)
    try:
        wait_for_backup(output, [launcher], START_S)
        time.sleep(1.0)
        bed.hosts[1].link_down()
        t0 = time.monotonic()
        took = ended_within(launcher, t0, BOUND_S + MARGIN_S)
    finally:
        kill_groups(launcher)
    text = (tmp_path / "hvd.log").read_text()
    assert launcher.returncode != 0, text[-4000:]
    m = re.search(rf"\[0\]<stderr>:harness train: (\w+): (.*)", text)
    assert m, text[-4000:]
    if m[1] == "StalledWorkerError":   # where rank 0 waits: inside its step, between calls, or before its batch
        tail = (rf"; a re-run resumes from {re.escape(str(output / 'backup'))} at step {STEPS}; "
                rf"HARNESS_PEER_TIMEOUT_S={BOUND_S} sets the bound")
        assert (re.fullmatch(rf"no step progress on rank 0 on host0 for \d+ s after step \d+: (it has its batch and "
                             rf"waits in the step's all-reduce|it waits in a collective between calls) for a peer "
                             rf"that is lost or stuck: rank 1 on host1" + tail, m[2])
                or re.fullmatch(rf"rank 0 on host0 has waited \d+ s for the batch after step \d+: its own input is "
                                rf"stuck, unless a collective before the step waits for a peer \(peers: rank 1 on "
                                rf"host1\)" + tail, m[2])), m[0]
    else:
        assert m[1] == "PeerLostError" and "rank 1 on host1" in m[2] and f"at step {STEPS}" in m[2], m[0]
    assert took < BOUND_S + MARGIN_S, took


def _rank_process(launcher, rank: int):
    """The process of `rank` (HOROVOD_RANK in its environment) among the launcher's descendants."""
    import psutil

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for p in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if str(SCRIPT) in p.cmdline() and p.environ().get("HOROVOD_RANK") == str(rank):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"rank {rank}'s process not found")


def test_horovod_host_killed_ends_the_job_within_the_bound_naming_the_rank(make_bed, table_export, tmp_path):
    bed = make_bed(2)
    output = tmp_path / "run"
    hosts = ",".join(f"{h.name}:1" for h in bed.hosts)
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", hosts, "--gloo", "--network-interfaces", "eth0",
           *_args(table_export, output), "--backend", "horovod"]
    log = open(tmp_path / "hvd.log", "w")
    launcher = bed.hosts[0].popen(cmd, env=_env(bed), stdout=log, stderr=log, cwd=str(ROOT), start_new_session=True)
    try:
        victim = _rank_process(launcher, 1)
        wait_for_backup(output, [launcher], START_S)
        time.sleep(1.0)
        victim.kill()
        t0 = time.monotonic()
        took = ended_within(launcher, t0, BOUND_S + MARGIN_S)
    finally:
        kill_groups(launcher)
    text = (tmp_path / "hvd.log").read_text()
    assert launcher.returncode != 0, text[-4000:]
    ranks_lines = "\n".join(line for line in text.splitlines() if re.match(r"\[\d+\]<std(out|err)>:", line))
    assert "Traceback" not in ranks_lines, text[-4000:]
    # horovodrun names the rank that failed first; rank 0, where it gets to say so first, names it with its host
    assert re.search(r"Process name: 1\s+Exit code: 137", text), text[-4000:]
    for m in re.finditer(r"\[0\]<stderr>:harness train: (\w+): (.*)", text):
        assert m[1] == "PeerLostError" and m[2].startswith("rank 1 on host1 is lost") and \
            m[2].endswith(f"a re-run resumes from {output / 'backup'} at step {STEPS}"), m[0]
    assert took < BOUND_S + MARGIN_S, took


# --- preemption and a late peer across hosts -------------------------------------------------------------------
GRACE_S = 30   # Kubernetes' default terminationGracePeriodSeconds: every worker must have exited within it
PREEMPTED = (r"harness train: PreemptedError: SIGTERM on worker 1 \(host {host}\) at step (\d+): backup written at "
             r"step (\d+) in {backup}; run the same command to resume")


def _latest_backup_step(output: pathlib.Path) -> int:
    state = (output / "backup" / "checkpoint").read_text().splitlines()[0]   # model_checkpoint_path: "ckpt-40"
    return int(state.rsplit("-", 1)[1].strip('"'))


def test_mwms_late_worker_is_awaited_then_sigterm_on_its_host_backs_up_every_worker_at_one_step_and_resumes(
        make_bed, table_export, tmp_path):
    """Worker 1 starts once worker 0 has waited 15 s for it (its pod scheduled late): worker 0 says whom it waits
    for, at the address of host1, while waiting (the harness's peer wait, HARNESS_WORKER_WAIT_S), and both then
    train. SIGTERM to worker 1 on host1 in the middle of epoch 2 (a preemption of that node): both workers write one
    backup at the same step inside the epoch and exit 138 within the grace period, each with the line naming worker
    1 and its host; the same command on both hosts then resumes from that step and ends at 4 epochs with identical
    weights. (One launch carries the late worker and the preemption: each alone trained a whole run.)"""
    bed = make_bed(2)
    output = tmp_path / "run"
    workers = [f"{h.address}:{PORT}" for h in bed.hosts]
    waited = f"harness: waiting for worker 1 at {bed.hosts[1].address}:{PORT}, 15 of 120 s (HARNESS_WORKER_WAIT_S)"
    procs = []
    try:
        for i, h in enumerate(bed.hosts):
            if i == 1:   # late: once worker 0 has said it waited 15 s
                wait_for_line(tmp_path / "w0.log", waited, procs[0], START_S)
            config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            log = open(tmp_path / f"w{i}.log", "w")
            procs.append(h.popen(_args(table_export, output), env=_env(bed, TF_CONFIG=json.dumps(config)), stdout=log,
                                 stderr=log, cwd=str(ROOT), start_new_session=True))
        wait_for_backup(output, procs, START_S)   # both trained epoch 1: the late worker was awaited
        time.sleep(1.0)   # ~5 steps (0.2 s each) into epoch 2
        procs[1].send_signal(signal.SIGTERM)   # the worker itself (nsenter and env exec it)
        t0 = time.monotonic()
        took = [ended_within(p, t0, GRACE_S) for p in procs]
    finally:
        kill_groups(*procs)
    steps = set()
    for me in (0, 1):
        log = tmp_path / f"w{me}.log"
        assert procs[me].returncode == 138, log.read_text()[-4000:]
        m = re.fullmatch(PREEMPTED.format(host=re.escape(bed.hosts[1].address),   # TF_CONFIG's host of worker 1
                                          backup=re.escape(str(output / "backup"))), one_line(log, "PreemptedError"))
        assert m, log.read_text()[-3000:]
        assert int(m[1]) <= int(m[2]), m[0]   # the backup at or after the step the signal arrived at
        steps.add(int(m[2]))
    assert len(steps) == 1 and STEPS < steps.pop() < 2 * STEPS   # one step for all, inside epoch 2
    assert _latest_backup_step(output) == int(re.search(r"written at step (\d+)", one_line(
        tmp_path / "w0.log", "PreemptedError"))[1])
    assert max(took) < GRACE_S, took

    # the same command again, on the same hosts (no fault to come: its steps need no delay)
    procs = _mwms(bed, table_export, output, tmp_path, HARNESS_TEST_STEP_DELAY_S="0")
    try:
        for p in procs:
            ended_within(p, time.monotonic(), START_S)
    finally:
        kill_groups(*procs)
    assert [p.returncode for p in procs] == [0, 0], (tmp_path / "w0.log").read_text()[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["final_step"] == summary["optimizer_iterations"] == 4 * STEPS
    assert len(set(summary["workers_weights_sha256"])) == 1
