"""The mpi4py control plane without Horovod or TensorFlow, launched by tests/distribute/test_mpi.py under mpirun.

Each rank discovers itself through MPI, gathers a statistic to rank 0, and runs the sharding self-check twice: on
the real assignment (must pass) and on a broken one where every rank reads as pipeline 0, as sharding by local rank
does with one rank per host (must fail on every rank). Prints `MPI_CONTROL {json}`.
"""
import json
import sys

from harness.distribute import environment, mpi
from harness.distribute.sharding import assign_files
from harness.errors import ClusterConfigError

files = [f"gs://bucket/export-{i:05d}.tfrecord.gz" for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4)]
context = mpi.discover()
plane = mpi.MPIControlPlane()
gathered = plane.gather({"rank": context.rank, "local_rank": context.local_rank}, root=0)
good = mpi.check_sharding(plane, assign_files(files, context.num_workers, context.rank, warn=False), files)
try:
    mpi.check_sharding(plane, assign_files(files, context.num_workers, 0, warn=False), files)
    broken = None
except ClusterConfigError as e:
    broken = str(e)
launcher = environment.read_launcher()
print("MPI_CONTROL " + json.dumps({
    "rank": context.rank, "size": context.num_workers, "local_rank": context.local_rank,
    "local_size": context.local_size,
    "env": [launcher.launcher, launcher.rank, launcher.size, launcher.local_rank],
    "launched_by_mpi": mpi.launched_by_mpi(), "gathered": gathered,
    "files": [list(a.files) for a in good], "description": mpi.describe_sharding(good, files), "broken": broken,
}), flush=True)
