"""The mpi4py control plane under mpirun, without Horovod or TensorFlow: rank discovery, gather to rank 0 and the
sharding self-check (tests/distribute/scripts/mpi_control.py), 2 and 3 ranks, each under a timeout."""
import json
import os
import re
import signal
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "mpi_control.py"
MPIRUN = ["mpirun"] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["-bind-to", "none"]


def run_ranks(np_: int, *args, timeout: float = 60) -> dict:
    cmd = MPIRUN + ["-np", str(np_), "-H", f"localhost:{np_}", sys.executable, str(SCRIPT), *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{proc.communicate()[0][-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    decoder = json.JSONDecoder()  # raw_decode: mpirun may forward two ranks' lines joined in one chunk
    by_rank = {r["rank"]: r for r in (decoder.raw_decode(out, m.end())[0]
                                      for m in re.finditer("MPI_CONTROL (?={)", out))}
    assert sorted(by_rank) == list(range(np_)), out[-3000:]
    return by_rank


def test_discovery_gather_and_sharding_check_two_ranks():
    by_rank = run_ranks(2, 4)
    for rank, r in by_rank.items():
        assert (r["rank"], r["size"], r["local_rank"], r["local_size"]) == (rank, 2, rank, 2)  # one host
        assert r["env"] == ["openmpi", rank, 2, rank]  # MPI agrees with the launcher's variables
        assert r["launched_by_mpi"]
        files = r["files"]
        assert sorted(f for fs in files for f in fs) == [f"gs://bucket/export-{i:05d}.tfrecord.gz" for i in range(4)]
        assert "rank 1 reads as input pipeline 0 of 2" in r["broken"]  # every rank raised
    assert by_rank[0]["gathered"] == [{"rank": 0, "local_rank": 0}, {"rank": 1, "local_rank": 1}]
    assert by_rank[1]["gathered"] is None


def test_sharding_check_by_record_with_fewer_files_than_ranks():
    by_rank = run_ranks(3, 2)
    for r in by_rank.values():
        assert "keep disjoint records (one in 3)" in r["description"]
        assert "rank 2 reads as input pipeline 0 of 3" in r["broken"]
