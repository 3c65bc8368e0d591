"""Horovod and mpi4py as installed by tools/install_horovod.sh (via `make install`): real processes, 2 ranks.

mpirun flags needed on this machine (Debian 12 container, 2 cores, root, Debian OpenMPI 4.1.4):
  - `--allow-run-as-root` when root (or env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); without it
    mpirun refuses to start.
  - nothing else: `-np 2` fits the 2 cores without `--oversubscribe`, and the shared-memory BTL (vader) works as
    it is, so `--mca btl ^vader` / `btl_vader_single_copy_mechanism none` are not needed here.
  - `--bind-to none` is ours, not a need: mpirun otherwise pins each rank to one core, which starves TF's
    thread pools (horovodrun passes the same flag).
  - `-x TF_USE_LEGACY_KERAS=1`: Keras 2 in every rank (local ranks inherit the environment anyway; remote
    ones only get what -x exports).
Every launch runs in its own process group with a timeout that kills the group and fails the test.
"""
import os
import pathlib
import shutil
import sys

import numpy as np
import procs
import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"
BIN = pathlib.Path(sys.executable).parent
TIMEOUT_S = 240

ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
           PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
MPIRUN = ["mpirun", "-np", "2", "--bind-to", "none", "-x", "TF_USE_LEGACY_KERAS", "-x", "TF_CPP_MIN_LOG_LEVEL"]
if os.geteuid() == 0:
    MPIRUN.insert(1, "--allow-run-as-root")


def run(cmd: list, timeout: float = TIMEOUT_S) -> str:
    return procs.run(cmd, env=ENV, timeout=timeout)


def results(out: str, tag: str) -> dict:
    return procs.results(out, tag, 2)


@pytest.fixture(scope="module")
def gloo_sync() -> dict:
    """hvd_sync.py's line of each rank under `horovodrun --gloo`: read by the build check and the sync check."""
    return results(run([BIN / "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo",
                        sys.executable, SCRIPTS / "hvd_sync.py"]), "HVD_RESULT")


def test_check_build_lists_tensorflow_mpi_gloo(gloo_sync):
    """What `horovodrun --check-build` lists as built ("[X] TensorFlow"; controllers "[X] MPI" and "[X] Gloo"),
    read in the ranks of the Gloo run rather than by the command (~18 CPU-s: it imports each framework's extension in
    a process of its own): horovod.tensorflow's library loaded and ran the ranks' allreduce (TensorFlow), and says
    it has the MPI and Gloo controllers (`mpi_built()`, `gloo_built()`: what --check-build asks it;
    tools/install_horovod.sh checks the same at install). PyTorch is not asked: not built here."""
    for r in gloo_sync.values():
        assert r["built"] == {"mpi": True, "gloo": True}, r
        assert r["gloo_enabled"] and r["size"] == 2   # the TensorFlow ops ran: an allreduce over the 2 ranks


def check_sync(by_rank: dict, controller: str):
    r0, r1 = by_rank[0], by_rank[1]
    for r in (r0, r1):
        assert r["size"] == 2
        assert r["rank_sum"] == 1.0  # allreduce(Sum) of ranks 0 + 1
        assert r[f"{controller}_enabled"], r
        assert r["keras"].startswith("tf_keras"), r["keras"]  # Keras 2 reached the rank
    # rank-dependent data: the local losses differ, so equal weights mean the gradients were averaged
    assert not np.allclose(r0["local_losses"], r1["local_losses"])
    np.testing.assert_array_equal(r0["initial"], r1["initial"])  # broadcast from rank 0
    assert not np.allclose(r0["initial"], r0["weights"])  # training moved the weights
    np.testing.assert_allclose(r0["weights"], r1["weights"], rtol=0, atol=1e-6)


def test_horovodrun_gloo_two_ranks_stay_in_sync(gloo_sync):
    check_sync(gloo_sync, "gloo")


def test_mpirun_two_ranks_stay_in_sync():
    assert shutil.which("mpirun"), "mpirun not found (tools/install.sh installs openmpi-bin)"
    out = run(MPIRUN + [sys.executable, SCRIPTS / "hvd_sync.py"])
    by_rank = results(out, "HVD_RESULT")
    check_sync(by_rank, "mpi")
    assert all(r["built"] == {"mpi": True, "gloo": True} for r in by_rank.values()), by_rank


def test_mpi4py_allgather_under_mpirun():
    assert shutil.which("mpirun"), "mpirun not found (tools/install.sh installs openmpi-bin)"
    out = run(MPIRUN + [sys.executable, SCRIPTS / "mpi4py_allgather.py"], timeout=120)
    for r in results(out, "MPI4PY_RESULT").values():
        assert r["gathered"] == [0, 1], r
        assert "Open MPI" in r["library"], r  # the Debian OpenMPI that mpirun belongs to
