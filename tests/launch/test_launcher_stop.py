"""The launchers' stop and exit codes with real processes: `harness launch local`, `launch mpi` and `launch
horovod` name the worker (rank) that failed first, exit with a code derived from its code by training-operator's
rule (`harness.launch.stopping`), and forward SIGTERM / SIGINT to every worker, rank and horovodrun / mpirun, all
gone within the launcher's grace (psutil checks every process the launch started). Every launch runs in its own
session, under a timeout that fails the test, and its session is killed in teardown."""
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import procs
import pytest

from harness.launch.local import GRACE_S

pytestmark = pytest.mark.waits("grace periods before SIGKILL: wall about 2.5 times its CPU")

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "launch" / "scripts" / "signal_worker.py"
HARNESS = [sys.executable, "-m", "harness.cli"]
RUN_TIMEOUT_S = 90
STOP_BOUND_S = GRACE_S + 10   # SIGKILL after the grace, plus reaping and the interpreter's exit


def _env() -> dict:
    env = procs.outer_free()
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), PYTHONUNBUFFERED="1",
               PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return env


def _launch_args(launcher: str, n: int) -> list[str]:
    if launcher == "local":
        return ["launch", "local", "--workers", str(n)]
    extra = ["--mpirun-args=--oversubscribe"] if launcher == "mpi" else []
    return ["launch", launcher, "--np", str(n), *extra]


class Launch:
    """`harness launch ... -- python signal_worker.py DIR ACTIONS` in its own session."""

    def __init__(self, launcher: str, folder: pathlib.Path, actions: list[str]):
        self.folder, self.n = folder, len(actions)
        cmd = [*HARNESS, *_launch_args(launcher, self.n), "--", sys.executable, str(WORKER), str(folder), *actions]
        self.proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.out = self.err = ""
        self.seen: list[psutil.Process] = []   # the tree once the workers run: killed in teardown

    def worker_pids(self) -> list[int]:
        """Every worker's pid once all have written theirs (fails the test after RUN_TIMEOUT_S)."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        paths = [self.folder / f"pid-{i}" for i in range(self.n)]
        while not all(p.exists() and p.read_text() for p in paths):
            assert self.proc.poll() is None, f"launcher ended early: {self.proc.communicate()}"
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.1)
        self.seen = self.tree()
        return [int(p.read_text()) for p in paths]

    def tree(self) -> list[psutil.Process]:
        """The launcher and every process under it (mpirun / horovodrun, the ranks)."""
        root = psutil.Process(self.proc.pid)
        return [root] + root.children(recursive=True)

    def wait(self, timeout=RUN_TIMEOUT_S) -> int:
        try:
            self.out, self.err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"launcher still running after {timeout} s")
        return self.proc.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for p in self.seen:   # mpirun / horovodrun and ranks in sessions of their own
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.fixture
def launch(tmp_path):
    started = []

    def start(launcher, actions):
        started.append(Launch(launcher, tmp_path, actions))
        return started[-1]

    yield start
    for la in started:
        la.kill()
        # workers live in sessions of their own: kill any the launcher left
        for i in range(la.n):
            path = tmp_path / f"pid-{i}"
            if path.exists() and path.read_text():
                try:
                    os.kill(int(path.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _gone(pids) -> list[int]:
    """The pids still alive (zombies count as gone: they have ended)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


# --- the worker that failed first, and the code passed on -------------------------------------------------------------
def test_local_names_the_worker_that_failed_first_not_the_lowest_index(launch):
    """Worker 1 exits 2; worker 0 then dies of SIGTERM (a signal death, which the old launcher named first)."""
    la = launch("local", ["after:1:exit:1", "exit:2"])
    code = la.wait()
    assert code == 2, la.err
    assert re.search(r"WorkerFailedError: worker 1 exited with code 2, permanent: the first to fail, at "
                     r"localhost:\d+; stopped the other workers", la.err), la.err


@pytest.mark.parametrize("action, expected, text", [
    ("exit:138", 138, "code 138, retryable"),
    ("exit:130", 130, "code 130, retryable"),
    ("segv", 2, "code -11 (SIGSEGV, 139 to the shell), permanent"),
    ("exit:1", 2, "code 1, permanent"),
])
def test_local_passes_the_workers_code_on_by_the_operators_rule(launch, action, expected, text):
    la = launch("local", ["sleep", action])
    assert la.wait() == expected, la.err
    assert re.search(rf"worker 1 exited with {re.escape(text)}: the first to fail, at localhost:\d+", la.err), la.err
    assert la.err.count("\n") == 1, la.err   # one line


def test_local_names_a_sigkilled_worker_and_exits_retryable(launch):
    la = launch("local", ["sleep", "sleep"])
    pids = la.worker_pids()
    os.kill(pids[1], signal.SIGKILL)
    assert la.wait() == 137, la.err
    assert re.search(r"worker 1 exited with code -9 \(SIGKILL, 137 to the shell\), retryable: the first to fail",
                     la.err), la.err
    assert not _gone(pids)


# --- the launcher stopped --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum, expected", [(signal.SIGTERM, 138), (signal.SIGINT, 130)])
def test_signal_to_launch_local_stops_every_worker(launch, signum, expected):
    la = launch("local", ["sleep", "sleep", "sleep"])
    pids = la.worker_pids()
    t0 = time.monotonic()
    la.proc.send_signal(signum)
    code = la.wait(timeout=STOP_BOUND_S)
    stop_s = time.monotonic() - t0
    assert not _gone(pids), "workers outlived the launcher"
    assert code == expected, la.err
    assert stop_s < STOP_BOUND_S
    if signum == signal.SIGTERM:
        assert "PreemptedError: the launcher got SIGTERM: forwarded it to the process groups of all 3 workers" in la.err


def test_sigterm_to_launch_local_kills_workers_that_ignore_it_after_the_grace(launch):
    la = launch("local", ["ignore-term", "sleep"])
    pids = la.worker_pids()
    time.sleep(0.5)   # worker 0 has set its handler once its pid is written and it sleeps; leave it a moment
    t0 = time.monotonic()
    la.proc.send_signal(signal.SIGTERM)
    assert la.wait(timeout=STOP_BOUND_S) == 138, la.err
    assert GRACE_S - 1 < time.monotonic() - t0 < STOP_BOUND_S   # waited the grace, then SIGKILL
    assert not _gone(pids)


@pytest.mark.parametrize("launcher", ["mpi", "horovod"])
def test_sigterm_to_launch_mpi_and_horovod_stops_the_launcher_and_every_rank(launch, launcher):
    la = launch(launcher, ["sleep", "sleep"])
    pids = la.worker_pids()
    tree = la.tree()
    names = {p.name() for p in tree}
    assert ("mpirun" if launcher == "mpi" else "horovodrun") in " ".join(
        " ".join(p.cmdline()) for p in tree), names
    t0 = time.monotonic()
    la.proc.send_signal(signal.SIGTERM)
    code = la.wait(timeout=STOP_BOUND_S)
    stop_s = time.monotonic() - t0
    left = _gone([p.pid for p in tree] + pids)
    assert not left, f"outlived the launcher: {left}"
    assert code == 138, la.err[-2000:]
    assert stop_s < STOP_BOUND_S
    assert "PreemptedError: the launcher got SIGTERM" in la.err


# --- the rank that failed first, under mpirun and horovodrun -----------------------------------------------------------
@pytest.mark.parametrize("launcher", ["mpi", "horovod"])
def test_launch_mpi_and_horovod_name_the_failed_rank_and_pass_its_code_on(launch, launcher):
    la = launch(launcher, ["sleep", "exit:2"])
    assert la.wait() == 2, la.err[-2000:]
    if launcher == "horovod":   # -H localhost:2: the host is known
        assert "the first to fail, on localhost" in la.err
    assert re.search(r"WorkerFailedError: (mpirun|horovodrun) exited with code \d+: rank 1 exited with code 2, "
                     r"permanent: the first to fail", la.err), la.err[-2000:]


@pytest.mark.parametrize("launcher", ["mpi", "horovod"])
def test_launch_mpi_and_horovod_pass_a_sigkilled_rank_on_as_retryable(launch, launcher):
    la = launch(launcher, ["sleep", "sleep"])
    pids = la.worker_pids()
    os.kill(pids[1], signal.SIGKILL)
    assert la.wait() == 137, la.err[-2000:]
    assert re.search(r"rank 1 exited with code 137 \(SIGKILL\), retryable: the first to fail", la.err), la.err[-2000:]
    assert not _gone(pids)


# --- `harness train` workers: their own codes pass through --------------------------------------------------------------
def _launch_train(driver: list[str], tmp_path, workers: int = 2) -> subprocess.CompletedProcess:
    cmd = [*HARNESS, "launch", "local", "--workers", str(workers), "--", *driver, "--data",
           str(tmp_path / "no-such-export"), "--output", str(tmp_path / "run")]
    try:
        return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S * 2,
                              start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"launch local hung: {e.stderr}")


def test_harness_train_bad_input_is_permanent_through_launch_local(tmp_path):
    # one worker: each `harness train` imports TensorFlow before it finds the data missing (3.5 CPU-s); the first
    # to fail among several workers is the tests' above
    r = _launch_train([*HARNESS, "train"], tmp_path, workers=1)
    assert r.returncode == 2, r.stderr[-2000:]
    assert re.search(r"harness launch local: WorkerFailedError: worker 0 exited with code 2, permanent: the first "
                     r"to fail, at localhost:\d+", r.stderr), r.stderr[-2000:]
    assert "no-such-export" in r.stdout   # the worker's own message, prefixed by the launcher


def test_harness_train_cluster_fault_is_retryable_through_launch_local(tmp_path):
    r = _launch_train([sys.executable, str(ROOT / "tests" / "launch" / "scripts" / "cluster_fault_train.py")],
                      tmp_path)
    assert "[worker 1] harness train: PeerLostError: worker 0 at localhost lost" in r.stdout, r.stdout[-2000:]
    assert r.returncode == 138, r.stderr[-2000:]
    assert re.search(r"worker 1 exited with code 138, retryable: the first to fail, at localhost:\d+", r.stderr)
