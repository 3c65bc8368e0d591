"""A private network namespace for the workers of `harness launch local`: loopback only, so no port a worker opens
is reachable from another host (nor from this host outside the namespace).

Why: TensorFlow's gRPC server listens on every interface whatever TF_CONFIG names (`GrpcServer::Init` binds
`"0.0.0.0:" + port`, tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc; the tf.data service's servers do
the same) and offers no bind address, while it runs any graph it is sent (TensorFlow SECURITY.md, "Running a
TensorFlow server"). In a network namespace of their own (network_namespaces(7)) every interface the workers have
is loopback: they reach each other at `localhost`, and nothing outside reaches them.

How: a holder process (`python netns.py hold`) calls unshare(2) with CLONE_NEWNET (root, or, for another user,
CLONE_NEWUSER | CLONE_NEWNET with its own uid and gid mapped: user_namespaces(7)), brings `lo` up (SIOCSIFFLAGS,
netdevice(7)), says `ready` and waits for its stdin to close. Each worker is started as `python netns.py enter PID
-- CMD...`, which joins the holder's namespaces with setns(2) and execs CMD: same process id, same environment,
same files, same hostname; only the network differs. The namespace has no route out: a worker cannot reach other
hosts either (`needs_network` finds the arguments that would need it).

This file runs as a script (`python -I .../netns.py`) and imports only the standard library, so entering costs
one bare interpreter start (~20 ms) and leaves the command's environment untouched.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import select
import socket
import struct
import subprocess
import sys
from typing import Optional, Sequence

CLONE_NEWNET = 0x40000000            # <linux/sched.h>
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1   # <linux/sockios.h>, <net/if.h>
READY_S = 10.0                       # seconds the holder gets to make the namespace
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)


class NamespaceError(OSError):
    """A private network namespace cannot be made or entered here; the message says which call failed and why."""


def needs_network(command: Sequence[str]) -> list[str]:
    """The arguments of `command` that name something reached over the network: a URL whose scheme is not
    `file` (`gs://bucket/export`, `grpc://localhost:5050`, `https://...`), alone or after `--flag=`.

    A private namespace has no route out and its own loopback: a dispatcher or GCS emulator on this host's
    `localhost` is not reachable from inside it either."""
    found = []
    for arg in command:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        m = _URL.match(value)
        if m and m.group(1).lower() != "file":
            found.append(arg)
    return found


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args) -> None:
    if getattr(_libc(), name)(*args) != 0:
        e = ctypes.get_errno()
        raise NamespaceError(e, f"{name}: {os.strerror(e)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    """Set IFF_UP on `lo` of the calling process's network namespace (a new namespace's `lo` is down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh22x", b"lo", 0)                       # struct ifreq: name, flags, padding to 40
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def _unshare() -> None:
    """Move the calling process into a new network namespace (and a new user namespace when not privileged)."""
    try:
        _call("unshare", CLONE_NEWNET)
        return
    except NamespaceError as e:
        if e.errno != errno.EPERM:
            raise
        first = e
    uid, gid = os.getuid(), os.getgid()
    try:
        _call("unshare", CLONE_NEWUSER | CLONE_NEWNET)
    except NamespaceError as e:
        raise NamespaceError(e.errno, f"unshare(CLONE_NEWNET): {os.strerror(first.errno)}; with a user namespace: "
                                      f"{os.strerror(e.errno)}") from None
    _write("/proc/self/setgroups", "deny")                 # required before an unprivileged gid_map
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _hold() -> int:
    try:
        _unshare()
        _loopback_up()
    except OSError as e:
        print(f"error: {e.strerror or e}", flush=True)
        return 1
    print("ready", flush=True)
    sys.stdin.read()            # until the launcher closes the pipe (or dies)
    return 0


def _enter(pid: int, command: Sequence[str]) -> int:
    try:
        ours = os.readlink("/proc/self/ns/user")
        user = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
        net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        if os.readlink(f"/proc/{pid}/ns/user") != ours:   # the holder made a user namespace: join it first
            _call("setns", user, CLONE_NEWUSER)
        _call("setns", net, CLONE_NEWNET)
        os.close(user)
        os.close(net)
    except OSError as e:
        print(f"harness launch local: cannot enter the workers' network namespace (holder {pid}): {e}",
              file=sys.stderr, flush=True)
        return 2
    try:
        os.execvp(command[0], list(command))
    except OSError as e:
        print(f"harness launch local: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
        return 127


class PrivateNetwork:
    """A network namespace with loopback only, alive while the context is open; `wrap(command)` is the argv that
    runs `command` inside it.

    Raises (on enter):
      NamespaceError: the namespace cannot be made here (no CAP_SYS_ADMIN and no unprivileged user namespaces,
        a seccomp filter refusing unshare, ...), within READY_S seconds; the message has the kernel's reason."""

    def __init__(self):
        self._holder: Optional[subprocess.Popen] = None

    @property
    def pid(self) -> int:
        """Process id of the holder (the namespace is /proc/PID/ns/net)."""
        return self._holder.pid

    def __enter__(self) -> "PrivateNetwork":
        self._holder = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "hold"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        start_new_session=True)
        ready, _, _ = select.select([self._holder.stdout], [], [], READY_S)
        line = self._holder.stdout.readline().strip() if ready else f"no answer in {READY_S:.0f} s"
        if line != "ready":
            self.__exit__(None, None, None)
            raise NamespaceError(errno.EPERM, line.removeprefix("error: "))
        return self

    def wrap(self, command: Sequence[str]) -> list[str]:
        """The argv that runs `command` in this namespace (same pid: the entering step execs `command`)."""
        return [sys.executable, "-I", os.path.abspath(__file__), "enter", str(self.pid), "--", *command]

    def __exit__(self, *exc) -> None:
        holder, self._holder = self._holder, None
        if holder is None:
            return
        holder.stdin.close()
        try:
            holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["hold"]:
        return _hold()
    if len(argv) >= 4 and argv[0] == "enter" and argv[2] == "--":
        return _enter(int(argv[1]), argv[3:])
    print("usage: netns.py hold | netns.py enter PID -- CMD...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
