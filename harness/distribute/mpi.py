"""The harness's own control plane: small Python objects exchanged between ranks, and the sharding self-check.

Training tensors travel through Horovod (or tf.distribute); this module carries the job's bookkeeping: each rank's
statistics gathered to rank 0 and the opt-in check that the ranks' input files are disjoint and cover the data.
Under `mpirun` (Open MPI, MVAPICH2, MPICH / Intel MPI) it is mpi4py on `COMM_WORLD`, which also finds a process's
rank, size and local rank without Horovod (`discover`). Under `horovodrun --gloo` there is no MPI: Horovod's object
collectives serve (`harness.distribute.horovod.HorovodControlPlane`). No TensorFlow here.

mpi4py and Horovod share one MPI in a process and call it from two threads: Horovod's background thread (on its own
duplicate of COMM_WORLD, every cycle) and ours. That is only defined under MPI_THREAD_MULTIPLE (MPI 4.1 standard,
section 11.6), so `init_thread_multiple` initializes MPI through mpi4py before Horovod, checks the level the library
granted (`MPI.Query_thread`) and refuses a lower one by name: Horovod itself only logs "This will likely cause a
segmentation fault" and carries on (horovod/common/mpi/mpi_context.cc). The control plane talks on its own duplicate
of COMM_WORLD (`MPIControlPlane`), one collective at a time, so no other user of COMM_WORLD in the process (a
user's mpi4py code, another library) can interleave with it. And `init_thread_multiple` finalizes MPI itself at
interpreter exit, after Horovod's thread has been joined and while Python is still whole, instead of mpi4py's
default hook, which runs after the interpreter has been torn down.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any, Mapping, Optional, Protocol, Sequence

from harness.distribute import environment
from harness.distribute.context import Backend, WorkerContext
from harness.distribute.sharding import FILE, RECORD, ShardAssignment
from harness.errors import ClusterConfigError

# Rows of `environment.LAUNCHERS` whose processes an MPI runtime started (mpi4py then sees the whole job).
MPI_LAUNCHERS = ("openmpi", "mvapich2", "pmi")


class ControlPlane(Protocol):
    """Python-object collectives among the job's processes (every rank must call each one, in the same order)."""

    rank: int
    size: int

    def allgather(self, obj: Any) -> list: ...

    def gather(self, obj: Any, root: int = 0) -> Optional[list]: ...

    def bcast(self, obj: Any, root: int = 0) -> Any: ...


@dataclasses.dataclass
class LocalControlPlane:
    """One process: every collective is the identity."""

    rank: int = 0
    size: int = 1

    def allgather(self, obj):
        return [obj]

    def gather(self, obj, root=0):
        return [obj]

    def bcast(self, obj, root=0):
        return obj


class MPIControlPlane:
    """mpi4py on a communicator: by default its own duplicate of `MPI.COMM_WORLD`, made here (a collective: every
    rank builds its plane at the same point). Calls are serialized by a lock, so two threads of one rank never run
    collectives on it at once (MPI requires every rank to issue a communicator's collectives in one order, which
    concurrent threads cannot promise)."""

    def __init__(self, comm=None):
        from mpi4py import MPI  # initializes MPI unless Horovod (or someone) already did

        self.comm = comm if comm is not None else MPI.COMM_WORLD.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._lock = threading.Lock()

    def allgather(self, obj):
        with self._lock:
            return self.comm.allgather(obj)

    def gather(self, obj, root=0):
        with self._lock:
            return self.comm.gather(obj, root=root)

    def bcast(self, obj, root=0):
        with self._lock:
            return self.comm.bcast(obj, root=root)

    def local_rank(self) -> int:
        """This process's index among the ranks on its host (shared-memory split of the communicator)."""
        return self._on_host(lambda node: node.Get_rank())

    def local_size(self) -> int:
        """Ranks on this process's host (the same shared-memory split): they share its CPUs and memory."""
        return self._on_host(lambda node: node.Get_size())

    def _on_host(self, read):
        """`read(node)` of the communicator of the ranks on this host (MPI_Comm_split_type, COMM_TYPE_SHARED: a
        collective, so every rank calls it in the same order), freed after."""
        from mpi4py import MPI

        with self._lock:
            node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            try:
                return read(node)
            finally:
                node.Free()


def thread_level_name(level: int) -> str:
    """'single', 'funneled', 'serialized' or 'multiple' for one of mpi4py's `MPI.THREAD_*` constants."""
    from mpi4py import MPI

    return {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled", MPI.THREAD_SERIALIZED: "serialized",
            MPI.THREAD_MULTIPLE: "multiple"}.get(level, str(level))


def init_thread_multiple(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Initialize MPI through mpi4py with MPI_THREAD_MULTIPLE (Horovod's thread and ours both call MPI), before
    Horovod, so that Horovod does not own MPI: Horovod finalizes an MPI it initialized as soon as any rank shuts
    Horovod down, which would pull MPI away from under a rank still gathering its statistics. MPI is finalized by
    a Python exit hook registered here, before Horovod's own (exit hooks run last-in first-out): after Horovod's
    background thread has been joined, on the main thread, while the interpreter is still intact.

    Returns:
      "multiple", the level granted; None when mpi4py is not installed (Horovod then initializes MPI itself).
    Raises:
      ClusterConfigError: if MPI grants less than MPI_THREAD_MULTIPLE, under which two threads calling MPI at once
        is undefined behaviour (a crash at random). It names the causes found: MPI4PY_RC_THREAD_LEVEL or
        MPI4PY_RC_THREADS in the environment (mpi4py reads them over `mpi4py.rc`), mpi4py.MPI imported (and MPI
        initialized) earlier by other code, or an MPI library built without thread support.
    """
    import os
    env = os.environ if environ is None else environ
    try:
        import mpi4py
    except ImportError:
        return None
    imported_before = "mpi4py.MPI" in sys.modules
    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI
    granted = MPI.Query_thread()
    if granted < MPI.THREAD_MULTIPLE:
        causes = [f"{k}={env[k]} is set (unset it)" for k in ("MPI4PY_RC_THREAD_LEVEL", "MPI4PY_RC_THREADS")
                  if k in env]
        if imported_before:
            causes.append("mpi4py.MPI was imported before harness.distribute.horovod.init (set "
                          "mpi4py.rc.thread_level = 'multiple' before that import)")
        causes.append(f"or the MPI library ({MPI.Get_library_version().splitlines()[0].strip()}) lacks "
                      "MPI_THREAD_MULTIPLE")
        raise ClusterConfigError(
            f"MPI granted thread level {thread_level_name(granted)!r}; Horovod's background thread and the "
            "harness's control plane call MPI from two threads at once, which needs 'multiple': "
            + "; ".join(causes))
    _finalize_at_exit()
    return thread_level_name(granted)


_finalizer: list = []  # the exit hook, once registered


def _finalize_at_exit() -> None:
    """Register, once, a Python exit hook that shuts Horovod down (if imported) and then finalizes MPI."""
    if _finalizer:
        return
    import atexit

    def finalize():
        from mpi4py import MPI
        hvd = sys.modules.get("horovod.tensorflow")
        if hvd is not None:
            hvd.shutdown()  # joins the background thread; a no-op once Horovod's own hook ran
        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()

    atexit.register(finalize)
    _finalizer.append(finalize)


def launched_by_mpi(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process was started by an MPI launcher (its variables are the first `environment` finds)."""
    launcher = environment.read_launcher(environ)
    return launcher is not None and launcher.launcher in MPI_LAUNCHERS


def discover(*, backend: Backend = Backend.HOROVOD) -> WorkerContext:
    """This process's `WorkerContext` from MPI itself (mpi4py), without Horovod: rank and size of COMM_WORLD and
    the local rank and size from a shared-memory split, so any MPI works, whatever variables its launcher sets."""
    plane = MPIControlPlane()
    return WorkerContext(plane.rank, plane.size, plane.local_rank(), 1, environment.WORKER, plane.rank, backend,
                         local_size=plane.local_size())


# --- the sharding self-check ---------------------------------------------------------------------------------------
def sharding_errors(assignments: Sequence[ShardAssignment], files: Sequence[str]) -> list[str]:
    """What is wrong with the ranks' assignments (indexed by rank) of the non-empty `files`; empty when none.

    File policy: the ranks' file sets are disjoint and their union is `files`. Record policy: every rank opens
    all `files` and keeps a different residue `input_pipeline_id` of the `n` records, covering all residues.
    """
    n, problems = len(assignments), []
    for rank, a in enumerate(assignments):
        if (a.input_pipeline_id, a.num_input_pipelines) != (rank, n):
            problems.append(f"rank {rank} reads as input pipeline {a.input_pipeline_id} of "
                            f"{a.num_input_pipelines}, expected {rank} of {n}")
    policies = {a.policy for a in assignments}
    if len(policies) > 1:
        return problems + [f"ranks disagree on the sharding policy: {sorted(policies)}"]
    wanted = set(files)
    if policies == {RECORD}:
        for rank, a in enumerate(assignments):
            if set(a.files) != wanted:
                problems.append(f"rank {rank} reads {len(a.files)} files under record sharding, expected all "
                                f"{len(wanted)}; missing {sorted(wanted - set(a.files))[:3]}")
        return problems
    owner: dict[str, int] = {}
    for rank, a in enumerate(assignments):
        for f in a.files:
            if f in owner:
                problems.append(f"{f} is read by ranks {owner[f]} and {rank}")
            elif f not in wanted:
                problems.append(f"rank {rank} reads {f}, which is not among the {len(wanted)} files of rank 0")
            owner.setdefault(f, rank)
    missing = sorted(wanted - set(owner))
    if missing:
        problems.append(f"{len(missing)} files are read by no rank: {missing[:3]}")
    return problems


def check_sharding(plane: ControlPlane, mine: ShardAssignment, files: Sequence[str]) -> list[ShardAssignment]:
    """All-gather every rank's assignment and verify them against rank 0's non-empty `files` (every rank raises
    the same error, so none is left waiting in a collective).

    Returns:
      the assignments, indexed by rank.
    Raises:
      ClusterConfigError: listing the overlaps, missing files and misnumbered ranks.
    """
    assignments = [ShardAssignment(*a) for a in plane.allgather(dataclasses.astuple(mine))]
    files = plane.bcast(list(files), root=0)
    problems = sharding_errors(assignments, files)
    if problems:
        raise ClusterConfigError("sharding self-check failed on " + f"{len(assignments)} ranks: "
                                 + "; ".join(problems[:10]))
    return assignments


def describe_sharding(assignments: Sequence[ShardAssignment], files: Sequence[str]) -> str:
    """One line for rank 0's log after a passed check."""
    if assignments and assignments[0].policy == FILE:
        return (f"sharding check passed: {len(assignments)} ranks read disjoint file sets "
                f"({', '.join(str(len(a.files)) for a in assignments)} files) covering all {len(files)} files")
    return (f"sharding check passed: {len(assignments)} ranks read all {len(files)} files and keep disjoint "
            f"records (one in {len(assignments)})")
