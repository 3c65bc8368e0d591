"""Helpers for tests that launch real processes (mpirun, horovodrun, local workers)."""
import contextlib
import json
import os
import re
import signal
import socket
import pathlib
import subprocess
import sys

import pytest

# Set for every process the suite starts (tests/conftest.py puts them in os.environ, unless already set), and kept
# by `outer_free`. Open MPI's ranks busy-poll while they wait in a collective unless Open MPI sees more ranks than
# cores, which it does not here: the suite's ranks share the 2 cores with the other tests, and a rank that spins
# takes the core its peer needs (a 2-rank `harness launch mpi` train: 25.3 -> 16.1 CPU-s, 7.9 -> 2.2 s of it in the
# kernel). mpirun and horovodrun pass OMPI_MCA_* on to the ranks.
SUITE_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1"}

# `horovodrun` less its forked build check (tests/bin/horovodrun; ~4 CPU-s a start), for the launches the project
# does not print to its users: a printed line runs the venv's own horovodrun, word for word.
HOROVODRUN = [sys.executable, str(pathlib.Path(__file__).resolve().parent / "bin" / "horovodrun")]


@contextlib.contextmanager
def unreachable_ports(n: int):
    """`n` localhost ports that refuse every connection while the block lasts (a list of ints): each held bound and
    never listened on, so that no other process can listen there meanwhile. A port found free and released
    (`harness.launch.local.free_ports`) can be taken by another test's server before the test connects: a worker
    that "never arrives" then answered (seen once in a full run: the wait passed and the strategy failed)."""
    held = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("localhost", 0))
            held.append(s)
        yield [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def outer_free(prefixes=("HOROVOD_", "OMPI_")) -> dict:
    """This process's environment for a process a test launches: without TF_CONFIG and the variables starting with
    `prefixes` (those of a launcher the suite itself may run under, which would describe the wrong job), with the
    suite's own SUITE_ENV."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith(tuple(prefixes))}
    return {**env, **{k: os.environ[k] for k in SUITE_ENV if k in os.environ}}


def run(cmd: list, *, env: dict, timeout: float) -> str:
    """Run cmd in its own process group and return its output (stdout + stderr).

    On timeout the whole group (mpirun's ranks too) is killed and the test fails as a hang; a non-zero exit fails
    it with the output's tail."""
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout}s (a hang): {' '.join(map(str, cmd))}\n{out[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}: {' '.join(map(str, cmd))}\n{out[-6000:]}")
    return out


def tagged(out: str, tag: str) -> list[dict]:
    """Every `TAG {json}` object in out, also when mpirun forwards two ranks' lines joined in one chunk."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(out, m.end())[0] for m in re.finditer(re.escape(tag) + " (?={)", out)]


def results(out: str, tag: str, ranks: int) -> dict:
    """The `TAG {json}` objects by their "rank", asserting one from each of `ranks` ranks."""
    by_rank = {r["rank"]: r for r in tagged(out, tag)}
    assert sorted(by_rank) == list(range(ranks)), f"expected {tag} lines from {ranks} ranks:\n{out[-4000:]}"
    return by_rank


def kill_groups(*procs) -> None:
    """SIGKILL each process's group (each started with start_new_session=True) and reap it; gone ones are skipped."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(30)


def wait_for_backup(output, procs, timeout: float) -> None:
    """Wait until `output/backup` holds a complete backup (its `checkpoint` state file, written last); fail the
    test if `timeout` seconds pass or a process in `procs` ends first."""
    import pathlib
    import time
    state = pathlib.Path(output) / "backup" / "checkpoint"
    deadline = time.monotonic() + timeout
    while not state.exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no backup was written"
        time.sleep(0.1)

def wait_for_line(path, words: str, proc, timeout_s: float = 60) -> None:
    """Wait until the file `path` (a process's log) holds `words`; fail the test if `proc` ends first or
    `timeout_s` seconds pass."""
    import time
    deadline = time.monotonic() + timeout_s
    while words not in path.read_text():
        assert proc.poll() is None, path.read_text()
        assert time.monotonic() < deadline, f"no {words!r} in {path} after {timeout_s} s"
        time.sleep(0.2)


def ended_within(proc, since: float, limit: float) -> float:
    """Wait for `proc` to end at most `limit` seconds after the monotonic time `since`; returns the seconds from
    `since` to its end, fails the test as a hang past the limit."""
    import time
    try:
        proc.wait(max(limit - (time.monotonic() - since), 1))
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {limit} s after the fault (a hang)")
    return time.monotonic() - since


def one_line(log, kind: str) -> str:
    """The one `harness train: KIND: ...` line of a log file, asserting there is exactly one and no traceback."""
    import pathlib
    text = pathlib.Path(log).read_text()
    assert "Traceback" not in text, text[-4000:]
    lines = [line for line in text.splitlines() if line.startswith(f"harness train: {kind}: ")]
    assert len(lines) == 1, text[-4000:]
    return lines[0]



def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on, read in the process's own network namespace
    (`ports_observer.proc_sockets`; psutil reads the caller's, and misses a process in another namespace).
    Addresses as the kernel shows them: "0.0.0.0", "127.0.0.1", "::", "::1". Empty when the process is gone."""
    from ports_observer import proc_sockets

    try:
        return {(ip, port) for ip, port, udp in proc_sockets(pid) if not udp}
    except OSError:             # gone
        return set()
