"""The harness's own control plane: small Python objects exchanged between ranks, and the sharding self-check.

Training tensors travel through Horovod (or tf.distribute); this module carries the job's bookkeeping: each rank's
statistics gathered to rank 0 and the opt-in check that the ranks' input files are disjoint and cover the data.
Under `mpirun` (Open MPI, MVAPICH2, MPICH / Intel MPI) it is mpi4py on `COMM_WORLD`, which also finds a process's
rank, size and local rank without Horovod (`discover`). Under `horovodrun --gloo` there is no MPI: Horovod's object
collectives serve (`harness.distribute.horovod.HorovodControlPlane`). No TensorFlow here.

mpi4py and Horovod share one MPI in a process: Horovod initializes MPI with MPI_THREAD_MULTIPLE and talks on its
own duplicate of COMM_WORLD from its background thread, so the main thread may use COMM_WORLD meanwhile.
"""
from __future__ import annotations

import dataclasses
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
    """mpi4py on a communicator (default `MPI.COMM_WORLD`)."""

    def __init__(self, comm=None):
        from mpi4py import MPI  # initializes MPI unless Horovod (or someone) already did

        self.comm = comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def gather(self, obj, root=0):
        return self.comm.gather(obj, root=root)

    def bcast(self, obj, root=0):
        return self.comm.bcast(obj, root=root)

    def local_rank(self) -> int:
        """This process's index among the ranks on its host (shared-memory split of the communicator)."""
        from mpi4py import MPI

        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            return node.Get_rank()
        finally:
            node.Free()


def init_thread_multiple() -> bool:
    """Initialize MPI through mpi4py (MPI_THREAD_MULTIPLE: Horovod's thread and ours both call MPI), before
    Horovod, so that Horovod does not own MPI: Horovod finalizes an MPI it initialized as soon as any rank shuts
    Horovod down, which would pull MPI away from under a rank still gathering its statistics.

    Returns:
      False when mpi4py is not installed (Horovod then initializes MPI itself).
    """
    try:
        import mpi4py
    except ImportError:
        return False
    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI
    return MPI.Is_initialized()


def launched_by_mpi(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process was started by an MPI launcher (its variables are the first `environment` finds)."""
    launcher = environment.read_launcher(environ)
    return launcher is not None and launcher.launcher in MPI_LAUNCHERS


def discover(*, backend: Backend = Backend.HOROVOD) -> WorkerContext:
    """This process's `WorkerContext` from MPI itself (mpi4py), without Horovod: rank and size of COMM_WORLD and
    the local rank from a shared-memory split, so any MPI works, whatever variables its launcher sets."""
    plane = MPIControlPlane()
    return WorkerContext(plane.rank, plane.size, plane.local_rank(), 1, environment.WORKER, plane.rank, backend)


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
