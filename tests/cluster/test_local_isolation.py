"""`harness launch local` leaves no port reachable from another host (issue 24, item 2), proved with a stranger; the
same runs are the inventory's runs of its modes (issue 24, item 1: tests/test_ports_inventory.py).

On a bed of two hosts, host0 runs `harness launch local --workers 2 -- harness train ...` (MultiWorkerMirrored
from TF_CONFIG, whose gRPC servers listen on every interface); while it runs, host1 (the stranger) connects to
every TCP port the run's processes listen on, at host0's address, and host0 itself tries them at 127.0.0.1 from
outside the run. With the default private network every try is refused and the run trains to its end; with
`--network host` the stranger gets in (what the default closes), and the launcher said so, naming the ports.

Each worker is `harness train` held once its server listens until the probes are done (scripts/gated_train.py): a
worker that trained to its end before the probe reached its port (closed: refused whatever the network) would
otherwise read as a port the network closes. The probe waits for both workers to reach the gate, not for two
listening processes: a worker's port is open while `wait_for_workers` awaits its peers, then closed for a moment
before TensorFlow's server binds it, and a probe in that moment found one of the two ports refused with --network host
(CI, stop 71).

Each run is also watched as tests/test_ports_inventory.py watches a mode (`ports_support.watch`: every listen(2)
traced, the process tree's sockets polled until it ends) and its sockets compared with `harness.ports.INVENTORY`:
the private run's with `harness launch local`'s rows, the host run's with `--network host`'s and with those of the
TF_CONFIG (MWMS) mode (its workers are `harness train` processes with the TF_CONFIG of `worker_environments`, in
their host's network, as a cluster that sets TF_CONFIG starts them)."""
import os
import pathlib
import shutil
import sys

import procs
from ports_support import check, watch

from harness import ports
from harness.data.export import synth

ROOT = pathlib.Path(__file__).resolve().parents[2]
GATED_TRAIN = pathlib.Path(__file__).resolve().parent / "scripts" / "gated_train.py"
PROBE = """
import socket, sys
for port in map(int, sys.argv[2:]):
    try:
        socket.create_connection((sys.argv[1], port), timeout=5).close()
        print(port, "open")
    except OSError as e:
        print(port, type(e).__name__)
"""


def _env(gate: pathlib.Path) -> dict:
    env = procs.outer_free()
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", HARNESS_TEST_GATE=str(gate),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _probe(host, address: str, ports) -> dict[int, str]:
    out = host.run([sys.executable, "-c", PROBE, address, *map(str, sorted(ports))], timeout=60, check=True).stdout
    return {int(port): result for port, result in (line.split() for line in out.splitlines())}


def _launch_and_probe(bed, data, output, folder: pathlib.Path, network: str):
    """Run the launch on host0, watched (`ports_support.watch`, its log `folder/0.log`); once both workers have built
    their strategy (each then held by its gate, its gRPC server listening) and a poll has seen their ports, probe their ports from host1 (the bed
    address of host0) and from host0 (127.0.0.1, outside the run), then open the gate; the run then trains to its
    end (watch fails the test if it exits non-zero).

    Returns (the sockets the run listened on, launcher output, {port: result from host1}, {port: result from
    host0's loopback})."""
    host0, stranger = bed.hosts
    folder.mkdir()
    gate = folder / "gate"
    argv = [sys.executable, "-m", "harness.cli", "launch", "local", "--workers", "2", "--timeout", "240",
            "--network", network, "--", sys.executable, str(GATED_TRAIN), "--data", str(data), "--output", str(output),
            "--epochs", "1", "--per-replica-batch-size", "8"]
    probed = {}

    def probe(seen):
        listening = [s for s in seen if not s.udp]
        held = len(list(folder.glob("gate.*")))   # workers whose strategy is built (gated_train: their servers listen)
        if not probed and held >= 2 and len({s.port for s in listening}) >= 2:
            ports_ = {s.port for s in listening}
            probed["stranger"] = _probe(stranger, host0.address, ports_)
            probed["host"] = _probe(host0, "127.0.0.1", ports_)
            gate.touch()

    sockets = watch([(argv, _env(gate))], folder, enter=[*host0.enter_argv(), shutil.which("env"), "-C", str(ROOT)],
                    on_poll=probe)
    text = (folder / "0.log").read_text()
    assert probed, f"the run's workers never listened\n{text[-3000:]}"
    return sockets, text, probed["stranger"], probed["host"]


def test_a_stranger_reaches_no_port_of_a_local_run_which_trains_to_its_end(make_bed, tmp_path):
    bed = make_bed(2)
    data = tmp_path / "points"
    synth.write_table_export(str(data), prefix="points", shards=2, records=64, seed=5)

    sockets, text, stranger, host = _launch_and_probe(bed, data, tmp_path / "private", tmp_path / "p", "private")
    assert "open to every host" not in text                   # the launcher's note of open ports: none here
    assert "[worker 0] epoch 1/1 step 4" in text and "[worker 0] summary:" in text, text[-3000:]   # the chief reports
    assert (tmp_path / "private" / "model.keras").is_file()
    assert stranger and set(stranger.values()) == {"ConnectionRefusedError"}, stranger
    assert set(host.values()) == {"ConnectionRefusedError"}, host
    check(ports.LOCAL, sockets)

    # The same run in host0's network: the stranger gets in, which is what the default closes.
    sockets, text, stranger, host = _launch_and_probe(bed, data, tmp_path / "host", tmp_path / "h", "host")
    opened = sorted(p for p, r in stranger.items() if r == "open")
    assert len(opened) >= 2, stranger                       # both workers' gRPC ports, from the other host
    line = next(ln for ln in text.splitlines() if ln.startswith("harness launch local: --network host:"))
    assert all(str(p) in line for p in opened), (line, opened)
    assert "[worker 0] summary:" in text, text[-3000:]
    check(ports.LOCAL_HOST, sockets)
    check(ports.TF_CONFIG_MODE, sockets)
