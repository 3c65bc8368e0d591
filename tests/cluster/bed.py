"""A cluster in one box: N hosts made of Linux namespaces, joined by a bridge, for multi-host tests.

Each host is a network namespace (its own `eth0` with an address on the bed's subnet, and its own loopback), a
UTS namespace (its own hostname, `host0`, `host1`, ...) and a mount namespace (its own `/etc/hosts` naming every
host of the bed, `/sys` of its own network namespace, and optionally a private `/tmp`). The bridge sits in a
"switch" namespace of its own, so the subnet exists only inside namespaces the bed made: the machine's own stack
has no address or route on it, and the hosts have no route out of it.

An `ssh` stand-in (in `Bed.ssh_dir`) runs `ssh [options] HOST COMMAND...` inside the host named HOST (hostname or
address) with a clean login environment, so `mpirun -H`, `horovodrun -H` and printed launch lines run unmodified
with `ssh_dir` first on PATH.

Names: every namespace, folder and switch-side link of a bed starts with `hx<pid>b<counter>` (the creating
process and a counter), so several test runs at once do not clash; beds whose creating process is gone are swept
when the next bed is made (`sweep_stale`).

Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), `ip`/`tc` (iproute2) and `nsenter`/`unshare` (util-linux);
`unavailable_reason()` says what is missing. Kernel qdiscs used: `tbf` (no `netem`).
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import weakref

PREFIX = "hx"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the checkout
RUN_DIR = "/run/hxbed"           # one folder per bed: namespace files, /etc/hosts, the ssh stand-in
SUBNET = "198.18.0"              # 198.18.0.0/15 is reserved for benchmark tests (RFC 2544): never a real network
PREFIXLEN = 24
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NAME = re.compile(rf"^({PREFIX}(\d+)b(\d+))(sw|h\d+)?$")
_counter = itertools.count()


class BedError(RuntimeError):
    """A command that builds or changes the bed failed; the message has the command and its stderr."""


def _tool(name: str) -> str:
    path = shutil.which(name, path=os.environ.get("PATH", "") + ":" + SYSTEM_PATH)
    if path is None:
        raise BedError(f"`{name}` not found on PATH (tools/install.sh installs iproute2 and util-linux)")
    return path


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one setup command (argv[0] looked up on PATH and the system's folders); BedError when it fails."""
    done = subprocess.run([_tool(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise BedError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


_reason_cache: list = []


def unavailable_reason() -> str | None:
    """Why a bed cannot be made on this machine (not root, a tool missing, namespaces refused), or None.

    Tries the real thing once per process: makes and deletes a network namespace and a UTS namespace."""
    if _reason_cache:
        return _reason_cache[0]
    reason = None
    if os.geteuid() != 0:
        reason = "the bed needs root (network, UTS and mount namespaces): running as uid %d" % os.geteuid()
    else:
        try:
            for tool in ("ip", "tc", "nsenter", "unshare", "mount", "umount", "env"):
                _tool(tool)
            probe = f"{PREFIX}{os.getpid()}p{next(_counter)}"
            _sh("ip", "netns", "add", probe)
            try:
                _sh("ip", "-n", probe, "link", "add", "br0", "type", "bridge")
            finally:
                _sh("ip", "netns", "del", probe, check=False)
            _sh("unshare", "--uts", "--mount", "true")
        except (BedError, OSError, subprocess.SubprocessError) as e:
            reason = f"network namespaces cannot be made here (no CAP_SYS_ADMIN/CAP_NET_ADMIN?): {e}"
    _reason_cache.append(reason)
    return reason


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None when no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _pid_ns() -> str:
    return os.readlink("/proc/self/ns/pid")


def _owner_alive(bed_dir: str) -> bool:
    """Whether the process that made the bed in bed_dir still runs (a bed of another PID namespace counts as
    alive: it is not ours to judge)."""
    try:
        with open(os.path.join(bed_dir, "owner")) as f:
            pid, start, pidns = f.read().split()
    except (OSError, ValueError):
        return True
    return pidns != _pid_ns() or _start_time(int(pid)) == start


def _netns_names() -> list[str]:
    out = _sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_pids(netns: str) -> list[int]:
    out = _sh("ip", "netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _teardown(bed: str, children=()) -> None:
    """Kill every process in the bed's namespaces (SIGKILL, up to 10 s), delete the namespaces (their links go with
    them), unmount the namespace files and remove the bed's folder. The folder goes last, so a teardown cut short
    is finished by the next sweep."""
    spaces = [n for n in _netns_names() if (m := _NAME.match(n)) and m.group(1) == bed]
    deadline = time.monotonic() + 10
    while True:
        pids = {p for ns in spaces for p in _netns_pids(ns)}
        for child in children:           # reap our own children, or they linger as zombies in the namespace
            child.poll()
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    for ns in spaces:
        _sh("ip", "netns", "del", ns, check=False)
    folder = os.path.join(RUN_DIR, bed)
    if os.path.isdir(folder):
        for entry in os.listdir(folder):
            if entry.endswith((".uts", ".mnt")):
                _sh("umount", os.path.join(folder, entry), check=False)
        _sh("umount", folder, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def sweep_stale() -> list[str]:
    """Tear down the beds whose creating process is gone (a test run killed before its teardown).

    Returns the names of the beds swept."""
    swept = []
    if os.path.isdir(RUN_DIR):
        for entry in sorted(os.listdir(RUN_DIR)):
            m = _NAME.match(entry)
            if m and not m.group(4) and not _owner_alive(os.path.join(RUN_DIR, entry)):
                _teardown(entry)
                swept.append(entry)
    return swept


class Host:
    """One host of a bed: a network, UTS and mount namespace.

    Attributes:
      name: its hostname inside its UTS namespace (`host0`, ...), resolvable on every host of the bed.
      address: its IPv4 address on the bed's subnet (str, e.g. "198.18.0.1").
      interface: its link's name inside its network namespace ("eth0").
      netns: the network namespace's name (`ip netns`).
    """

    def __init__(self, bed: "Bed", index: int):
        self.bed = bed
        self.index = index
        self.name = f"host{index}"
        self.address = f"{SUBNET}.{index + 1}"
        self.interface = "eth0"
        self.netns = f"{bed.name}h{index}"
        self._switch_port = f"v{index}"
        self.uts_file = os.path.join(bed.dir, f"h{index}.uts")
        self.mnt_file = os.path.join(bed.dir, f"h{index}.mnt")

    def __repr__(self):
        return f"Host({self.name}, {self.address}, netns={self.netns})"

    def enter_argv(self) -> list[str]:
        """The argv prefix that runs a command inside this host (nsenter into its net, UTS and mount namespaces)."""
        return [_tool("nsenter"), f"--net=/run/netns/{self.netns}", f"--uts={self.uts_file}",
                f"--mount={self.mnt_file}", "--"]

    def popen(self, argv, *, env=None, **kw) -> subprocess.Popen:
        """Start argv inside this host; arguments as subprocess.Popen's.

        env: the process's environment (None: this process's). cwd: its working folder inside the host (default:
        this process's, or "/" when that is under a private /tmp). argv[0] is looked up on env's PATH."""
        cwd = kw.pop("cwd", None)
        if cwd is None:
            cwd = os.getcwd()
            if self.bed.private_tmp and (cwd + "/").startswith("/tmp/"):
                cwd = "/"
        full = [*self.enter_argv(), _tool("env"), "-C", str(cwd), *[str(a) for a in argv]]
        proc = subprocess.Popen(full, env=env, **kw)
        self.bed._children.add(proc)
        return proc

    def run(self, argv, *, env=None, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """Run argv inside this host to its end, as subprocess.run (output captured as text unless told otherwise).

        Raises:
          subprocess.TimeoutExpired: after timeout seconds (the process is killed first).
          subprocess.CalledProcessError: with check=True, on a non-zero exit."""
        check = kw.pop("check", False)
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        if kw.pop("capture_output", False):
            kw["stdout"] = kw["stderr"] = subprocess.PIPE
        kw.setdefault("text", True)
        proc = self.popen(argv, env=env, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            done.check_returncode()
        return done

    def link_down(self) -> None:
        """Take this host's link off the switch (its switch port down), as a pulled cable or a lost host: packets to
        and from it are dropped; its own interface keeps its address, so its processes see timeouts, not errors."""
        _sh("ip", "-n", self.bed.switch, "link", "set", self._switch_port, "down")

    def link_up(self) -> None:
        """Put this host's link back on the switch."""
        _sh("ip", "-n", self.bed.switch, "link", "set", self._switch_port, "up")

    def cap(self, mbit: float | None) -> None:
        """Cap this host's link at mbit megabits per second each way (tc tbf on its interface and on its switch
        port), or remove the cap (None).

        The bucket holds 10 ms at the rate (at least 32 KiB, enough for the kernel's timer granularity at
        HZ >= 100); packets queued longer than 100 ms are dropped (tc-tbf(8)).

        Raises:
          ValueError: if mbit is not positive."""
        ends = [(self.netns, self.interface), (self.bed.switch, self._switch_port)]
        if mbit is None:
            for ns, dev in ends:
                _sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
            return
        if not mbit > 0:
            raise ValueError(f"cap: the rate must be > 0 Mbit/s, got {mbit!r}")
        burst = max(32 * 1024, int(mbit * 1e6 / 8 * 0.01))
        for ns, dev in ends:
            _sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit * 1000:.0f}kbit",
                "burst", str(burst), "latency", "100ms")


_SSH = r'''#!{python} -S
"""ssh stand-in of a test bed: `ssh [options] HOST COMMAND...` runs COMMAND with `sh -c` inside HOST (a host name
or address of the bed), with a clean login environment (HOME, USER, LOGNAME, SHELL, PATH), as sshd would."""
import json, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "hosts.json")) as f:
    BED = json.load(f)
WITH_ARG = set("BbcDEeFIiJLlmOoPpQRSWw")
args, no_stdin = sys.argv[1:], False


def options(i):
    """Skip the options from args[i]: the index of the next word that is not one, and whether `--` ended them."""
    global no_stdin
    while i < len(args) and args[i].startswith("-") and len(args[i]) > 1:
        opt = args[i]
        i += 1
        if opt == "--":
            return i, True
        for k, ch in enumerate(opt[1:]):
            if ch == "n":
                no_stdin = True
            if ch in WITH_ARG:
                if k == len(opt) - 2:
                    i += 1          # its value is the next word
                break               # else the rest of this word is its value
    return i, False


i, ended = options(0)
if i >= len(args):
    sys.exit("usage: ssh [options] HOST COMMAND... (the test bed's ssh runs commands, not logins)")
target = args[i].rsplit("@", 1)[-1]
i += 1
if not ended:       # OpenSSH takes options after the destination too (horovodrun puts -p and -i there)
    i, _ = options(i)
command = " ".join(args[i:])
host = BED["hosts"].get(target)
if host is None:
    sys.stderr.write(f"ssh: Could not resolve hostname {target}: Name or service not known\n")
    sys.exit(255)
if not command:
    sys.exit("ssh (test bed): no command given; interactive logins are not supported")
if no_stdin:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
login = ["HOME=" + BED["home"], "USER=" + BED["user"], "LOGNAME=" + BED["user"], "SHELL=/bin/sh",
         "PATH=" + BED["path"]]
nsenter = BED["nsenter"]
os.execv(nsenter, [nsenter, "--mount=" + BED["root_mnt"], "--", *host, BED["env"], "-i", "-C", BED["home"],
                   *login, "/bin/sh", "-c", command])
'''


def kept_under_tmp() -> list[str]:
    """The folders a private /tmp keeps visible: the checkout and the Python environment, those under /tmp, none
    inside another."""
    keep = []
    for path in sorted({os.path.realpath(p) for p in (REPO, sys.prefix, sys.base_prefix)}):
        if (path + "/").startswith("/tmp/") and not any((path + "/").startswith(k + "/") for k in keep):
            keep.append(path)
    return keep


class Bed:
    """N hosts on one switch; a context manager (closed on exit).

    Args:
      n: the number of hosts (1 to 200).
      cap_mbit: a cap on every host's link in Mbit/s each way (Host.cap), or None.
      private_tmp: give each host its own empty /tmp (tmpfs), as separate machines have; the checkout and the
        Python environment stay visible where they live under /tmp (`_private_tmp_script`).

    Attributes:
      hosts: the hosts, host0 first.
      ssh_dir: a folder holding the `ssh` stand-in; put it first on PATH.
      shared_dir: an empty folder at the same path on every host and here, outside /tmp (storage the hosts share,
        as NFS; for data when /tmp is private); removed at close.
      name: the bed's name, the prefix of its namespaces (`hx<pid>b<k>`).
      switch: the switch namespace's name.

    Raises:
      BedError: a namespace, link or mount could not be made (what was made is torn down first).
      ValueError: n out of range.
    """

    def __init__(self, n: int, *, cap_mbit: float | None = None, private_tmp: bool = False):
        if not 1 <= n <= 200:
            raise ValueError(f"Bed: n must be 1 to 200 hosts, got {n}")
        sweep_stale()
        self.name = f"{PREFIX}{os.getpid()}b{next(_counter)}"
        self.dir = os.path.join(RUN_DIR, self.name)
        self.switch = f"{self.name}sw"
        self.private_tmp = private_tmp
        self.ssh_dir = os.path.join(self.dir, "bin")
        self.shared_dir = os.path.join(self.dir, "shared")
        self._children = weakref.WeakSet()
        self._closed = False
        self.hosts = [Host(self, i) for i in range(n)]
        try:
            self._build(cap_mbit)
        except BaseException:
            self.close()
            raise

    def _private_tmp_script(self, host) -> str:
        """Shell commands, run in `host`'s mount namespace, that mount an empty tmpfs on /tmp and bind back the
        checkout and the interpreter's environment when they live under /tmp (a clone in /tmp, as CI may make):
        each is first bound to a folder of the bed outside /tmp, then, after the tmpfs, onto its own path."""
        keep = kept_under_tmp()
        stage = os.path.join(self.dir, f"keep{host.index}")
        q = shlex.quote
        steps = [f"mkdir -p {stage}/{i} && mount --bind {q(p)} {stage}/{i}" for i, p in enumerate(keep)]
        steps.append(f"mount -t tmpfs -o size=512m,mode=1777 {self.name} /tmp")
        steps += [f"mkdir -p {q(p)} && mount --bind {stage}/{i} {q(p)}" for i, p in enumerate(keep)]
        return " && ".join(steps)

    def _build(self, cap_mbit):
        os.makedirs(self.shared_dir)
        with open(os.path.join(self.dir, "owner"), "w") as f:
            f.write(f"{os.getpid()} {_start_time(os.getpid())} {_pid_ns()}\n")
        # A private mount of its own: the mount namespace files below may not sit on a shared mount.
        _sh("mount", "--bind", self.dir, self.dir)
        _sh("mount", "--make-private", self.dir)
        hosts_file = os.path.join(self.dir, "hosts")
        with open(hosts_file, "w") as f:
            f.write("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
            f.writelines(f"{h.address}\t{h.name}\n" for h in self.hosts)
        _sh("ip", "netns", "add", self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for h in self.hosts:
            _sh("ip", "netns", "add", h.netns)
            # Made inside the switch namespace, its peer straight into the host's: no link ever in the root one.
            _sh("ip", "-n", self.switch, "link", "add", h._switch_port, "type", "veth", "peer", "name",
                h.interface, "netns", h.netns)
            _sh("ip", "-n", self.switch, "link", "set", h._switch_port, "master", "br0", "up")
            _sh("ip", "-n", h.netns, "addr", "add", f"{h.address}/{PREFIXLEN}", "dev", h.interface)
            _sh("ip", "-n", h.netns, "link", "set", h.interface, "up")
            _sh("ip", "-n", h.netns, "link", "set", "lo", "up")
            open(h.uts_file, "w").close()
            open(h.mnt_file, "w").close()
            _sh("unshare", f"--uts={h.uts_file}", _tool("hostname"), h.name)
            mounts = (f"umount -l /sys && mount -t sysfs {self.name} /sys && mount --bind {hosts_file} /etc/hosts"
                      + (f" && {self._private_tmp_script(h)}" if self.private_tmp else ""))
            _sh("nsenter", f"--net=/run/netns/{h.netns}", "--", _tool("unshare"), f"--mount={h.mnt_file}",
                "--propagation", "slave", "/bin/sh", "-c", mounts)
            if cap_mbit is not None:
                h.cap(cap_mbit)
        self._write_ssh()

    def _write_ssh(self):
        os.makedirs(self.ssh_dir)
        hosts = {}
        for h in self.hosts:
            hosts[h.name] = hosts[h.address] = h.enter_argv()
        venv_bin = os.path.dirname(sys.executable)
        user = os.environ.get("USER") or ("root" if os.geteuid() == 0 else str(os.geteuid()))
        spec = {"hosts": hosts, "nsenter": _tool("nsenter"), "env": _tool("env"),
                "root_mnt": f"/proc/{os.getpid()}/ns/mnt", "home": os.path.expanduser("~"), "user": user,
                "path": ":".join([self.ssh_dir, venv_bin, SYSTEM_PATH])}
        with open(os.path.join(self.ssh_dir, "hosts.json"), "w") as f:
            json.dump(spec, f, indent=1)
        ssh = os.path.join(self.ssh_dir, "ssh")
        with open(ssh, "w") as f:
            f.write(_SSH.replace("{python}", sys.executable))
        os.chmod(ssh, 0o755)

    def env(self, base: dict | None = None, **extra) -> dict:
        """A copy of base (default: os.environ) with ssh_dir first on PATH, plus extra variables."""
        env = dict(os.environ if base is None else base, **extra)
        env["PATH"] = self.ssh_dir + ":" + env.get("PATH", SYSTEM_PATH)
        return env

    def host(self, name_or_address: str) -> Host:
        """The host with this hostname or address; KeyError if none."""
        for h in self.hosts:
            if name_or_address in (h.name, h.address):
                return h
        raise KeyError(f"no host {name_or_address!r} in bed {self.name}: {self.hosts}")

    def close(self) -> None:
        """Kill every process in the bed's namespaces, delete its namespaces (and so its links), unmount and remove
        its folder. Idempotent."""
        if self._closed:
            return
        self._closed = True
        children = list(self._children)
        _teardown(self.name, children)
        for child in children:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> "Bed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
