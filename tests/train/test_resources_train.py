"""`harness train` sizes its input pipeline by the resources its process is given (harness/distribute/resources.py):
real processes under `taskset -c 0`, in a cgroup with a CPU quota and a memory limit (where this machine lets a
test make one), and as 2 workers of `harness launch local` sharing one host."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import uuid

import pytest

from harness.data.input import stages
from harness.data.export import synth
from harness.distribute import resources

CLI = [sys.executable, "-m", "harness.cli"]
SHARDS = 4  # more files than CPUs allowed: the parallel reads show the CPU count
LIMIT = 3 * 2 ** 30  # the real cgroup's memory limit: room for TensorFlow, far below the host's memory


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    folder = tmp_path_factory.mktemp("points")
    synth.write_table_export(str(folder), prefix="points", shards=SHARDS, records=128, seed=5)
    return folder


def _train(points, out, prefix=(), timeout=300):
    cmd = [*prefix, *CLI, "train", "--data", points, "--label", "class", "--epochs", "1",
           "--per-replica-batch-size", "32", "--output", out]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout, json.loads((pathlib.Path(out) / "summary.json").read_text())


def _resource_lines(stdout):
    return [line for line in stdout.splitlines() if "resources: " in line]


def test_one_cpu_under_taskset_reads_one_file_at_once(points, tmp_path):
    if len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None:
        pytest.skip("needs 2 allowed CPUs and taskset")
    stdout, summary = _train(points, tmp_path / "run", prefix=["taskset", "-c", "0"])
    lines = _resource_lines(stdout)
    assert len(lines) == 1 and lines[0].startswith(f"resources: 1 CPU (affinity 1 of {os.cpu_count()} cores"), lines
    facts = summary["facts"]
    assert (facts["cpu_count"], facts["parallel_reads"], facts["resources"]["affinity_cpus"]) == (1, 1, 1)
    assert "1 file(s) at once" in facts["input_pipeline"]
    assert "tf.data autotuning within 1 CPU" in facts["input_pipeline"]


def test_two_local_workers_each_get_half(points, tmp_path):
    out = tmp_path / "run"
    cmd = [*CLI, "launch", "local", "--workers", "2", "--", *CLI, "train", "--data", points, "--label", "class",
           "--epochs", "1", "--per-replica-batch-size", "32", "--output", out]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = _resource_lines(r.stdout)
    assert sorted(line.split("]")[0] for line in lines) == ["[worker 0", "[worker 1"], lines
    assert all("shared by 2 local workers" in line for line in lines), lines
    chief = json.loads((out / "summary.json").read_text())["facts"]["resources"]
    process_memory = min(chief["host_available_bytes"], chief["cgroup_memory_free_bytes"] or float("inf"))
    process_cpus = min(chief["affinity_cpus"], chief["host_cpus"])
    assert chief["local_size"] == 2
    assert chief["memory_bytes"] == process_memory // 2
    assert chief["cpus"] == max(1, process_cpus // 2)


# --- a real cgroup -------------------------------------------------------------------------------------------------
def _cgroup_mounts():
    """`{"v1": {controller: mount point}, "v2": mount point or None}` of this machine."""
    found = {"v1": {}, "v2": None}
    with open("/proc/self/mountinfo") as f:
        for fstype, root, point, options in resources.parse_mountinfo(f.read()):
            if fstype == "cgroup2" and found["v2"] is None:
                found["v2"] = point
            for name in ("cpu", "memory"):
                if fstype == "cgroup" and name in options and root == "/":
                    found["v1"].setdefault(name, point)
    return found


@pytest.fixture
def limited_cgroup():
    """A fresh cgroup limited to 1 CPU (a quota of 100000 us per 100000 us period) and LIMIT bytes of memory;
    yields the files a child writes its pid to (one per controller), and removes the cgroup after. Skipped, with
    the reason, where it cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    name, made, procs = f"hxres-{uuid.uuid4().hex[:8]}", [], []
    mounts = _cgroup_mounts()
    try:
        if {"cpu", "memory"} <= set(mounts["v1"]):
            for controller, files in (("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}),
                                      ("memory", {"memory.limit_in_bytes": str(LIMIT)})):
                d = pathlib.Path(mounts["v1"][controller]) / name
                d.mkdir()
                made.append(d)
                for file, value in files.items():
                    (d / file).write_text(value)
                procs.append(d / "cgroup.procs")
        elif mounts["v2"]:
            d = pathlib.Path(mounts["v2"]) / name
            d.mkdir()
            made.append(d)
            if not {"cpu", "memory"} <= set((d / "cgroup.controllers").read_text().split()):
                pytest.skip(f"cgroup v2 at {mounts['v2']} does not delegate the cpu and memory controllers")
            (d / "cpu.max").write_text("100000 100000")
            (d / "memory.max").write_text(str(LIMIT))
            procs.append(d / "cgroup.procs")
        else:
            pytest.skip("no cgroup v1 cpu and memory hierarchies and no cgroup v2 mount")
    except OSError as e:
        for d in reversed(made):
            d.rmdir()
        pytest.skip(f"cannot make a cgroup here: {e}")
    try:
        yield procs
    finally:
        for d in reversed(made):
            d.rmdir()  # the child has exited: the cgroup is empty


def test_a_real_cgroup_quota_and_memory_limit_size_the_pipeline(points, tmp_path, limited_cgroup):
    enter = "; ".join(f"echo $$ > {p}" for p in limited_cgroup)
    stdout, summary = _train(points, tmp_path / "run", prefix=["sh", "-c", f'{enter}; exec "$@"', "sh"])
    facts = summary["facts"]
    r = facts["resources"]
    assert r["cgroup_cpus"] == 1.0 and r["cpus"] == 1 and facts["parallel_reads"] == 1
    assert r["cgroup_memory_limit_bytes"] == LIMIT
    assert 0 < r["memory_bytes"] == r["cgroup_memory_free_bytes"] < LIMIT
    assert "cgroup quota 1 CPU" in _resource_lines(stdout)[0] and "cgroup memory limit 3.00 GiB" in stdout
    # the cache decision measured the cgroup's memory: its reason names this worker's share, not the host's
    assert f"of the {stages._gb(r['memory_bytes'])} available memory" in facts["input_pipeline"]
