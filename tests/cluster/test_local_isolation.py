"""`harness launch local` leaves no port reachable from another host (issue 24, item 2), proved with a stranger.

On a bed of two hosts, host0 runs `harness launch local --workers 2 -- harness train ...` (MultiWorkerMirrored
from TF_CONFIG, whose gRPC servers listen on every interface); while it trains, host1 (the stranger) connects to
every TCP port the run's processes listen on, at host0's address, and host0 itself tries them at 127.0.0.1 from
outside the run. With the default private network every try is refused and the run trains to its end; with
`--network host` the stranger gets in (what the default closes), and the launcher said so, naming the ports."""
import os
import pathlib
import sys
import time

import psutil

import procs
from harness.data import synth

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 300
PROBE = """
import socket, sys
for port in map(int, sys.argv[2:]):
    try:
        socket.create_connection((sys.argv[1], port), timeout=5).close()
        print(port, "open")
    except OSError as e:
        print(port, type(e).__name__)
"""


def _env() -> dict:
    env = procs.outer_free()
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _listening(root: psutil.Process) -> dict[int, set[int]]:
    """{pid: TCP ports it listens on} for root's descendants, each read in its own network namespace."""
    found = {}
    for p in root.children(recursive=True):
        ports = {port for _, port in procs.listening(p.pid)}
        if ports:
            found[p.pid] = ports
    return found


def _probe(host, address: str, ports) -> dict[int, str]:
    out = host.run([sys.executable, "-c", PROBE, address, *map(str, sorted(ports))], timeout=60, check=True).stdout
    return {int(port): result for port, result in (line.split() for line in out.splitlines())}


def _launch_and_probe(bed, data, output, logs: pathlib.Path, *network):
    """Start the launch on host0, wait until two processes of the run listen, probe their ports from host1 (the
    bed address of host0) and from host0 (127.0.0.1, outside the run), then wait for the run's end.

    Returns (exit code, launcher output, {port: result from host1}, {port: result from host0's loopback})."""
    host0, stranger = bed.hosts
    argv = [sys.executable, "-m", "harness.cli", "launch", "local", "--workers", "2", "--timeout", "240", *network,
            "--", sys.executable, "-m", "harness.cli", "train", "--data", str(data), "--output", str(output),
            "--epochs", "3", "--per-replica-batch-size", "8"]
    with open(logs, "w") as log:
        run = host0.popen(argv, env=_env(), stdout=log, stderr=log, cwd=str(ROOT), start_new_session=True)
        try:
            launcher = psutil.Process(run.pid)
            deadline = time.monotonic() + RUN_TIMEOUT_S
            listening = {}
            while run.poll() is None and len(listening) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)   # each read costs ~12 ms of CPU per process (its namespace's TCP tables)
                listening = _listening(launcher)
            assert len(listening) >= 2, f"the run's workers never listened (exit {run.poll()})\n{logs.read_text()}"
            ports = set().union(*listening.values())
            from_stranger = _probe(stranger, host0.address, ports)
            from_host = _probe(host0, "127.0.0.1", ports)
            run.wait(max(1.0, deadline - time.monotonic()))
        finally:
            if run.poll() is None:
                os.killpg(run.pid, 9)
                run.wait(30)
    return run.returncode, logs.read_text(), from_stranger, from_host


def test_a_stranger_reaches_no_port_of_a_local_run_which_trains_to_its_end(make_bed, tmp_path):
    bed = make_bed(2)
    data = tmp_path / "points"
    synth.write_table_export(str(data), prefix="points", shards=2, records=2 * 64, seed=5)

    code, text, stranger, host = _launch_and_probe(bed, data, tmp_path / "private", tmp_path / "private.log")
    assert code == 0, text[-4000:]
    assert "open to every host" not in text                   # the launcher's note of open ports: none here
    assert "[worker 0] epoch 3/3 step 24" in text and "[worker 0] summary:" in text, text[-3000:]   # the chief reports
    assert (tmp_path / "private" / "model.keras").is_file()
    assert stranger and set(stranger.values()) == {"ConnectionRefusedError"}, stranger
    assert set(host.values()) == {"ConnectionRefusedError"}, host

    # The same run in host0's network: the stranger gets in, which is what the default closes.
    code, text, stranger, host = _launch_and_probe(bed, data, tmp_path / "host", tmp_path / "host.log",
                                                   "--network", "host")
    assert code == 0, text[-4000:]
    opened = sorted(p for p, r in stranger.items() if r == "open")
    assert len(opened) >= 2, stranger                       # both workers' gRPC ports, from the other host
    line = next(ln for ln in text.splitlines() if ln.startswith("harness launch local: --network host:"))
    assert all(str(p) in line for p in opened), (line, opened)
