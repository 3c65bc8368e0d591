"""`harness launch mpi` and `harness launch horovod`: build the `mpirun` / `horovodrun` command line, run it.

The flags are Horovod's own (horovod/runner/mpi_run.py, docs/mpi.rst):
  - `-bind-to none -map-by slot`: ranks are placed slot by slot and not pinned to one core each (a pinned rank
    starves TensorFlow's thread pools);
  - `-mca pml ob1 -mca btl ^openib`: Open MPI's point-to-point layer without the InfiniBand verbs transport, which
    breaks when processes fork (tf.data, NCCL) and which NCCL / Gloo replace for the tensors;
  - `-mca btl_tcp_if_exclude lo,docker0` and `NCCL_SOCKET_IFNAME=^lo,docker0` (unless set here): MPI's TCP
    transport and NCCL's sockets avoid the loopback and Docker bridge interfaces, which have the same address on
    every host (Horovod docs/mpi.rst, "Hangs due to non-routed network interfaces"); with `--network-interface
    NIC,...` (every host's name for its link, where hosts name them differently) `-mca btl_tcp_if_include NIC,...`
    and `NCCL_SOCKET_IFNAME=NIC,...` instead (both take a list: each host uses the names it has);
  - `--tag-output` (Open MPI's): every output line prefixed with its job and rank (`[1,3]<stdout>:`);
  - `-x NAME` for each variable every rank needs: local ranks inherit the environment, remote ones get only what
    is exported: the named list `EXPORTED`, the settings of the harness, Horovod and NCCL (`HARNESS_*`,
    `HOROVOD_*`, `NCCL_*`), and what the user names (`--export NAME`); never a variable that describes one
    process (TF_CONFIG, a launcher's rank), never other `TF_*` (Terraform's `TF_VAR_*` share the prefix and hold
    secrets), never `CUDA_VISIBLE_DEVICES` (each host has its own; horovodrun does not forward it either:
    horovod/runner/common/util/env.py, IGNORE_REGEXES);
  - `--allow-run-as-root` when run as root (containers), where mpirun otherwise refuses to start.
`horovodrun` exports the environment itself and chooses the controller: `--gloo` (no MPI needed) or `--mpi`;
`--network-interface NIC,...` gives it `--network-interfaces` with the names the launcher's host has (it then skips
its own search for a name every host has, which fails where hosts name their links differently:
horovod/horovod#2431; it serves its rendezvous on the first name it is given and failed with a KeyError where this
host lacks it), and the whole list as `HARNESS_NETWORK_INTERFACES` (`env NAME=VALUE horovodrun ...`), from which
each rank takes the name its host has for Gloo and NCCL (`harness.distribute.horovod.gloo_interface`).
`launch/` holds the same lines for SLURM (`srun`) and plain `mpirun`.
"""
from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Mapping, Optional, Sequence

from harness import ports
from harness.choices import HOROVOD_CONTROLLERS
from harness.distribute import environment
from harness.distribute.context import one_process_per_replica
from harness.errors import ConfigError, PreemptedError, WorkerFailedError
from harness.launch import stopping

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
# Configuration namespaces of the harness, Horovod, NCCL and TensorFlow's Cloud Storage file system (GCS_RETRY_CONFIG_*,
# GCS_READ_CACHE_BLOCK_SIZE_MB, GCS_REQUEST_*_TIMEOUT_SECS: tsl/platform/cloud/gcs_file_system.cc); not `TF_`
# (Terraform's TF_VAR_* secrets share it).
EXPORTED_PREFIXES = ("HARNESS_", "HOROVOD_", "NCCL_", "GCS_")
# One process's own identity: exporting the launching shell's value would give every rank the same one.
PER_PROCESS = frozenset([environment.TF_CONFIG] + [name for row in environment.LAUNCHERS for name in
                                                   (row.rank, row.size, row.local_rank, row.local_size) if name])
CONTROLLERS = HOROVOD_CONTROLLERS
GRACE_S = stopping.GRACE_S  # seconds the launcher gets to stop its ranks before they are killed


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
    if backend is not None and one_process_per_replica(backend):
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
                   mpirun: str = "mpirun", export: Sequence[str] = (),
                   interfaces: Optional[str] = None) -> list[str]:
    """The `mpirun` line for `np` ranks of `command` (Open MPI syntax, Horovod's flags; see the module doc).

    Args:
      hosts: `host:slots,...`; default mpirun's own (this host, or the batch system's allocation).
      extra: further mpirun arguments, before the command.
      environ: whose variables to export (default this process's); TF_USE_LEGACY_KERAS=1 is always set.
      as_root: add `--allow-run-as-root` (default: when this process runs as root).
      export: further variable names to export (`--export NAME`).
      interfaces: `NIC,...` the ranks' links (MPI's TCP transport and NCCL), instead of excluding lo and docker0.
    Raises:
      ConfigError: no command, or bad `np` / `hosts` (`check_hosts`), or bad `interfaces`.
      ConfigError: `harness train` without `--backend horovod`, or a bad `export` name (`exported_names`).
    """
    if not command:
        raise ConfigError("no command to launch (put it after --)")
    require_horovod_backend(command)
    root = os.geteuid() == 0 if as_root is None else as_root
    line = [mpirun] + (["--allow-run-as-root"] if root else [])
    hosts = check_hosts(np, hosts)
    nics = check_interfaces(interfaces)
    tcp = ("-mca", "btl_tcp_if_include", nics) if nics else TCP_INTERFACES
    line += ["-np", str(np)] + (["-H", hosts] if hosts else []) + [*NO_BINDING, *OPEN_MPI, *tcp, TAG_OUTPUT]
    env = dict(os.environ if environ is None else environ, TF_USE_LEGACY_KERAS="1")
    for name in exported_names(env, export):
        line += ["-x", name]
    if nics or "NCCL_SOCKET_IFNAME" not in env:   # else the user's own choice is exported above
        line += ["-x", f"NCCL_SOCKET_IFNAME={nics or NCCL_SOCKET_IFNAME}"]
    return line + list(extra) + list(command)


def check_interfaces(interfaces: Optional[str]) -> Optional[str]:
    """`NIC,...` (`--network-interface`) checked: names Linux allows (1-15 characters, no `/`, space or `,` inside);
    returns it without spaces, or None when not given.

    Raises:
      ConfigError: naming the bad entry.
    """
    if not interfaces:
        return None
    names = [n.strip() for n in interfaces.split(",")]
    for name in names:
        if not re.fullmatch(r"[^/\s,:]{1,15}", name):
            raise ConfigError(f"--network-interface expects interface names, NIC,NIC,... (e.g. eth0,enp129s0f1: each "
                              f"host uses the one it has), got {name!r}")
    return ",".join(names)


def horovodrun_command(command: Sequence[str], *, np: int, hosts: Optional[str] = None, controller: str = "gloo",
                       extra: Sequence[str] = (), horovodrun: str = "horovodrun",
                       interfaces: Optional[str] = None, local_interfaces: Optional[Sequence[str]] = None
                       ) -> list[str]:
    """The `horovodrun` line: `np` ranks on `hosts` (default `localhost:np`), Gloo or MPI controller
    (horovodrun binds nothing and exports the environment itself). Under Gloo it carries the peer wait,
    `--gloo-timeout-seconds` from `HARNESS_WORKER_WAIT_S` (default 120 s; Gloo's own default is 30 s), unless
    `extra` sets it; `interfaces` (`NIC,...`) as above (`local_interfaces`: this host's names, default
    `socket.if_nameindex()`).

    Raises:
      ConfigError: no command, an unknown controller, a command without `--backend horovod`, bad hosts, bad
        `interfaces` or none of them on this host (horovodrun serves its rendezvous here).
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
    nics = check_interfaces(interfaces)
    if not nics:
        return [horovodrun, "-np", str(np), "-H", hosts, f"--{controller}", *wait, *extra, *command]
    import socket

    here = [n for _, n in socket.if_nameindex()] if local_interfaces is None else list(local_interfaces)
    mine = [n for n in nics.split(",") if n in here]
    if not mine:
        raise ConfigError(f"--network-interface {nics}: none is on this host ({', '.join(here)}), where horovodrun "
                          "serves the ranks' rendezvous: add this host's name for the link to the ranks' hosts")
    return ["env", f"{environment.NETWORK_INTERFACES}={nics}", horovodrun, "-np", str(np), "-H", hosts,
            f"--{controller}", *wait, "--network-interfaces", ",".join(mine), *extra, *command]


# How mpirun and horovodrun name the rank that failed first (Open MPI 4's help messages, horovod/runner/gloo_run.py).
_PROCESS_NAME = re.compile(r"Process name:\s*(?:\[\[\d+,\d+\],(\d+)\]|(\d+))")
_EXIT_CODE = re.compile(r"Exit code:\s*(-?\d+)")
_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
# A rank's own line, as `--tag-output` (mpirun) and horovodrun prefix it: never read as the launcher's report.
_RANK_LINE = re.compile(r"^\[(?:\d+,)?(\d+)\]<std(?:out|err)>:")


class FirstFailure:
    """Reads the launcher's output lines (`feed`) for the rank that failed first, as mpirun and horovodrun name it:
    `rank`, `code` (the shell's: 137 for SIGKILL) and `host` (mpirun's "on node H", else None); and each rank's
    first own line that says a peer is gone (`peer_lost`: {rank: line}), which makes its SIGABRT retryable
    (`harness.launch.stopping.launcher_code`)."""

    def __init__(self):
        self.rank: Optional[int] = None
        self.code: Optional[int] = None
        self.host: Optional[str] = None
        self.peer_lost: dict = {}
        self._named: Optional[int] = None

    def feed(self, line: str) -> None:
        own = _RANK_LINE.match(line)
        if own:
            rank = int(own.group(1))
            if rank not in self.peer_lost and stopping.peer_lost_line(line[own.end():]):
                self.peer_lost[rank] = line[own.end():].strip()
            return
        if self.rank is not None:
            return
        m = _SIGNALLED.search(line)
        if m:
            self.rank, self.host, self.code = int(m.group(1)), m.group(2), 128 + int(m.group(3))
            return
        m = _PROCESS_NAME.search(line)
        if m:
            self._named = int(m.group(1) or m.group(2))
            return
        m = _EXIT_CODE.search(line)
        if m and self._named is not None:
            self.rank, self.code = self._named, int(m.group(1))


def rank_host(line: Sequence[str], rank: int) -> Optional[str]:
    """The host of `rank` under `-H host:slots,...` of `line`, ranks filled host by host (`-map-by slot`, and
    horovodrun's order); None without `-H`."""
    words = list(line)
    if "-H" not in words or words.index("-H") + 1 >= len(words):
        return None
    first = 0
    for entry in words[words.index("-H") + 1].split(","):
        host, _, n = entry.partition(":")
        first += int(n) if n.isdigit() else 1
        if rank < first:
            return host
    return None


def _pipe(stream, out, first: FirstFailure) -> None:
    for text in stream:
        out.write(text)
        out.flush()
        first.feed(text)


def run(line: Sequence[str], *, timeout_s: Optional[float] = None, environ: Optional[Mapping[str, str]] = None
        ) -> None:
    """Run a launcher line in its own process group (TF_USE_LEGACY_KERAS=1 set), streaming its output.

    SIGTERM and SIGINT to this process are forwarded to the launcher's process group and to each of its
    descendants (the ranks, each in a group of its own); what is left after `GRACE_S` seconds is killed.

    Raises:
      WorkerFailedError: when it exits non-zero: one line names the rank that failed first (as mpirun or
        horovodrun report it), its host where known, its exit code and whether it is retryable; `exit_code` is
        `stopping.launcher_code` of the rank's code (of the launcher's own when no rank is named). After
        `timeout_s` seconds (the whole tree, ranks included, is killed; exit 2).
      PreemptedError: this process got SIGTERM (exit 138, retryable).
      KeyboardInterrupt: this process got SIGINT (the CLI exits 130).
    """
    env = dict(os.environ if environ is None else environ, TF_USE_LEGACY_KERAS="1", PYTHONUNBUFFERED="1")
    program = list(line)
    while program[:1] == ["env"] or "=" in program[0]:   # `env NAME=VALUE horovodrun ...`: name horovodrun
        program = program[1:]
    name = os.path.basename(program[0])
    first = FirstFailure()
    with stopping.StopSignals() as stop:
        proc = subprocess.Popen(list(line), env=env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        pipes = [threading.Thread(target=_pipe, args=(stream, out, first), daemon=True)
                 for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
        for t in pipes:
            t.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while proc.poll() is None and stop.signum is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.1)
        code, signum = proc.poll(), stop.signum
        if code is None:
            _stop(proc, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
        for t in pipes:
            t.join(timeout=5)
    if code is None and signum is None:
        raise WorkerFailedError(f"{name} timed out after {timeout_s:.0f} s; killed it and its ranks")
    if code is None and signum == signal.SIGINT:
        raise KeyboardInterrupt
    if code is None:
        raise PreemptedError(f"the launcher got {signal.Signals(signum).name}: forwarded it to {name} and its "
                             "ranks and stopped them; the same command resumes from the last backup")
    if code != 0:
        message = f"{name} exited with code {code}"
        if first.rank is None:
            raise WorkerFailedError(f"{message} ({stopping.describe(code)})", exit_code=stopping.launcher_code(code))
        host = first.host or rank_host(line, first.rank)
        where = f", on {host}" if host else ""
        seen = first.peer_lost.get(first.rank)
        peer_lost = f"its line {seen[:160]!r}" if seen else None
        raise WorkerFailedError(f"{message}: rank {first.rank} {stopping.describe(first.code, peer_lost)}: the "
                                f"first to fail{where}", exit_code=stopping.launcher_code(first.code, peer_lost))


def _stop(proc: subprocess.Popen, signum: int = signal.SIGTERM) -> None:
    """`signum` to the launcher's group and to each of its descendants (listed first: mpirun puts each rank in a
    process group of its own), SIGKILL to whatever is left after `GRACE_S` (`stopping.stop_tree`)."""
    stopping.stop_tree(stopping.family(proc.pid), [proc.pid], signum, GRACE_S)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def beside_python(name: str) -> str:
    """The virtual environment's script when it is there (it need not be on PATH), else the bare name."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.path.exists(path) else name


def ports_note(line: Sequence[str]) -> list[str]:
    """Shell comment lines (`# ...`) for an mpirun or horovodrun `line`: which ports its job needs open between
    which hosts, which of them can be pinned to a range (and how), and that no other host needs any (README,
    "Security"; the listeners are `harness.ports.INVENTORY`'s). Sources: Open MPI 4.1's MCA parameters
    (`ompi_info --param oob tcp --level 9`, `--param btl tcp`); Horovod 0.28.1's rendezvous and services take a
    random free port >= 1024 (horovod/runner/util/network.py `find_port`), its driver/task services run only for
    remote hosts, during the start (horovod/runner/driver/driver_service.py `get_common_interfaces`); NCCL's and
    Gloo's sockets take ephemeral ports NCCL cannot confine (NVIDIA/nccl issue 388)."""
    words = list(line)
    name = os.path.basename(words[0]) if words else ""
    hosts = words[words.index("-H") + 1] if "-H" in words and words.index("-H") + 1 < len(words) else None
    names = sorted({h.partition(":")[0] for h in hosts.split(",")}) if hosts else []
    pin = " ".join(ports.open_mpi_pin(50000, 200))
    open_mpi = ("Open MPI's runtime (mpirun/orted) and TCP BTL (the ranks' MPI messages), ephemeral ports (and a "
                "second BTL socket per rank that stays so); pin the others to a range")
    if name == "horovodrun":
        mpi = "--mpi" in words
        lines = ["ssh (22, or horovodrun -p PORT) from this host to each other host: horovodrun starts the ranks "
                 "there, and at the start Horovod's task services (HMAC-keyed, a random port >= 1024 each)"]
        if mpi:
            lines.append(f"{open_mpi} with --horovodrun-args '--mpi-args=\"{pin}\"'")
        else:
            lines.append("horovodrun's Gloo rendezvous on this host (HTTP key-value store, no key) on a random "
                         "port >= 1024 and Gloo's transport between the ranks on ephemeral ports: neither can "
                         "be pinned")
    else:
        lines = ["ssh (22, or -mca plm_rsh_args \"-p PORT\") from this host to each other host: mpirun starts "
                 "Open MPI's orted there", f"{open_mpi} with --mpirun-args \"{pin}\""]
    lines.append("NCCL (GPU all-reduce) on ephemeral ports that cannot be pinned: with GPUs, admit all TCP "
                 "between the job's hosts")
    if len(names) > 1:
        head = (f"# ports between the job's hosts ({', '.join(names)}), TCP both ways; no other host needs any "
                "(none of these authenticates: README, Security):")
    else:
        head = ("# ports: no other host needs any (every rank on this host, or between the hosts of the batch "
                "allocation), yet they listen on every interface: close them to other hosts (README, Security):")
    return [head] + [f"#   {text};" for text in lines]
