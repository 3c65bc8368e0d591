"""The listening sockets of a run's processes, as the port inventory's test sees them (tests/test_ports_inventory.py,
tests/ports_support.py, tests/cluster/test_local_isolation.py): each process's sockets polled from /proc
(`observe`: a process in a network namespace of its own included), every listen(2) of the run's processes traced
with strace (`trace_command`, `traced`: a poll misses a listener open for less than a poll, as Gloo's are), and
the sockets compared with `harness.ports.INVENTORY` (`compare`). What the harness itself knows of its ports (the
inventory, the fixed ports, Open MPI's pin) is harness/ports.py; this observer is the test's.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from harness.ports import (ALL, DATA_WORKER, DISPATCHER, EPHEMERAL, FIRST_FREE_1024, FROM_FLAG, FROM_TF_CONFIG,
                           HOROVODRUN, INTERFACE, LAUNCHER, LOOPBACK, MPIRUN, PRIVATE, RANDOM_1024, TENSORBOARD_PORT,
                           TENSORBOARD_PORTS, TENSORBOARD_PROCESS, WORKER, Listener, rows)


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
