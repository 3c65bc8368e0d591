"""The listening sockets of every mode are the inventory's, no more and no fewer (issue 24, item 1).

Each test runs one mode (or one run that two modes share) briefly on a small synthetic table export (one epoch, 2
workers or ranks at most), polls the sockets of the run's process trees with psutil (`ports_observer.observe`) until
it ends, traces every listen(2) of those processes with strace (`ports_observer.traced`: Gloo's listeners are open for
less than one poll, so a poll alone sees them by chance), and compares all it saw with `harness.ports.INVENTORY`: a
socket no row describes fails the test with what it found (so a new listener cannot appear unnoticed), and so does
a row of the mode that no socket matched (a stale row) (`ports_support.watch`, `check`). `harness launch local`'s
modes run on a host of the bed, watched in the same way: tests/cluster/test_local_isolation.py.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
from ports_support import check, watch

from harness import ports
import ports_observer
from harness.launch.local import free_ports
from harness.launch.mpi import beside_python
from harness.profile.trace import tensorboard_command

BIN = pathlib.Path(sys.executable).parent
CLI = [sys.executable, "-m", "harness.cli"]
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
           CUDA_VISIBLE_DEVICES="", HARNESS_WORKER_WAIT_S="60",
           PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    from harness.data.export import synth
    folder = tmp_path_factory.mktemp("table")
    synth.write_table_export(str(folder), prefix="points", shards=2, records=64, seed=3)
    return folder


def _train(table, output, *flags) -> list:
    return [*CLI, "train", "--data", str(table), "--label", "class", "--epochs", "1", "--global-batch-size", "16",
            "--output", str(output), *flags]


# --- the modes ------------------------------------------------------------------------------------------------------
def test_single_process_train_listens_on_nothing_and_profile_opens_no_profiler_server(table, tmp_path):
    """One run with --profile (its 4 steps hold the default trace window, steps 3-4): a single-process `harness
    train` does all it does without --profile, and tf.profiler besides; no socket, as either mode's rows say."""
    sockets = watch([(_train(table, tmp_path / "run", "--profile"), ENV)], tmp_path)
    check(ports.TRAIN, sockets)
    check(ports.PROFILE, sockets)
    assert list((tmp_path / "run" / "tensorboard").rglob("*.xplane.pb")), "tf.profiler traced no step"


# `harness launch local` (--network private and host) and the TF_CONFIG (MWMS) mode (workers started with TF_CONFIG, as
# the host run's are): tests/cluster/test_local_isolation.py, whose two runs on a host of the bed, while another host
# tries their ports, are watched and checked against the inventory as these are (ports_support: one run per network,
# not one for each test).


def _horovod_train(table, tmp_path):
    return ["--", *_train(table, tmp_path / "run", "--backend", "horovod")]


@pytest.mark.skipif(not shutil.which("horovodrun", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"),
                    reason="no horovodrun (Horovod not installed)")
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_launch_horovod(table, tmp_path, controller):
    if controller == "mpi" and not shutil.which("mpirun"):
        pytest.skip("no mpirun (Open MPI not installed)")
    cmd = [*CLI, "launch", "horovod", "--np", "2", "--controller", controller, *_horovod_train(table, tmp_path)]
    check(ports.HOROVOD_GLOO if controller == "gloo" else ports.HOROVOD_MPI, watch([(cmd, ENV)], tmp_path))


@pytest.mark.skipif(not shutil.which("mpirun"), reason="no mpirun (Open MPI not installed)")
def test_launch_mpi(table, tmp_path):
    cmd = [*CLI, "launch", "mpi", "--np", "2", *_horovod_train(table, tmp_path)]
    check(ports.MPI, watch([(cmd, ENV)], tmp_path))


def test_data_service(table, tmp_path):
    port = free_ports(1)[0]
    servers = [([*CLI, "data-service", "dispatcher", "--port", port], ENV),
               ([*CLI, "data-service", "worker", "--dispatcher", f"localhost:{port}"], ENV)]
    run = _train(table, tmp_path / "run", "--data-service", f"grpc://localhost:{port}", "--strategy", "single")
    check(ports.DATA_SERVICE, watch([(run, ENV)], tmp_path, servers=servers))


def test_printed_tensorboard_line(tmp_path):
    line = tensorboard_command(str(tmp_path / "tensorboard")).split()
    line[0] = beside_python("tensorboard")
    if not os.path.exists(line[0]):
        pytest.skip("no tensorboard beside this Python (the `profile` extra)")
    first = []   # when the first socket was seen: TensorBoard and its data server start one after the other

    def settled(seen):
        first[:] = first or ([time.monotonic()] if seen else [])
        return bool(first) and time.monotonic() - first[0] > 10

    sockets = watch([(line, ENV)], tmp_path, until=settled, timeout=120)
    check(ports.TENSORBOARD, sockets)


# --- the comparison itself ------------------------------------------------------------------------------------------
def test_an_unlisted_listener_is_named():
    extra = ports_observer.Socket(7, ports.WORKER, "0.0.0.0", 40000)
    assert ports_observer.compare(ports.TRAIN, [extra]) == ([extra], [])
    tf = ports_observer.Socket(7, ports.WORKER, "::", 40001, frozenset({40001}))
    assert ports_observer.compare(ports.TF_CONFIG_MODE, [tf]) == ([], [])
    assert ports_observer.compare(ports.TF_CONFIG_MODE, [tf, ports_observer.Socket(7, ports.WORKER, "::", 40002, tf.told)]) == \
        ([ports_observer.Socket(7, ports.WORKER, "::", 40002, tf.told)], [])
    assert ports_observer.compare(ports.TF_CONFIG_MODE, []) == ([], ports.rows(ports.TF_CONFIG_MODE))


# --- item 4: what the printed lines say, and the pin they give ------------------------------------------------------
@pytest.mark.skipif(not shutil.which("mpirun"), reason="no mpirun (Open MPI not installed)")
def test_open_mpi_pin_puts_every_listener_on_all_interfaces_in_the_range(tmp_path):
    first, count = free_ports(1)[0], 20
    pin = " ".join(ports.open_mpi_pin(first, count))
    script = "from mpi4py import MPI; import time; MPI.COMM_WORLD.barrier(); time.sleep(3)"
    cmd = [*CLI, "launch", "mpi", "--np", "2", "--mpirun-args", pin, "--", sys.executable, "-c", script]
    sockets = watch([(cmd, ENV)], tmp_path, timeout=120)
    wide = sorted({(s.process, s.port) for s in sockets if ports_observer.address_class(s.ip) == ports.ALL})
    assert {p for p, _ in wide} == {ports.MPIRUN, ports.WORKER}, sockets
    assert all(first <= port < first + count for _, port in wide), (first, wide)
    assert (ports.MPIRUN, first) in wide
    rest = [s for s in sockets if ports_observer.address_class(s.ip) != ports.ALL]
    assert all((s.process, ports_observer.address_class(s.ip)) in {(ports.MPIRUN, ports.LOOPBACK),
                                                          (ports.WORKER, ports.INTERFACE)} for s in rest), rest


@pytest.mark.parametrize("launcher", [["mpi"], ["horovod", "--controller", "gloo"], ["horovod", "--controller", "mpi"]])
def test_printed_line_names_the_ports_between_the_hosts(launcher):
    cmd = [*CLI, "launch", *launcher, "--np", "2", "-H", "node1:1,node2:1", "--dry-run", "--",
           "harness", "train", "--backend", "horovod", "--data", "d"]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    note = [line for line in r.stderr.splitlines() if line.startswith("#")]
    assert note[0].startswith("# ports between the job's hosts (node1, node2), TCP both ways; no other host"), note
    text = "\n".join(note)
    assert "ssh (22" in text and "NCCL" in text
    if launcher == ["horovod", "--controller", "gloo"]:
        assert "Gloo rendezvous" in text and "cannot" in text and "-mca" not in text
    else:
        assert " ".join(ports.open_mpi_pin(50000, 200)) in text
    assert r.stdout.split()[0].endswith(launcher[0] == "mpi" and "mpirun" or "horovodrun")


def test_traced_names_each_listener_by_its_process(tmp_path):
    """`ports_observer.traced` on strace -ff files written by hand: a thread's listen is its process's, a forked child
    without an execve of its own has its parent's command, TF_CONFIG from the execve's environment gives the told
    port, a failed call is left out and an undecoded one (another namespace) is returned apart."""
    tf_config = '{\\"cluster\\": {\\"worker\\": [\\"localhost:2222\\", \\"localhost:2223\\"]}, ' \
                '\\"task\\": {\\"type\\": \\"worker\\", \\"index\\": 1}}'
    files = {
        100: ['1.000001 execve("/usr/bin/horovodrun", ["horovodrun", "-np", "2"], ["HOME=/root"]) = 0',
              '1.100000 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|SIGCHLD, child_tidptr=0x7f) = 200',
              '1.200000 clone3({flags=CLONE_VM|CLONE_THREAD|CLONE_SETTLS, child_tid=0x7f} => {parent_tid=[101]}, '
              '88) = 101'],
        101: ['1.300000 listen(3<TCP:[0.0.0.0:29503]>, 5) = 0'],
        200: ['1.400000 execve("/bin/python", ["python", "-m", "harness.cli", "train", "--data", "a\\\\b"], '
              f'["TF_CONFIG={tf_config}", "X=1"]) = 0',
              '1.500000 vfork() = 300',
              '1.600000 listen(7<TCPv6:[[::]:2223]>, 4096) = 0',
              '1.700000 listen(8<TCP:[127.0.0.1:40000]>, 1) = -1 EADDRINUSE (Address already in use)',
              '1.800000 listen(9<TCP:[16919]>, 64) = 0'],
        300: ['1.900000 listen(4<TCP:[127.0.0.1:41000]>, 1024) = 0'],
    }
    for tid, lines in files.items():
        (tmp_path / f"t.{tid}").write_text("\n".join(lines) + "\n")
    (tmp_path / "t.log").write_text("not a thread's file\n")
    sockets, undecoded = ports_observer.traced(str(tmp_path / "t"))
    assert [(s.pid, s.process, s.ip, s.port) for s in sockets] == [
        (100, ports.HOROVODRUN, "0.0.0.0", 29503), (200, ports.WORKER, "::", 2223),
        (300, ports.WORKER, "127.0.0.1", 41000)]
    assert sockets[1].told == {2223} and sockets[2].told == {2223}
    assert sockets[1].command == "python -m harness.cli train --data a\\b"
    assert undecoded == [(200, "9<TCP:[16919]>, 64")]
    assert ports_observer.compare(ports.HOROVOD_GLOO, sockets[:1] + sockets[2:]) == ([], [])
