"""`harness launch mpi` and `harness launch horovod`: build the `mpirun` / `horovodrun` command line, run it.

The flags are Horovod's own (horovod/runner/mpi_run.py, docs/mpi.rst):
  - `-bind-to none -map-by slot`: ranks are placed slot by slot and not pinned to one core each (a pinned rank
    starves TensorFlow's thread pools);
  - `-mca pml ob1 -mca btl ^openib`: Open MPI's point-to-point layer without the InfiniBand verbs transport, which
    breaks when processes fork (tf.data, NCCL) and which NCCL / Gloo replace for the tensors;
  - `-x NAME` for each variable every rank needs: local ranks inherit the environment, remote ones get only what
    is exported (`EXPORTED` plus any `HARNESS_*`, `HOROVOD_*`, `NCCL_*`, `TF_*` set here, but never a variable
    that describes one process, such as TF_CONFIG or a launcher's rank);
  - `--allow-run-as-root` when run as root (containers), where mpirun otherwise refuses to start.
`horovodrun` exports the environment itself and chooses the controller: `--gloo` (no MPI needed) or `--mpi`.
`launch/` holds the same lines for SLURM (`srun`) and plain `mpirun`.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from harness.distribute import environment
from harness.errors import WorkerFailedError

NO_BINDING = ("-bind-to", "none", "-map-by", "slot")
OPEN_MPI = ("-mca", "pml", "ob1", "-mca", "btl", "^openib")
# Exported by name to every rank when set here (Keras 2 selection, paths, the data's cloud credentials).
EXPORTED = ("TF_USE_LEGACY_KERAS", "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES",
            "GOOGLE_APPLICATION_CREDENTIALS")
EXPORTED_PREFIXES = ("HARNESS_", "HOROVOD_", "NCCL_", "TF_")
# One process's own identity: exporting the launching shell's value would give every rank the same one.
PER_PROCESS = frozenset([environment.TF_CONFIG] + [name for row in environment.LAUNCHERS for name in
                                                   (row.rank, row.size, row.local_rank, row.local_size) if name])
CONTROLLERS = ("gloo", "mpi")
GRACE_S = 10.0  # seconds the launcher gets to stop its ranks before they are killed


def check_hosts(np: int, hosts: Optional[str]) -> Optional[str]:
    """Validate `-H host:slots,...` for `np` ranks; returns it (None when not given).

    Raises:
      ValueError: if `np < 1`, a host has no or a bad slot count, or the slots are fewer than `np`.
    """
    if np < 1:
        raise ValueError(f"--np must be >= 1, got {np}")
    if not hosts:
        return None
    slots = 0
    for entry in hosts.split(","):
        host, _, n = entry.partition(":")
        if not host or not n.isdigit() or int(n) < 1:
            raise ValueError(f"-H expects host:slots,... (e.g. node1:4,node2:4), got {entry!r}")
        slots += int(n)
    if slots < np:
        raise ValueError(f"-H {hosts} offers {slots} slots for --np {np}")
    return hosts


def exported_names(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The variables `mpirun -x` exports: `EXPORTED` and the `EXPORTED_PREFIXES` ones that are set here."""
    env = os.environ if environ is None else environ
    names = [n for n in EXPORTED if n in env]
    names += sorted(n for n in env if n.startswith(EXPORTED_PREFIXES) and n not in names)
    return [n for n in names if n not in PER_PROCESS]


def mpirun_command(command: Sequence[str], *, np: int, hosts: Optional[str] = None, extra: Sequence[str] = (),
                   environ: Optional[Mapping[str, str]] = None, as_root: Optional[bool] = None,
                   mpirun: str = "mpirun") -> list[str]:
    """The `mpirun` line for `np` ranks of `command` (Open MPI syntax, Horovod's flags).

    Args:
      hosts: `host:slots,...`; default mpirun's own (this host, or the batch system's allocation).
      extra: further mpirun arguments, before the command.
      environ: whose variables to export (default this process's); TF_USE_LEGACY_KERAS=1 is always set.
      as_root: add `--allow-run-as-root` (default: when this process runs as root).
    """
    if not command:
        raise ValueError("no command to launch (put it after --)")
    root = os.geteuid() == 0 if as_root is None else as_root
    line = [mpirun] + (["--allow-run-as-root"] if root else [])
    hosts = check_hosts(np, hosts)
    line += ["-np", str(np)] + (["-H", hosts] if hosts else []) + [*NO_BINDING, *OPEN_MPI]
    env = dict(os.environ if environ is None else environ, TF_USE_LEGACY_KERAS="1")
    for name in exported_names(env):
        line += ["-x", name]
    return line + list(extra) + list(command)


def horovodrun_command(command: Sequence[str], *, np: int, hosts: Optional[str] = None, controller: str = "gloo",
                       extra: Sequence[str] = (), horovodrun: str = "horovodrun") -> list[str]:
    """The `horovodrun` line: `np` ranks on `hosts` (default `localhost:np`), Gloo or MPI controller
    (horovodrun binds nothing and exports the environment itself)."""
    if not command:
        raise ValueError("no command to launch (put it after --)")
    if controller not in CONTROLLERS:
        raise ValueError(f"controller must be one of {CONTROLLERS}, got {controller!r}")
    hosts = check_hosts(np, hosts) or f"localhost:{np}"
    return [horovodrun, "-np", str(np), "-H", hosts, f"--{controller}", *extra, *command]


def run(line: Sequence[str], *, timeout_s: Optional[float] = None, environ: Optional[Mapping[str, str]] = None
        ) -> None:
    """Run a launcher line in its own process group (TF_USE_LEGACY_KERAS=1 set), streaming its output.

    Raises:
      WorkerFailedError: when it exits non-zero (the message gives the code), or after `timeout_s` seconds
        (the whole group, ranks included, is killed).
    """
    env = dict(os.environ if environ is None else environ, TF_USE_LEGACY_KERAS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(list(line), env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise WorkerFailedError(f"{line[0]} timed out after {timeout_s:.0f} s; killed it and its ranks") from None
    except KeyboardInterrupt:
        _stop(proc)
        raise
    if code != 0:
        raise WorkerFailedError(f"{line[0]} exited with code {code}")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher (mpirun then stops its ranks), SIGKILL whatever of it and its descendants is left after
    `GRACE_S`. Descendants are listed first: mpirun puts each rank in a process group of its own."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _, alive = psutil.wait_procs(family, timeout=GRACE_S)
    for p in alive:
        p.kill()


def _command(args) -> list[str]:
    command = list(args.argv)
    return command[1:] if command and command[0] == "--" else command


def _launch(line: list[str], args) -> int:
    if args.dry_run:
        print(shlex.join(line))
        return 0
    print(f"launching: {shlex.join(line)}", file=sys.stderr, flush=True)
    run(line, timeout_s=args.timeout)
    return 0


def main_mpi(args) -> int:
    """`harness launch mpi --np N [-H host:slots,...] [--mpirun-args ARGS] [--dry-run] -- CMD...`."""
    line = mpirun_command(_command(args), np=args.np, hosts=args.hosts, extra=shlex.split(args.mpirun_args or ""))
    return _launch(line, args)


def main_horovod(args) -> int:
    """`harness launch horovod --np N [-H host:slots,...] [--controller gloo|mpi] [--dry-run] -- CMD...`."""
    line = horovodrun_command(_command(args), np=args.np, hosts=args.hosts, controller=args.controller,
                              extra=shlex.split(args.horovodrun_args or ""),
                              horovodrun=_beside_python("horovodrun"))
    return _launch(line, args)


def _beside_python(name: str) -> str:
    """The virtual environment's script when it is there (it need not be on PATH), else the bare name."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.path.exists(path) else name
