"""Launched by tests/distribute/test_horovod_install.py under `mpirun -np 2`: mpi4py against Debian's OpenMPI."""
import json

from mpi4py import MPI

comm = MPI.COMM_WORLD
print("MPI4PY_RESULT " + json.dumps({"rank": comm.Get_rank(), "gathered": comm.allgather(comm.Get_rank()),
                                     "library": MPI.Get_library_version().splitlines()[0]}), flush=True)
