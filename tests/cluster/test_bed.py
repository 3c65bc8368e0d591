"""The bed itself (bed.py): hosts with their own names and addresses, a subnet that exists only inside the bed,
links that go down and come back, a bandwidth cap, a private /tmp, an ssh stand-in for mpirun, and a teardown
that leaves nothing behind."""
import json
import os
import subprocess
import sys
import time

import pytest

from cluster import bed as bedmod

PY = sys.executable

# Serves its hostname to every connection on ADDRESS:PORT (argv 1, 2), up to 100 connections.
SERVE_NAME = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
for _ in range(100):
    c, _ = s.accept(); c.sendall(socket.gethostname().encode()); c.close()
"""
# Connects to ADDRESS:PORT (argv 1, 2) within TIMEOUT s (argv 3); prints {"name": ...} or {"error": errno name}.
ASK_NAME = """
import errno, json, socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    print(json.dumps({"name": c.recv(100).decode()}))
except socket.timeout:
    print(json.dumps({"error": "timeout"}))
except OSError as e:
    print(json.dumps({"error": errno.errorcode.get(e.errno, str(e))}))
"""


def _serve_names(bed, port=7000):
    procs = [h.popen([PY, "-c", SERVE_NAME, h.address, str(port)], stdout=subprocess.PIPE, text=True)
             for h in bed.hosts]
    for p in procs:
        assert p.stdout.readline().strip() == "listening"
    return procs


def _ask(host, address, port=7000, timeout=3.0) -> dict:
    done = host.run([PY, "-c", ASK_NAME, address, str(port), str(timeout)], timeout=timeout + 30, check=True)
    return json.loads(done.stdout)


def test_hosts_have_their_own_names_and_reach_each_other_by_address(make_bed):
    bed = make_bed(3)
    names = [h.run(["hostname"], check=True).stdout.strip() for h in bed.hosts]
    assert names == ["host0", "host1", "host2"]
    assert len({h.address for h in bed.hosts}) == 3
    for h in bed.hosts:
        addrs = h.run(["ip", "-4", "-o", "addr", "show", "dev", h.interface], check=True).stdout
        assert f"inet {h.address}/24" in addrs
    _serve_names(bed)
    for src in bed.hosts:
        for dst in bed.hosts:
            assert _ask(src, dst.address) == {"name": dst.name}, (src, dst)
    # Names resolve inside the bed, each to its host's address on the subnet (not loopback).
    resolved = bed.hosts[0].run([PY, "-c", "import socket; print([socket.gethostbyname(f'host{i}') "
                                           "for i in range(3)])"], check=True).stdout
    assert resolved.strip() == str([h.address for h in bed.hosts])


def test_the_subnet_exists_only_inside_the_bed(make_bed):
    bed = make_bed(2)
    root_addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    root_routes = subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True,
                                 check=True).stdout
    root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert bedmod.SUBNET + "." not in root_addrs and bedmod.SUBNET + "." not in root_routes
    assert bed.name not in root_links and "br0" not in root_links
    h = bed.hosts[0]
    # No route out of the bed: the kernel refuses at once (nothing is sent) for any address off the subnet.
    for outside in ("1.1.1.1", "10.0.0.1", "192.168.1.1"):
        got = h.run(["ip", "route", "get", outside])
        assert got.returncode != 0 and "unreachable" in got.stderr.lower(), (outside, got)
    routes = h.run(["ip", "-4", "route", "show", "table", "all"], check=True).stdout
    assert "default" not in routes
    # The machine's own addresses are not reachable from a host.
    own = [line.split()[3].split("/")[0] for line in root_addrs.splitlines()
           if " inet " in line and " lo " not in line]
    for address in own:
        assert _ask(h, address, port=22, timeout=2) == {"error": "ENETUNREACH"}, address


def test_a_link_down_makes_its_host_unreachable_and_up_restores_it(make_bed):
    bed = make_bed(2)
    a, b = bed.hosts
    _serve_names(bed)
    assert _ask(a, b.address) == {"name": "host1"}
    b.link_down()
    assert _ask(a, b.address, timeout=2) in ({"error": "timeout"}, {"error": "EHOSTUNREACH"})
    assert _ask(b, a.address, timeout=2) in ({"error": "timeout"}, {"error": "EHOSTUNREACH"})
    b.link_up()
    deadline = time.monotonic() + 20
    while (got := _ask(a, b.address, timeout=2)) != {"name": "host1"} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got == {"name": "host1"}


# Receives until EOF on ADDRESS:PORT; prints bytes and seconds from the first byte to the last.
SINK = """
import json, socket, sys, time
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
c, _ = s.accept()
n, t0 = 0, None
while chunk := c.recv(1 << 16):
    t0 = t0 or time.monotonic(); n += len(chunk)
print(json.dumps({"bytes": n, "seconds": time.monotonic() - t0}))
"""
SOURCE = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
c.sendall(b"x" * int(sys.argv[3])); c.close()
"""


def _throughput_mbit(src, dst, nbytes, port) -> float:
    sink = dst.popen([PY, "-c", SINK, dst.address, str(port)], stdout=subprocess.PIPE, text=True)
    assert sink.stdout.readline().strip() == "listening"
    src.run([PY, "-c", SOURCE, dst.address, str(port), str(nbytes)], timeout=120, check=True)
    out, _ = sink.communicate(timeout=60)
    got = json.loads(out)
    assert got["bytes"] == nbytes
    return got["bytes"] * 8 / got["seconds"] / 1e6


def test_the_cap_bounds_the_throughput_between_hosts(make_bed):
    cap = 20.0
    bed = make_bed(2, cap_mbit=cap)
    a, b = bed.hosts
    nbytes = 5 * 1000 * 1000  # 2 s at the cap
    capped = _throughput_mbit(a, b, nbytes, 7100)
    assert cap / 2 <= capped <= cap * 1.25, capped
    back = _throughput_mbit(b, a, nbytes, 7101)  # the cap holds each way
    assert cap / 2 <= back <= cap * 1.25, back
    a.cap(None)
    b.cap(None)
    free = _throughput_mbit(a, b, nbytes * 4, 7102)
    assert free > 4 * cap, free
    with pytest.raises(ValueError, match="must be > 0"):
        a.cap(0)


def test_private_tmp_is_private_to_each_host(make_bed, tmp_path):
    bed = make_bed(2, private_tmp=True)
    a, b = bed.hosts
    a.run(["sh", "-c", "echo a > /tmp/hx-mark"], check=True)
    assert a.run(["cat", "/tmp/hx-mark"], check=True).stdout == "a\n"
    # empty but for the checkout and the Python environment where they live under /tmp (a clone in /tmp)
    assert b.run(["ls", "/tmp"], check=True).stdout.split() == sorted({p.split("/")[2] for p in
                                                                       bedmod.kept_under_tmp()})
    assert not os.path.exists("/tmp/hx-mark")
    assert b.run(["test", "-e", str(tmp_path)]).returncode != 0  # the caller's /tmp is not there either
    a.run(["sh", "-c", f"echo a > {bed.shared_dir}/mark"], check=True)   # the shared folder is
    assert b.run(["cat", f"{bed.shared_dir}/mark"], check=True).stdout == "a\n"
    assert open(os.path.join(bed.shared_dir, "mark")).read() == "a\n"
    shared = make_bed(1)
    (tmp_path / "seen").write_text("x")
    assert shared.hosts[0].run(["cat", str(tmp_path / "seen")], check=True).stdout == "x"


def _live(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(pid)
        except OSError:
            pass
    return out


def test_close_leaves_no_namespace_link_mount_or_process(make_bed):
    bed = make_bed(2, cap_mbit=50)
    for h in bed.hosts:   # a child, a grandchild left in the background, and one started through ssh
        h.popen(["sh", "-c", "sleep 1000 & sleep 1000"])
    subprocess.run(["ssh", "host1", "nohup sleep 1000 >/dev/null 2>&1 &"], env=bed.env(), timeout=30, check=True)
    time.sleep(0.5)
    spaces = [h.netns for h in bed.hosts] + [bed.switch]
    pids = [int(p) for ns in spaces for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                                             text=True).stdout.split()]
    assert len(_live(pids)) >= 5
    bed.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(ns in listed for ns in spaces)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert bed.name not in links
    with open("/proc/self/mountinfo") as f:
        assert bed.name not in f.read()
    assert not os.path.exists(bed.dir)
    deadline = time.monotonic() + 10
    while _live(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live(pids) == []
    bed.close()  # idempotent


def test_a_bed_whose_maker_died_is_swept_by_the_next(make_bed, tmp_path):
    maker = subprocess.Popen(
        [PY, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); from cluster.bed import Bed; "
                   "b = Bed(2); b.hosts[0].popen(['sleep', '1000']); print(b.name, flush=True); time.sleep(1000)",
         os.path.dirname(os.path.dirname(os.path.abspath(__file__)))], stdout=subprocess.PIPE, text=True)
    try:
        stale = maker.stdout.readline().strip()
        assert stale.startswith(bedmod.PREFIX), stale
    finally:
        maker.kill()
        maker.wait(10)
    assert os.path.isdir(os.path.join(bedmod.RUN_DIR, stale))
    make_bed(1)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert stale not in listed and not os.path.exists(os.path.join(bedmod.RUN_DIR, stale))


def test_ssh_runs_on_the_named_host_with_a_login_environment_only(make_bed):
    bed = make_bed(2)
    a, b = bed.hosts
    env = bed.env(HX_CALLERS_SECRET="1")
    # horovodrun's check first: options it and mpirun pass, a short command.
    for target in (b.name, b.address, f"root@{b.address}"):
        done = a.run(["ssh", "-o", "StrictHostKeyChecking=no", "-oBatchMode=yes", "-p", "22", "-i", "/dev/null",
                      "-x", "-T", "-q", "-n", target, "true"], env=env, timeout=30)
        assert done.returncode == 0, done
    # horovodrun's form (horovod/runner/util/remote.py): options after the destination too, then the command.
    done = a.run(["ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "host1", "-p", "22",
                  "-i", "/dev/null", "-o", "ConnectTimeout=10", "hostname", "-s"], env=env, timeout=30)
    assert done.returncode == 0 and done.stdout == "host1\n", done
    done = a.run(["ssh", "host1", "hostname; pwd; env"], env=env, timeout=30, check=True)
    lines = done.stdout.splitlines()
    assert lines[:2] == ["host1", os.path.expanduser("~")]
    names = {line.split("=", 1)[0] for line in lines[2:]}
    assert names <= {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "PWD", "SHLVL", "_", "OLDPWD"}, names
    assert "HX_CALLERS_SECRET" not in done.stdout
    path = dict(line.split("=", 1) for line in lines[2:] if "=" in line)["PATH"].split(":")
    assert path[0] == bed.ssh_dir and os.path.dirname(PY) in path
    # A long command of several words, as orted's: joined with spaces and run by sh -c, quotes kept.
    words = ["X='a  b';", "export X;"] + [f"Y{i}={i};" for i in range(500)] + ["echo", '"$X"', "$Y499"]
    done = subprocess.run(["ssh", "-x", b.address, *words], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "a  b 499\n", done
    unknown = subprocess.run(["ssh", "host9", "true"], env=env, capture_output=True, text=True, timeout=30)
    assert unknown.returncode == 255 and "Could not resolve hostname host9" in unknown.stderr


def test_mpirun_across_two_hosts_through_the_ssh_stand_in(make_bed):
    bed = make_bed(2)
    a, b = bed.hosts
    hosts = f"{a.address}:1,{b.address}:1"
    done = a.run(["mpirun", "--allow-run-as-root", "-H", hosts, "-np", "2", "hostname"], env=bed.env(),
                 timeout=120)
    assert done.returncode == 0, done
    assert sorted(done.stdout.split()) == ["host0", "host1"]
    # Open MPI's own option instead of PATH.
    done = a.run(["mpirun", "--allow-run-as-root", "-mca", "plm_rsh_agent", os.path.join(bed.ssh_dir, "ssh"),
                  "-H", hosts, "-np", "2", "hostname"], timeout=120)
    assert done.returncode == 0, done
    assert sorted(done.stdout.split()) == ["host0", "host1"]


def test_horovodrun_across_two_hosts_through_the_ssh_stand_in(make_bed):
    """horovodrun -H, unmodified, from host0: its ssh check, its task services on each host (which pick the
    interfaces the hosts share) and the command on both hosts."""
    bed = make_bed(2)
    horovodrun = os.path.join(os.path.dirname(PY), "horovodrun")
    done = bed.hosts[0].run([horovodrun, "-np", "2", "-H", "host0:1,host1:1", "--gloo", "--start-timeout", "60",
                             "hostname"], env=bed.env(), timeout=180)
    assert done.returncode == 0, done
    assert sorted(done.stdout.split()) == ["[0]<stdout>:host0", "[1]<stdout>:host1"], done
