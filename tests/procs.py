"""Helpers for tests that launch real processes (mpirun, horovodrun, local workers)."""
import json
import os
import re
import signal
import subprocess

import pytest


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
