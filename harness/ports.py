"""Every listening socket a run of the harness opens, per mode: which process, which address, which port, what can be
done through it and what protects it (issue 24, item 1).

One `Listener` row per socket kind. `tests/test_ports_inventory.py` runs each mode briefly, lists the sockets its
processes listen on (polled with psutil, `observe`, and every listen(2) of the run's processes traced with strace,
`traced`: a poll misses a listener that is open for less than a poll, as Gloo's are) and fails on any that no row
of the mode describes, and on a row nobody saw; the README's Security table is `markdown_table()` (tests/test_docs.py checks they match).

Why it matters: TensorFlow's distributed server has no authorization, sends messages unencrypted, "accepts
connections from anywhere, and executes the graphs it is sent" (TensorFlow SECURITY.md, "Running a TensorFlow
server"); the tf.data service's servers are built on the same gRPC runtime. Whoever reaches such a port runs code
with the worker's privileges, so the network between the job's processes must be closed to everyone else.

Which ports clusters outside Kubernetes (`mpirun`, `horovodrun`, `srun`) need open between which hosts, and how
to pin the ones that can be pinned (`open_mpi_pin`), is printed with the launch lines
(`harness.launch.mpi.ports_note`) and written in the README ("Security"): Open MPI's MCA parameters (`ompi_info
--param btl tcp --level 9`, `ompi_info --param oob tcp --level 9`; Open MPI FAQ, "Tuning the run-time
characteristics of MPI TCP communications", open-mpi.org/faq/?category=tcp); Horovod's rendezvous and services
pick a random free port from 1024 (horovod/runner/util/network.py `find_port`, Horovod 0.28.1, with no flag to fix
it); NCCL and Gloo bind port 0 (NVIDIA/nccl issue 388: no port range).

The rows were found by running each mode (TensorFlow 2.18, Horovod 0.28.1, Open MPI 4.1.4, TensorBoard 2.18) and
reading its sockets with psutil and strace, as the test does.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

# The ports the harness fixes by default (each the one home of its number).
TF_SERVER_PORT = 2222         # a worker's gRPC port in an Indexed Job's TF_CONFIG, a TFJob's `tfjob-port`
DATA_SERVICE_PORT = 5050      # `harness data-service dispatcher --port`
TENSORBOARD_PORT = 6006       # TensorBoard's own default; it tries the next 99 when taken

# Modes: the commands a user runs (README). Each is run by tests/test_ports_inventory.py (`launch local`: by
# tests/cluster/test_local_isolation.py, on a two-host bed).
TRAIN = "harness train"
PROFILE = "harness train --profile"
LOCAL = "harness launch local"
LOCAL_HOST = "harness launch local --network host"
TF_CONFIG_MODE = "harness train, TF_CONFIG (MWMS)"
HOROVOD_GLOO = "harness launch horovod --controller gloo"
HOROVOD_MPI = "harness launch horovod --controller mpi"
MPI = "harness launch mpi"
DATA_SERVICE = "harness data-service + train --data-service"
TENSORBOARD = "tensorboard --logdir (printed)"
MODES = (TRAIN, PROFILE, LOCAL, LOCAL_HOST, TF_CONFIG_MODE, HOROVOD_GLOO, HOROVOD_MPI, MPI, DATA_SERVICE, TENSORBOARD)

# Addresses a socket is bound to.
ALL = "all interfaces"      # 0.0.0.0 / [::]: reachable from any host that can route to this one
LOOPBACK = "loopback"       # 127.0.0.0/8 / ::1: this host only
INTERFACE = "one interface"  # one interface's own address (Gloo's HOROVOD_GLOO_IFACE)
PRIVATE = "own namespace"   # any address, in a network namespace of the run's own with loopback only

# Ports.
FROM_TF_CONFIG = "TF_CONFIG"          # the task's own host:port in TF_CONFIG's cluster
FROM_FLAG = "--port"                  # the command's --port (0: an ephemeral one)
EPHEMERAL = "ephemeral"               # bound to port 0: the kernel's pick from net.ipv4.ip_local_port_range
RANDOM_1024 = "random >= 1024"        # Horovod's find_port: a random free port in 1024-65535
FIRST_FREE_1024 = "first free >= 1024"  # Open MPI's TCP BTL: the first free from btl_tcp_port_min_v4 (1024)
TENSORBOARD_PORTS = f"{TENSORBOARD_PORT}-{TENSORBOARD_PORT + 99}"  # TensorBoard: 6006, else the next 99 free

# Processes (roles), as `role()` names them from a command line.
WORKER = "worker"                     # `harness train` (a rank, a TF_CONFIG task, a single process)
LAUNCHER = "harness launch"
MPIRUN = "mpirun"
HOROVODRUN = "horovodrun"
DISPATCHER = "data-service dispatcher"
DATA_WORKER = "data-service worker"
TENSORBOARD_PROCESS = "tensorboard"


@dataclass(frozen=True)
class Listener:
    """One kind of listening socket of a mode.

    Attributes:
      mode: one of `MODES`.
      process: the role of the process that listens (`WORKER`, `MPIRUN`, ...; `role()`).
      address: `ALL`, `LOOPBACK`, `INTERFACE` or `PRIVATE`.
      port: `FROM_TF_CONFIG`, `FROM_FLAG`, `EPHEMERAL`, `RANDOM_1024`, `FIRST_FREE_1024` or
        `TENSORBOARD_PORTS`.
      per_process: how many such ports one process listens on at most (its IPv4 and IPv6 sockets of a port are
        one); a run of the test fails on more.
      reach: what whoever connects can do through it.
      protection: what stops a stranger, besides the network.
      pin: how to fix the port (or a range of them) for a firewall; "" where it cannot be.
    """
    mode: str
    process: str
    address: str
    port: str
    per_process: int
    reach: str
    protection: str
    pin: str = ""


_TF_SERVER = ("TensorFlow's gRPC server: runs any graph it is sent (reads and writes files, starts processes, with "
              "the worker's privileges); the collectives and coordination service of MultiWorkerMirroredStrategy")
_NOTHING = "nothing: no authentication, no encryption (TensorFlow SECURITY.md)"

# `harness launch local` (issue 24, item 2): by default the workers run in a network namespace of their own with
# loopback only (harness/launch/netns.py), where TensorFlow's server still binds every interface of that namespace;
# `--network host` (or a machine where no namespace can be made) leaves them on this host's interfaces.
LOCAL_WORKERS = Listener(
    LOCAL, WORKER, PRIVATE, FROM_TF_CONFIG, 1, _TF_SERVER,
    "the run's own network namespace (loopback only): no other host, nor this host outside the run, reaches it",
    "cannot be (the launcher picks a free port per worker)")
LOCAL_HOST_WORKERS = Listener(
    LOCAL_HOST, WORKER, ALL, FROM_TF_CONFIG, 1, _TF_SERVER,
    _NOTHING + "; TF_CONFIG names localhost but the server binds every interface (the launcher says so, with the "
    "ports): close them to other hosts", "cannot be (the launcher picks a free port per worker)")


def _open_mpi(mode: str) -> tuple[Listener, ...]:
    """Open MPI 4.1's listeners under `mode` (observed with 4.1.4: mpirun on one host; an orted on each other host
    listens as mpirun's runtime does)."""
    runtime = "Open MPI's runtime (ORTE out-of-band TCP): mpirun and the orted daemons launch and control the ranks"
    return (
        Listener(mode, MPIRUN, ALL, EPHEMERAL, 2, runtime + " (one IPv4 and one IPv6 port)",
                 "nothing but the ssh that starts the daemons", "-mca oob_tcp_static_ipv4_ports P "
                 "-mca oob_tcp_static_ipv6_ports P"),
        Listener(mode, MPIRUN, LOOPBACK, EPHEMERAL, 1, "PMIx server's tool connections (ompi-top, ...)",
                 "bound to loopback: this host only", ""),
        Listener(mode, WORKER, ALL, FIRST_FREE_1024, 1,
                 "Open MPI's TCP BTL: MPI messages between ranks on different hosts (mpi4py's control plane, "
                 "Horovod's MPI operations)", "nothing (no authentication)",
                 "-mca btl_tcp_port_min_v4 P -mca btl_tcp_port_range_v4 N (and _v6)"),
        Listener(mode, WORKER, INTERFACE, EPHEMERAL, 1,
                 "a second socket of the TCP BTL, on the interface's own address (absent without the tcp BTL)",
                 "nothing (no authentication)", ""),
    )


INVENTORY: tuple[Listener, ...] = (
    LOCAL_WORKERS,
    LOCAL_HOST_WORKERS,
    Listener(TF_CONFIG_MODE, WORKER, ALL, FROM_TF_CONFIG, 1, _TF_SERVER,
             _NOTHING + "; the network (Kubernetes: the job's NetworkPolicy, `launch k8s`)",
             "the port of the task's address in TF_CONFIG (`launch k8s --port`, default 2222)"),
    Listener(HOROVOD_GLOO, HOROVODRUN, ALL, RANDOM_1024, 1,
             "Gloo rendezvous: an HTTP key-value store the ranks meet through (GET/PUT/DELETE); a stranger can "
             "read the ranks' addresses and overwrite them, which stalls or misroutes the job's start",
             "nothing (plain HTTP, no key); it serves until horovodrun exits", ""),
    # Horovod 0.28.1's Gloo listens once per peer for each of its contexts (4 ports per rank at 2 ranks on one
    # host, traced) and closes each listener as soon as that peer has connected, within hvd.init (open < 0.2 s).
    Listener(HOROVOD_GLOO, WORKER, INTERFACE, EPHEMERAL, 4,
             "Gloo's TCP transport: the ranks' collectives (tensors in, tensors out); each listener is open only "
             "during hvd.init, until its peer has connected (the connection stays)",
             "nothing (no authentication); bound to HOROVOD_GLOO_IFACE's address (lo when every rank is local)",
             "net.ipv4.ip_local_port_range (host-wide)"),
    *_open_mpi(HOROVOD_MPI),
    *_open_mpi(MPI),
    Listener(DATA_SERVICE, DISPATCHER, ALL, FROM_FLAG, 1,
             "tf.data service dispatcher (gRPC): takes dataset graphs from any client and has its workers run them",
             _NOTHING, "--port (default 5050)"),
    Listener(DATA_SERVICE, DATA_WORKER, ALL, EPHEMERAL, 1,
             "tf.data service worker (gRPC): runs the dataset graphs the dispatcher hands it, streams the elements "
             "to any consumer", _NOTHING, "--port N (default 0: ephemeral)"),
    Listener(TENSORBOARD, TENSORBOARD_PROCESS, LOOPBACK, TENSORBOARD_PORTS, 1,
             "TensorBoard's web server: reads the event files and traces under --logdir",
             "bound to localhost (TensorBoard's default; --bind_all would open it to every host)", "--port"),
    Listener(TENSORBOARD, TENSORBOARD_PROCESS, LOOPBACK, EPHEMERAL, 1,
             "TensorBoard's data server (tensorboard_data_server, gRPC): the event files' contents for TensorBoard",
             "bound to localhost", ""),
)


@dataclass(frozen=True)
class Socket:
    """A listening TCP socket (or a bound UDP one, `udp`) found in a process: its `pid`, the process's `role()`,
    the bound `ip` and `port`, the ports that process was told to use (`told`: its TF_CONFIG address's, its
    `--port`), and whether it sits in another network namespace than the observer's (`private`)."""
    pid: int
    process: str
    ip: str
    port: int
    told: frozenset = frozenset()
    udp: bool = False
    command: str = ""
    private: bool = False


def role(cmdline: Sequence[str]) -> str:
    """The role of a process from its command line (psutil's `cmdline()`): `MPIRUN` (mpirun, orterun, mpiexec,
    orted), `HOROVODRUN` (horovodrun and the middlemen it forks), `LAUNCHER` (`harness launch ...`),
    `DISPATCHER` / `DATA_WORKER` (`harness data-service ...`), `TENSORBOARD_PROCESS`, else `WORKER`."""
    words = [os.path.basename(w) for w in cmdline[:4]]
    text = " ".join(cmdline)
    if words and words[0] in ("mpirun", "orterun", "mpiexec", "orted", "prted", "prterun"):
        return MPIRUN
    if "horovodrun" in words:
        return HOROVODRUN
    if "tensorboard" in words or "tensorboard_data_server" in text:
        return TENSORBOARD_PROCESS
    if "data-service dispatcher" in text:
        return DISPATCHER
    if "data-service worker" in text:
        return DATA_WORKER
    if " launch " in f" {text} " and ("harness" in words or "harness.cli" in words):
        return LAUNCHER
    return WORKER


def address_class(ip: str) -> str:
    """`ALL` for an unspecified address (0.0.0.0, ::), `LOOPBACK` for 127.0.0.0/8 and ::1, else `INTERFACE`."""
    address = ipaddress.ip_address(ip.split("%")[0])
    if address.is_unspecified:
        return ALL
    return LOOPBACK if address.is_loopback else INTERFACE


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral ports (first, last), from which a bind to port 0 picks (Linux ip-sysctl docs,
    `ip_local_port_range`); (32768, 60999), Linux's default, where the file cannot be read."""
    try:
        with open(path) as f:
            first, last = f.read().split()
        return int(first), int(last)
    except (OSError, ValueError):
        return 32768, 60999


def _port_matches(kind: str, socket: Socket, ephemeral: tuple[int, int]) -> bool:
    if kind == FROM_TF_CONFIG or kind == FROM_FLAG:
        return socket.port in socket.told
    if kind == EPHEMERAL:
        return ephemeral[0] <= socket.port <= ephemeral[1] and socket.port not in socket.told
    if kind == RANDOM_1024 or kind == FIRST_FREE_1024:
        return socket.port >= 1024 and socket.port not in socket.told
    if kind == TENSORBOARD_PORTS:
        return TENSORBOARD_PORT <= socket.port <= TENSORBOARD_PORT + 99
    raise ValueError(f"unknown port kind {kind!r}")


def matches(row: Listener, socket: Socket, ephemeral: Optional[tuple[int, int]] = None) -> bool:
    """Whether `socket` is one of `row`'s kind: the same process role, address class (`INTERFACE` also holds a
    loopback address: Gloo binds lo's when every rank is on one host) and port kind; never a UDP socket."""
    if socket.udp or row.process != socket.process:
        return False
    found = PRIVATE if socket.private else address_class(socket.ip)
    if found != row.address and not (row.address == INTERFACE and found == LOOPBACK):
        return False
    return _port_matches(row.port, socket, ephemeral or ephemeral_range())


def rows(mode: str) -> list[Listener]:
    """The inventory's rows of `mode`.

    Raises:
      ValueError: if `mode` is not one of `MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
    return [row for row in INVENTORY if row.mode == mode]


def compare(mode: str, sockets: Iterable[Socket]) -> tuple[list[Socket], list[Listener]]:
    """(`sockets` that no row of `mode` describes, or whose port is beyond a row's `per_process` ports in one
    process; rows of `mode` that no socket matched). Both empty: the run listened as the inventory says. The
    IPv4 and IPv6 sockets of one port (gRPC binds 0.0.0.0:P and [::]:P) count as one port."""
    ephemeral = ephemeral_range()
    own = rows(mode)
    unlisted, seen, counts = [], set(), {}
    for socket in sockets:
        row = next((r for r in own if matches(r, socket, ephemeral)), None)
        if row is None:
            unlisted.append(socket)
            continue
        found = counts.setdefault((row, socket.pid), set())
        found.add(socket.port)
        if len(found) > row.per_process:
            unlisted.append(socket)
        seen.add(row)
    return unlisted, [r for r in own if r not in seen]


def told_ports(cmdline: Sequence[str], environ: Mapping[str, str]) -> frozenset:
    """The ports a process was told to listen on: its own address's in TF_CONFIG (the task's entry of the
    cluster) and the value of `--port N` on its command line (N > 0)."""
    ports = set()
    words = list(cmdline)
    for i, word in enumerate(words):
        value = words[i + 1] if word == "--port" and i + 1 < len(words) else word.partition("=")[2] \
            if word.startswith("--port=") else None
        if value and value.isdigit() and int(value) > 0:
            ports.add(int(value))
    try:
        config = json.loads(environ.get("TF_CONFIG") or "{}")
        task = config.get("task", {})
        address = config["cluster"][task["type"]][int(task["index"])]
        ports.add(int(str(address).rsplit(":", 1)[1]))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        pass
    return frozenset(ports)


_LISTEN = "0A"   # TCP_LISTEN in /proc/net/tcp's `st` column (include/net/tcp_states.h)


def proc_sockets(pid: int) -> list[tuple[str, int, bool]]:
    """(ip, port, udp) of each listening TCP socket and unconnected UDP socket process `pid` holds (OSError when
    the process is gone), read from
    /proc/PID/net/{tcp,tcp6,udp,udp6}: the tables of the process's own network namespace (psutil reads this
    process's /proc/net, which does not hold the sockets of a worker in a namespace of its own; proc(5))."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, udp in (("tcp", False), ("tcp6", False), ("udp", True), ("udp6", True)):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if inode not in inodes or (state != _LISTEN if not udp else int(remote.split(":")[1], 16) != 0):
                continue
            address, port = local.split(":")
            raw = bytes.fromhex(address)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((str(ipaddress.ip_address(raw)), int(port, 16), udp))
    return found


def observe(pid: int) -> list[Socket]:
    """The listening TCP sockets (and bound, unconnected UDP ones) of process `pid` and all its descendants, now:
    the process tree from psutil, each process's sockets from its own network namespace's tables
    (`proc_sockets`). A socket shared by a parent and the children it forked is reported once, for the one nearest
    `pid`. Processes that end while being read are skipped.

    Raises:
      psutil.NoSuchProcess: if `pid` does not exist.
    """
    import psutil

    root = psutil.Process(pid)
    mine = os.readlink("/proc/self/ns/net")
    found, keys = [], set()
    for proc in [root] + root.children(recursive=True):
        try:
            with proc.oneshot():
                cmdline = proc.cmdline()
                environ = proc.environ()
            private = os.readlink(f"/proc/{proc.pid}/ns/net") != mine
            sockets = proc_sockets(proc.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, OSError):
            continue
        for ip, port, udp in sockets:
            key = (os.readlink(f"/proc/{proc.pid}/ns/net") if private else mine, ip, port, udp)
            if key in keys:
                continue
            keys.add(key)
            found.append(Socket(proc.pid, role(cmdline), ip, port, told_ports(cmdline, environ), udp,
                                " ".join(cmdline)[:200], private))
    return found


# --- listen(2), traced ----------------------------------------------------------------------------------------------
TRACED_CALLS = "listen,execve,clone,clone3,fork,vfork"


def trace_command(prefix: str) -> list[str]:
    """The strace(1) words to put before a command so that `traced(prefix)` can list every socket its processes
    listen on, however briefly: follow every thread and child (`-f`), one file per thread (`-ff -o PREFIX.TID`),
    only the calls in `TRACED_CALLS` stopped (`--seccomp-bpf`, so the run is not slowed by the rest), each
    listening socket's address decoded at the call (`-yy`, from the kernel's sock_diag), the environment of each
    execve (`-v`, for TF_CONFIG), microsecond timestamps (`-ttt`). strace 5.3 or later (--seccomp-bpf)."""
    return ["strace", "-f", "-ff", "-o", prefix, "--seccomp-bpf", "-qq", "-yy", "-v", "-ttt", "-s", "4096",
            "-e", f"trace={TRACED_CALLS}"]


_LINE = re.compile(r"^(\d+\.\d+) (\w+)\((.*)\) += (-?\d+|\?)")
_LISTENING = re.compile(r"^\d+<(?:TCP|TCPv6):\[(.*):(\d+)\]>")   # undecoded: only the inode, <TCP:[1234]>
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"(\.\.\.)?')


def _arrays(args: str) -> list[list[str]]:
    """The string arrays among one call's arguments as strace prints them (`"/bin/x", ["x", "-c"], ["A=1"]`),
    each string unescaped (C escapes; a string strace cut at -s keeps what it printed)."""
    arrays, i, current = [], 0, None
    while i < len(args):
        if args[i] == '"':
            m = _STRING.match(args, i)
            if not m:
                break
            if current is not None:
                current.append(bytes(m.group(1), "latin-1", "replace").decode("unicode_escape", "replace"))
            i = m.end()
        elif args[i] == "[" and current is None:
            current, i = [], i + 1
        elif args[i] == "]" and current is not None:
            arrays.append(current)
            current, i = None, i + 1
        else:
            i += 1
    return arrays


def traced(prefix: str) -> tuple[list[Socket], list[tuple[int, str]]]:
    """(the listening TCP sockets the traced run opened, in order; the listen calls that could not be decoded, as
    (process id, the call's arguments)) from the files `PREFIX.TID` that `trace_command(prefix)` wrote, one per
    thread.

    Each socket is named by its process's id (the thread group's: a thread's `clone` with CLONE_THREAD keeps its
    parent's, a fork starts its own), the role and told ports from that process's last `execve` before the call
    (its argv and environment; a forked child without one has its parent's), and the address at the call. A
    socket in another network namespace than strace's is not decoded (sock_diag answers in the caller's namespace:
    strace prints the inode only) and is returned apart; `observe` reads those. Failed calls are left out.
    """
    folder, stem = os.path.split(prefix)
    calls, parent = [], {}      # (time, tid, name, args, result); child tid -> (parent tid, is a thread)
    for name in os.listdir(folder or "."):
        if not name.startswith(os.path.basename(stem) + ".") or not name.rsplit(".", 1)[1].isdigit():
            continue
        tid = int(name.rsplit(".", 1)[1])
        with open(os.path.join(folder, name), errors="replace") as f:
            for line in f:
                m = _LINE.match(line)
                if not m or m.group(4) == "?" or int(m.group(4)) < 0:
                    continue
                when, call, args, result = float(m.group(1)), m.group(2), m.group(3), int(m.group(4))
                if call in ("clone", "clone3", "fork", "vfork"):
                    parent[result] = (tid, "CLONE_THREAD" in args)
                else:
                    calls.append((when, tid, call, args))

    def group(tid: int) -> int:
        while tid in parent and parent[tid][1]:
            tid = parent[tid][0]
        return tid

    def lineage(pid: int) -> list[int]:     # the process, its parent process, ...
        chain = [pid]
        while chain[-1] in parent:
            chain.append(group(parent[chain[-1]][0]))
        return chain

    execs: dict[int, tuple[list[str], dict]] = {}
    found, undecoded = [], []
    for when, tid, call, args in sorted(calls):
        pid = group(tid)
        if call == "execve":
            arrays = _arrays(args) + [[], []]
            execs[pid] = (arrays[0], dict(e.partition("=")[::2] for e in arrays[1]))
            continue
        m = _LISTENING.match(args)
        if not m:
            undecoded.append((pid, args))
            continue
        ip, port = m.group(1), m.group(2)
        argv, env = next((execs[p] for p in lineage(pid) if p in execs), ([], {}))
        found.append(Socket(pid, role(argv), ip.strip("[]"), int(port), told_ports(argv, env), False,
                            " ".join(argv)[:200]))
    return found, undecoded


def open_mpi_pin(first: int, count: int) -> list[str]:
    """`mpirun` arguments that put Open MPI's pinnable listeners in ports `first` ... `first + count - 1`: the
    runtime's (mpirun, orted) on `first` (IPv4 and IPv6), the TCP BTL's (the ranks) on the rest. Open MPI 4.1's
    parameters (`ompi_info --param oob tcp --level 9`, `--param btl tcp`); not `oob_tcp_dynamic_ipv4_ports`,
    with which Open MPI 4.1.4's mpirun listens on every port of the range at once. What stays ephemeral: the
    PMIx tool socket (loopback) and the BTL's second socket (`INVENTORY`).

    Raises:
      ValueError: if `count < 2` or the range leaves 1024-65535.
    """
    if count < 2 or first < 1024 or first + count - 1 > 65535:
        raise ValueError(f"a port range needs >= 2 ports within 1024-65535, got {first} + {count}")
    btl = [str(first + 1), str(count - 1)]
    return ["-mca", "oob_tcp_static_ipv4_ports", str(first), "-mca", "oob_tcp_static_ipv6_ports", str(first),
            "-mca", "btl_tcp_port_min_v4", btl[0], "-mca", "btl_tcp_port_range_v4", btl[1],
            "-mca", "btl_tcp_port_min_v6", btl[0], "-mca", "btl_tcp_port_range_v6", btl[1]]


TABLE_HEADER = ("| Mode | Process | Address | Port | Through it | Protected by | Pinned with |\n"
                "|---|---|---|---|---|---|---|")


def markdown_table() -> str:
    """The inventory as the README's Markdown table: one line per row of `INVENTORY`, in `MODES` order, and one
    "listens on nothing" line for each mode without a row."""
    lines = [TABLE_HEADER]
    for mode in MODES:
        own = rows(mode)
        if not own:
            lines.append(f"| `{mode}` | - | - | - | listens on nothing | - | - |")
        for r in own:
            lines.append(f"| `{mode}` | {r.process} | {r.address} | {r.port} | {r.reach} | {r.protection} | "
                         f"{r.pin or 'cannot be'} |")
    return "\n".join(lines)
