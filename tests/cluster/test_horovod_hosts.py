"""Horovod on 2 hosts x 2 slots of the bed, launched by the line `harness launch mpi|horovod --dry-run` prints, run
exactly as printed from host0 (the launcher's host), remote ranks started through the bed's ssh.

Each host also has a `docker0` with the same address on every host (as Docker's bridge has, 172.17.0.1): the
interface flags the launch line carries must keep the ranks' traffic on the hosts' own link (Horovod docs/mpi.rst,
"Hangs due to non-routed network interfaces"). Checked: every record once per epoch (the files of the ranks
disjoint and covering the export, the records summed), equal steps, identical final weights, and rank, local rank
and chief right on each host.
"""
import json
import os
import pathlib
import subprocess
import sys

import procs
import pytest

from harness.data.export import synth

BIN = pathlib.Path(sys.executable).parent
ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 400
DECOY = "172.17.0.1/16"   # the same address on every host, as Docker's default bridge (a bridge too)


@pytest.fixture(scope="module")
def table_export(tmp_path_factory):
    """8 shards x 64 records: 4 ranks x 128 records, per-replica batch 16 -> 8 steps per epoch (one epoch: what is
    checked, every record once, equal steps, identical weights, holds for each)."""
    folder = tmp_path_factory.mktemp("points")
    paths = synth.write_table_export(str(folder), prefix="points", shards=8, records=512, seed=11)
    return folder, sorted(p for p in paths if ".tfrecord" in p)


def _bed_env(bed) -> dict:
    env = procs.outer_free(("HOROVOD_", "OMPI_", "PMIX_"))
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return bed.env(env)


def _add_decoy(bed) -> None:
    for h in bed.hosts:
        for args in (["link", "add", "docker0", "type", "bridge"], ["addr", "add", DECOY, "dev", "docker0"],
                     ["link", "set", "docker0", "up"]):
            subprocess.run(["ip", "-n", h.netns, *args], check=True, capture_output=True)


def _printed_line(bed, env, launcher: str, train: list) -> str:
    out = bed.hosts[0].run([BIN / "harness", "launch", launcher, "--np", "4", "-H", "host0:2,host1:2", "--dry-run",
                            "--", *train], env=env, timeout=60, check=True).stdout
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    return lines[0]


def _run_printed(bed, env, line: str) -> str:
    """The printed line as a user's shell on host0 runs it (`procs.run`: bounded, its group killed on a hang)."""
    return procs.run([*bed.hosts[0].enter_argv(), "/bin/sh", "-c", line], env=env, timeout=RUN_TIMEOUT_S)


def _check(summary: dict, files: list) -> None:
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    # -map-by slot: ranks 0, 1 on host0, ranks 2, 3 on host1; local ranks 0, 1 on each.
    assert [(r["host"], r["local_rank"]) for r in ranks] == [("host0", 0), ("host0", 1), ("host1", 0), ("host1", 1)]
    per_rank = [set(r["files"]) for r in ranks]
    assert sum(map(len, per_rank)) == len(set().union(*per_rank)) and set().union(*per_rank) == set(files)
    assert sum(r["records"] for r in ranks) == 512 and all(r["dropped"] == 0 for r in ranks)
    assert len({r["steps"] for r in ranks}) == 1
    assert len({r["weights_sha256"] for r in ranks} | {summary["weights_sha256"]}) == 1
    assert summary["final_step"] == summary["optimizer_iterations"] == 8
    assert "rank 0/4" in summary["context"] and "chief" in summary["context"]


@pytest.mark.parametrize("launcher", ["mpi", "horovod"])
def test_two_hosts_two_slots_as_printed(make_bed, table_export, tmp_path, launcher):
    bed = make_bed(2)
    _add_decoy(bed)
    env = _bed_env(bed)
    folder, files = table_export
    output = tmp_path / "run"
    train = ["harness", "train", "--backend", "horovod", "--data", str(folder), "--output", str(output),
             "--epochs", "1", "--per-replica-batch-size", "16", "--check-sharding"]
    line = _printed_line(bed, env, launcher, train)
    if launcher == "mpi":
        assert "-mca btl_tcp_if_exclude lo,docker0" in line and "NCCL_SOCKET_IFNAME=^lo,docker0" in line, line
    out = _run_printed(bed, env, line)
    summary = json.loads((output / "summary.json").read_text())
    _check(summary, files)
    # Every rank says where it runs and what it is, on its own host.
    for rank, host, local in ((0, "host0", 0), (1, "host0", 1), (2, "host1", 0), (3, "host1", 1)):
        assert f"rank {rank}/4" in out, out[-3000:]


# A rank: harness's Horovod start (the interface, hvd.init, the ranks' GPUs compared), then a sum over the ranks.
HVD_INIT = """
import os
import harness
import horovod.tensorflow as hvd
import tensorflow as tf
from harness.distribute import horovod
_, context = horovod.init()
total = float(hvd.allreduce(tf.constant(float(context.rank)), op=hvd.Sum))
print("HVD_INIT", context.rank, total, os.environ["HOROVOD_GLOO_IFACE"], flush=True)
"""


def test_hosts_that_name_their_links_differently_join_under_network_interface(make_bed):
    """host1's link is `enp129s0f1`, host0's `eth0`: horovodrun finds no name every host has, and given both
    (`--network-interfaces eth0,enp129s0f1`) it set Gloo's interface to one of them on every rank, so the host
    without it aborted in Gloo's C++ ("Unable to find address for", horovod/horovod#2431). Launched as
    `harness launch horovod --network-interface eth0,enp129s0f1`, each rank takes the name its host has."""
    bed = make_bed(2)
    renamed = bed.hosts[1]
    for args in (["link", "set", "eth0", "down"], ["link", "set", "eth0", "name", "enp129s0f1"],
                 ["link", "set", "enp129s0f1", "up"]):
        subprocess.run(["ip", "-n", renamed.netns, *args], check=True, capture_output=True)
    renamed.interface = "enp129s0f1"
    out = procs.run([*bed.hosts[0].enter_argv(), BIN / "harness", "launch", "horovod", "--np", "2",
                     "-H", "host0:1,host1:1", "--network-interface", "eth0,enp129s0f1", "--",
                     sys.executable, "-c", HVD_INIT], env=_bed_env(bed), timeout=RUN_TIMEOUT_S)
    said = sorted(line.split("HVD_INIT ", 1)[1] for line in out.splitlines() if "HVD_INIT " in line)
    assert said == ["0 1.0 eth0", "1 1.0 enp129s0f1"], out[-3000:]
