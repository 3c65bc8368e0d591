"""`harness launch local|k8s|mpi|horovod`."""
from __future__ import annotations


def local(args) -> int:
    from harness.launch import local as local_lib
    return local_lib.main(args)


def k8s(args) -> int:
    from harness.launch import k8s as k8s_lib
    return k8s_lib.main(args)


def mpi(args) -> int:
    from harness.launch import mpi as mpi_lib
    return mpi_lib.main_mpi(args)


def horovod(args) -> int:
    from harness.launch import mpi as mpi_lib
    return mpi_lib.main_horovod(args)
