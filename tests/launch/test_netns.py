"""`harness launch local`'s private network (harness/launch/netns.py) with real processes: the workers reach each
other at localhost and nothing outside reaches them; a command naming a URL is refused before any worker starts;
where no namespace can be made the launcher says so once, with the ports. (tests/cluster/test_local_isolation.py
proves it from another host of the bed, with a training run.)"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from harness.errors import ConfigError
from harness.launch import netns
from harness.launch.local import run_local

HARNESS = [sys.executable, "-m", "harness.cli"]
# Each worker listens on its TF_CONFIG port on every interface (as TensorFlow's server does), says so, connects to
# the other worker's port at localhost, then waits for the test's probe (a file) before it exits.
PEER = """
import json, os, socket, sys, time
c = json.loads(os.environ["TF_CONFIG"]); i = c["task"]["index"]; workers = c["cluster"]["worker"]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(workers[i].rsplit(":", 1)[1]))); s.listen()
print("pid", os.getpid(), "listening", workers[i], flush=True)
peer = workers[1 - i].rsplit(":", 1)
for _ in range(200):
    try:
        socket.create_connection((peer[0], int(peer[1])), timeout=2).close(); break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("worker %d never reached its peer" % i)
print("reached", workers[1 - i], flush=True)
for _ in range(600):
    if os.path.exists(sys.argv[1]): break
    time.sleep(0.05)
"""


def _namespace_reason():
    try:
        with netns.PrivateNetwork():
            return None
    except netns.NamespaceError as e:
        return str(e)


def test_arguments_that_need_the_network_are_found():
    cmd = ["harness", "train", "--data", "gs://bucket/export", "--data-service=grpc://localhost:5050",
           "--output", "file:///runs/x", "HTTPS://example.invalid/a", "/data/export", "runs/x", "--lr=0.1"]
    assert netns.needs_network(cmd) == ["gs://bucket/export", "--data-service=grpc://localhost:5050",
                                        "HTTPS://example.invalid/a"]


def test_workers_reach_each_other_and_nothing_outside_reaches_them(tmp_path):
    reason = _namespace_reason()
    if reason:
        pytest.skip(f"no network namespace can be made here: {reason}")
    go = tmp_path / "go"
    out_file = tmp_path / "out"
    launcher = subprocess.Popen([*HARNESS, "launch", "local", "--workers", "2", "--timeout", "60", "--",
                                 sys.executable, "-c", PEER, str(go)], stdout=open(out_file, "w"),
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while out_file.read_text().count("reached") < 2 and launcher.poll() is None:
            assert time.monotonic() < deadline, out_file.read_text()
            time.sleep(0.05)
        text = out_file.read_text()
        ports = [int(line.rsplit(":", 1)[1]) for line in text.splitlines() if " listening " in line]
        assert len(ports) == 2, text
        for port in ports:                  # from this host's network: nothing listens there
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        # The worker is the process the launcher started (entering the namespace execs, keeping the pid), in a
        # network namespace other than the launcher's.
        pids = [int(line.split()[3]) for line in text.splitlines() if " listening " in line]
        for pid in pids:
            assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink(f"/proc/{launcher.pid}/ns/net")
            assert os.getsid(pid) == pid    # its own session, as before: the launcher's stop reaches its group
        go.touch()
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
            launcher.wait()
    assert launcher.returncode == 0, err
    assert "open to every host" not in err


def test_a_command_naming_a_url_is_refused_before_any_worker_starts(tmp_path):
    marker = tmp_path / "started"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w')", "--data", "gs://bucket/export"]
    r = subprocess.run([*HARNESS, "launch", "local", "--workers", "2", "--", *cmd], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("harness launch local: ConfigError: gs://bucket/export: the workers run in a private "
                               "network namespace"), r.stderr
    assert "pass --network host" in r.stderr and not marker.exists()
    with pytest.raises(ConfigError, match="--network must be one of private, host"):
        run_local(["true"], workers=1, network="bridge")

    r = subprocess.run([*HARNESS, "launch", "local", "--workers", "2", "--network", "host", "--", *cmd],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and marker.exists(), r.stderr
    note = r.stderr.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("harness launch local: --network host: the workers' TCP ports "), note


def test_where_no_namespace_can_be_made_the_launcher_says_so_with_the_ports():
    """Inside a user namespace that maps no user (`unshare --user`), unshare(2) is refused: the workers run in the
    host's network and the launcher says so once, naming the kernel's reason and both ports."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--user", "true"]).returncode != 0:
        pytest.skip("`unshare --user` is not available here (util-linux, user namespaces)")
    print_port = "import json, os; c = json.loads(os.environ['TF_CONFIG']); print(c['cluster']['worker'][c['task']['index']])"
    r = subprocess.run(["unshare", "--user", "--", *HARNESS, "launch", "local", "--workers", "2", "--",
                        sys.executable, "-c", print_port], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stderr
    ports = sorted(line.rsplit(":", 1)[1] for line in r.stdout.splitlines())
    note = r.stderr.strip().splitlines()
    assert len(note) == 1, note
    assert note[0].startswith("harness launch local: no private network namespace can be made here "
                              "(unshare(CLONE_NEWNET): Operation not permitted; with a user namespace: "
                              "Operation not permitted): the workers' TCP ports "), note
    assert len(ports) == 2 and all(p in note[0] for p in ports), (ports, note)
