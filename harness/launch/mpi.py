"""`harness launch mpi` and `harness launch horovod`: build the `mpirun` / `horovodrun` command line, run it.

The flags are Horovod's own (horovod/runner/mpi_run.py, docs/mpi.rst):
  - `-bind-to none -map-by slot`: ranks are placed slot by slot and not pinned to one core each (a pinned rank
    starves TensorFlow's thread pools);
  - `-mca pml ob1 -mca btl ^openib`: Open MPI's point-to-point layer without the InfiniBand verbs transport, which
    breaks when processes fork (tf.data, NCCL) and which NCCL / Gloo replace for the tensors;
  - `-mca btl_tcp_if_exclude lo,docker0` and `NCCL_SOCKET_IFNAME=^lo,docker0` (unless set here): MPI's TCP
    transport and NCCL's sockets avoid the loopback and Docker bridge interfaces, which have the same address on
    every host (Horovod docs/mpi.rst, "Hangs due to non-routed network interfaces");
  - `--tag-output` (Open MPI's): every output line prefixed with its job and rank (`[1,3]<stdout>:`);
  - `-x NAME` for each variable every rank needs: local ranks inherit the environment, remote ones get only what
    is exported: the named list `EXPORTED`, the settings of the harness, Horovod and NCCL (`HARNESS_*`,
    `HOROVOD_*`, `NCCL_*`), and what the user names (`--export NAME`); never a variable that describes one
    process (TF_CONFIG, a launcher's rank), never other `TF_*` (Terraform's `TF_VAR_*` share the prefix and hold
    secrets), never `CUDA_VISIBLE_DEVICES` (each host has its own; horovodrun does not forward it either:
    horovod/runner/common/util/env.py, IGNORE_REGEXES);
  - `--allow-run-as-root` when run as root (containers), where mpirun otherwise refuses to start.
`horovodrun` exports the environment itself and chooses the controller: `--gloo` (no MPI needed) or `--mpi`.
`launch/` holds the same lines for SLURM (`srun`) and plain `mpirun`.
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from harness.choices import HOROVOD_CONTROLLERS
from harness.distribute import environment
from harness.errors import ConfigError, WorkerFailedError

NO_BINDING = ("-bind-to", "none", "-map-by", "slot")
OPEN_MPI = ("-mca", "pml", "ob1", "-mca", "btl", "^openib")
# Interfaces that are not routed between hosts (Horovod docs/mpi.rst): MPI's TCP transport and NCCL skip them.
LOCAL_INTERFACES = "lo,docker0"
TCP_INTERFACES = ("-mca", "btl_tcp_if_exclude", LOCAL_INTERFACES)
NCCL_SOCKET_IFNAME = "^" + LOCAL_INTERFACES   # NCCL's syntax: `^` excludes the listed interfaces
TAG_OUTPUT = "--tag-output"
# Exported by name to every rank when set here (Keras 2 selection, TensorFlow's log level and GPU memory growth,
# paths, the data's cloud credentials). Not CUDA_VISIBLE_DEVICES: it describes this host's devices.
EXPORTED = ("TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "TF_FORCE_GPU_ALLOW_GROWTH", "PYTHONUNBUFFERED", "PATH",
            "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "GOOGLE_APPLICATION_CREDENTIALS")
# Configuration namespaces of the harness, Horovod and NCCL; not `TF_` (Terraform's TF_VAR_* secrets share it).
EXPORTED_PREFIXES = ("HARNESS_", "HOROVOD_", "NCCL_")
# One process's own identity: exporting the launching shell's value would give every rank the same one.
PER_PROCESS = frozenset([environment.TF_CONFIG] + [name for row in environment.LAUNCHERS for name in
                                                   (row.rank, row.size, row.local_rank, row.local_size) if name])
CONTROLLERS = HOROVOD_CONTROLLERS
GRACE_S = 10.0  # seconds the launcher gets to stop its ranks before they are killed


def check_hosts(np: int, hosts: Optional[str]) -> Optional[str]:
    """Validate `-H host:slots,...` for `np` ranks; returns it (None when not given).

    Raises:
      ConfigError: if `np < 1`, a host has no or a bad slot count, or the slots are fewer than `np`.
    """
    if np < 1:
        raise ConfigError(f"--np must be >= 1, got {np}")
    if not hosts:
        return None
    slots = 0
    for entry in hosts.split(","):
        host, _, n = entry.partition(":")
        if not host or not n.isdigit() or int(n) < 1:
            raise ConfigError(f"-H expects host:slots,... (e.g. node1:4,node2:4), got {entry!r}")
        slots += int(n)
    if slots < np:
        raise ConfigError(f"-H {hosts} offers {slots} slots for --np {np}")
    return hosts


def exported_names(environ: Optional[Mapping[str, str]] = None, export: Sequence[str] = ()) -> list[str]:
    """The variables `mpirun -x` exports: `EXPORTED` and the `EXPORTED_PREFIXES` ones that are set here, then
    `export` (the user's `--export NAME`).

    Raises:
      ConfigError: if a name in `export` is not set here (mpirun would warn and export nothing) or describes one
        process (TF_CONFIG, a launcher's rank).
    """
    env = os.environ if environ is None else environ
    for name in export:
        if name in PER_PROCESS or name not in env:
            why = "describes one process" if name in PER_PROCESS else "is not set in this environment"
            raise ConfigError(f"--export {name}: {name} {why}; export a variable every rank needs and that is set")
    names = [n for n in EXPORTED if n in env]
    names += sorted(n for n in env if n.startswith(EXPORTED_PREFIXES) and n not in names)
    names = [n for n in names if n not in PER_PROCESS]
    return names + [n for n in dict.fromkeys(export) if n not in names]


def horovod_backend_error(command: Sequence[str]) -> Optional[str]:
    """Why `command` must not run as the ranks of an MPI job, or None when it may.

    `harness train` (and `harness bench train`) without `--backend horovod` would build a tf.distribute strategy
    in each rank: N independent copies of the job, each reading all the data and writing the same output.
    Other commands (scripts, `python -c`) are left to the user.
    """
    words = list(command)
    if words and os.path.basename(words[0]) == "harness":
        sub = words[1:3]
    elif words[1:3] == ["-m", "harness.cli"]:   # python -m harness.cli train ...
        sub = words[3:5]
    else:
        return None
    if sub[:1] == ["train"]:
        name = "harness train"
    elif sub == ["bench", "train"]:
        name = "harness bench train"
    else:
        return None
    backend = None
    for i, word in enumerate(words):
        if word == "--backend" and i + 1 < len(words):
            backend = words[i + 1]
        elif word.startswith("--backend="):
            backend = word.partition("=")[2]
    if backend == "horovod":
        return None
    given = "without --backend" if backend is None else f"with --backend {backend}"
    copies = f"{name} {given} under MPI would train one independent copy per rank (tf.distribute in each)"
    if name == "harness bench train" and backend is None:   # it has no --backend today
        return f"{copies}; benchmark several workers with `harness launch local` or `--kind tfjob` instead"
    return f"{copies}; add --backend horovod after `{name}`"


def require_horovod_backend(command: Sequence[str]) -> None:
    """Raises ConfigError (see `horovod_backend_error`) unless `command` may run as the ranks of an MPI job."""
    error = horovod_backend_error(command)
    if error:
        raise ConfigError(error)


def mpirun_command(command: Sequence[str], *, np: int, hosts: Optional[str] = None, extra: Sequence[str] = (),
                   environ: Optional[Mapping[str, str]] = None, as_root: Optional[bool] = None,
                   mpirun: str = "mpirun", export: Sequence[str] = ()) -> list[str]:
    """The `mpirun` line for `np` ranks of `command` (Open MPI syntax, Horovod's flags; see the module doc).

    Args:
      hosts: `host:slots,...`; default mpirun's own (this host, or the batch system's allocation).
      extra: further mpirun arguments, before the command.
      environ: whose variables to export (default this process's); TF_USE_LEGACY_KERAS=1 is always set.
      as_root: add `--allow-run-as-root` (default: when this process runs as root).
      export: further variable names to export (`--export NAME`).
    Raises:
      ConfigError: no command, or bad `np` / `hosts` (`check_hosts`).
      ConfigError: `harness train` without `--backend horovod`, or a bad `export` name (`exported_names`).
    """
    if not command:
        raise ConfigError("no command to launch (put it after --)")
    require_horovod_backend(command)
    root = os.geteuid() == 0 if as_root is None else as_root
    line = [mpirun] + (["--allow-run-as-root"] if root else [])
    hosts = check_hosts(np, hosts)
    line += ["-np", str(np)] + (["-H", hosts] if hosts else []) + [*NO_BINDING, *OPEN_MPI, *TCP_INTERFACES,
                                                                    TAG_OUTPUT]
    env = dict(os.environ if environ is None else environ, TF_USE_LEGACY_KERAS="1")
    for name in exported_names(env, export):
        line += ["-x", name]
    if "NCCL_SOCKET_IFNAME" not in env:   # the user's own choice is exported above
        line += ["-x", f"NCCL_SOCKET_IFNAME={NCCL_SOCKET_IFNAME}"]
    return line + list(extra) + list(command)


def horovodrun_command(command: Sequence[str], *, np: int, hosts: Optional[str] = None, controller: str = "gloo",
                       extra: Sequence[str] = (), horovodrun: str = "horovodrun") -> list[str]:
    """The `horovodrun` line: `np` ranks on `hosts` (default `localhost:np`), Gloo or MPI controller
    (horovodrun binds nothing and exports the environment itself). Under Gloo it carries the peer wait,
    `--gloo-timeout-seconds` from `HARNESS_WORKER_WAIT_S` (default 120 s; Gloo's own default is 30 s), unless
    `extra` sets it.

    Raises:
      ConfigError: no command, an unknown controller, a command without `--backend horovod`, bad hosts.
      ClusterConfigError: if `HARNESS_WORKER_WAIT_S` is not a positive number.
    """
    if not command:
        raise ConfigError("no command to launch (put it after --)")
    if controller not in CONTROLLERS:
        raise ConfigError(f"controller must be one of {CONTROLLERS}, got {controller!r}")
    require_horovod_backend(command)
    hosts = check_hosts(np, hosts) or f"localhost:{np}"
    wait = []
    if controller == "gloo" and "--gloo-timeout-seconds" not in extra:
        wait = ["--gloo-timeout-seconds", str(math.ceil(environment.read_worker_wait_s()))]
    return [horovodrun, "-np", str(np), "-H", hosts, f"--{controller}", *wait, *extra, *command]


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


def beside_python(name: str) -> str:
    """The virtual environment's script when it is there (it need not be on PATH), else the bare name."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.path.exists(path) else name
