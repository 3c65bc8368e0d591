"""harness/distribute/resources.py: the CPUs and memory a worker may use, read from cgroup trees the tests write
(v2 and v1, limits on an ancestor, none set), shared among the workers of a host; and the local size a
WorkerContext gives. Real processes under `taskset` and in a real cgroup: tests/train/test_resources_train.py."""
import json
import os
import subprocess
import sys

import pytest

from harness.distribute import resources
from harness.distribute.context import WorkerContext

GIB = 2 ** 30
HOST_AVAILABLE = 100 * GIB  # more than any limit below: the cgroup's figure must win


def _write(directory, **files):
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("__", ".")).write_text(text)
    return directory


def _detect(tmp_path, proc_cgroup: str, mountinfo: str, local_size=1):
    (tmp_path / "cgroup").write_text(proc_cgroup)
    (tmp_path / "mountinfo").write_text(mountinfo)
    return resources.detect(local_size, proc_cgroup=str(tmp_path / "cgroup"), mountinfo=str(tmp_path / "mountinfo"),
                            host_available_bytes=HOST_AVAILABLE)


def _v2_tree(tmp_path):
    """A pod's cgroup v2 tree: the pod limits memory to 8 GiB and 1.5 CPUs, the container (the process's own
    cgroup) sets no limit of its own."""
    mnt = tmp_path / "unified"
    _write(mnt / "kubepods" / "pod1", cpu__max="150000 100000\n", memory__max=f"{8 * GIB}\n",
           memory__current=f"{3 * GIB}\n", memory__stat=f"anon {2 * GIB}\ninactive_file {GIB}\nactive_file 0\n")
    _write(mnt / "kubepods" / "pod1" / "c1", cpu__max="max 100000\n", memory__max="max\n",
           memory__current=f"{3 * GIB}\n")
    mountinfo = f"30 23 0:26 / {mnt} rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n"
    return "0::/kubepods/pod1/c1\n", mountinfo


def test_cgroup_v2_limits_of_an_ancestor_bind_the_process(tmp_path):
    found = _detect(tmp_path, *_v2_tree(tmp_path))
    affinity = len(os.sched_getaffinity(0))
    assert found.cgroup_cpus == 1.5
    assert found.cpus == min(affinity, 2)  # 1.5 CPUs rounded up
    assert found.cgroup_memory_limit_bytes == 8 * GIB
    # 3 GiB used of which 1 GiB is reclaimable page cache (inactive_file): 8 - (3 - 1) GiB left.
    assert found.cgroup_memory_free_bytes == found.memory_bytes == 6 * GIB


def test_cgroup_v2_half_a_cpu_is_one(tmp_path):
    proc, mountinfo = _v2_tree(tmp_path)
    (tmp_path / "unified" / "kubepods" / "pod1" / "c1" / "cpu.max").write_text("50000 100000\n")
    found = _detect(tmp_path, proc, mountinfo)
    assert (found.cgroup_cpus, found.cpus) == (0.5, 1)


def test_cgroup_v1_quota_and_limit_at_a_namespaced_mount(tmp_path):
    """Docker on cgroup v1 without a cgroup namespace: /proc/self/cgroup names /docker/<id>, and the mount's
    root is that same cgroup, so the files are at the mount point itself."""
    cpu, mem = tmp_path / "cpu,cpuacct", tmp_path / "memory"
    _write(cpu, cpu__cfs_quota_us="300000\n", cpu__cfs_period_us="100000\n")
    _write(mem, memory__limit_in_bytes=f"{GIB}\n", memory__usage_in_bytes=f"{GIB // 4}\n",
           memory__stat="cache 0\ntotal_inactive_file 0\n")
    mountinfo = (f"40 31 0:33 /docker/abc {cpu} rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
                 f"41 31 0:34 /docker/abc {mem} rw,nosuid - cgroup cgroup rw,memory\n")
    found = _detect(tmp_path, "12:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n",
                    mountinfo)
    assert found.cgroup_cpus == 3.0
    assert found.cpus == min(len(os.sched_getaffinity(0)), os.cpu_count(), 3)
    assert (found.cgroup_memory_limit_bytes, found.memory_bytes) == (GIB, GIB - GIB // 4)


def test_cgroup_v1_nested_cgroup_under_the_mount_root(tmp_path):
    mem = tmp_path / "memory"
    _write(mem, memory__limit_in_bytes="9223372036854771712\n")  # the root: v1's "no limit"
    _write(mem / "batch", memory__limit_in_bytes=f"{2 * GIB}\n", memory__usage_in_bytes="0\n")
    _write(mem / "batch" / "job", memory__limit_in_bytes="9223372036854771712\n")
    found = _detect(tmp_path, "4:memory:/batch/job\n", f"41 31 0:34 / {mem} rw - cgroup cgroup rw,memory\n")
    assert (found.cgroup_memory_limit_bytes, found.memory_bytes) == (2 * GIB, 2 * GIB)
    assert found.cgroup_cpus is None


@pytest.mark.parametrize("files", [
    dict(cpu__max="max 100000\n", memory__max="max\n", memory__current=f"{GIB}\n"),  # set to "no limit"
    {},  # no controller files at all (not enabled)
])
def test_no_limit_falls_back_to_the_host(tmp_path, files):
    mnt = _write(tmp_path / "unified" / "user.slice", **files)
    found = _detect(tmp_path, "0::/user.slice\n", f"30 23 0:26 / {mnt.parent} rw - cgroup2 cgroup2 rw\n")
    assert (found.cgroup_cpus, found.cgroup_memory_limit_bytes, found.cgroup_memory_free_bytes) == (None,) * 3
    assert found.cpus == min(len(os.sched_getaffinity(0)), os.cpu_count())
    assert found.memory_bytes == HOST_AVAILABLE


def test_no_cgroup_files_readable_falls_back_to_the_host(tmp_path):
    found = resources.detect(1, proc_cgroup=str(tmp_path / "absent"), mountinfo=str(tmp_path / "absent"),
                             host_available_bytes=HOST_AVAILABLE)
    assert (found.cpus, found.memory_bytes) == (min(len(os.sched_getaffinity(0)), os.cpu_count()), HOST_AVAILABLE)


def test_shared_by_the_local_workers(tmp_path):
    alone, shared = (_detect(tmp_path, *_v2_tree(tmp_path), local_size=n) for n in (1, 2))
    assert shared.memory_bytes == alone.memory_bytes // 2 == 3 * GIB
    assert shared.cpus == max(1, alone.cpus // 2)
    assert "shared by 2 local workers" in shared.describe() and "shared by" not in alone.describe()
    three = resources.combine(local_size=3, host_cpus=16, affinity_cpus=12, cgroup_cpus=None,
                              host_available_bytes=9 * GIB)
    assert (three.cpus, three.memory_bytes) == (4, 3 * GIB)
    with pytest.raises(ValueError, match="local_size must be >= 1"):
        resources.combine(local_size=0, host_cpus=1, affinity_cpus=1, cgroup_cpus=None, host_available_bytes=1)


def test_describe_names_every_figure():
    r = resources.combine(local_size=2, host_cpus=2, affinity_cpus=1, cgroup_cpus=None,
                          host_available_bytes=20 * GIB, cgroup_memory=(8 * GIB, int(6.4 * GIB)))
    assert r.describe() == ("1 CPU (affinity 1 of 2 cores, shared by 2 local workers), 3.20 GiB memory (cgroup "
                            "memory limit 8.00 GiB, 6.40 GiB free, shared by 2 local workers)")


def _tf_config(workers, index):
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})}


def test_local_size_from_tf_config_and_launchers():
    # `harness launch local --workers 2`: every worker on localhost.
    assert WorkerContext.from_environment(_tf_config(["localhost:1", "localhost:2"], 1)).local_size == 2
    three = ["host-a:2222", "host-a:2223", "host-b:2222"]
    assert [WorkerContext.from_environment(_tf_config(three, i)).local_size for i in range(3)] == [2, 2, 1]
    mpi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert WorkerContext.from_environment(mpi).local_size == 2
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}  # no local size variable
    assert WorkerContext.from_environment(slurm).local_size == 1
    assert WorkerContext.from_environment({}).local_size == 1
    import types
    hvd = types.SimpleNamespace(rank=lambda: 3, size=lambda: 4, local_rank=lambda: 1, local_size=lambda: 2)
    assert WorkerContext.from_horovod(hvd).local_size == 2


def test_the_pipeline_default_follows_the_affinity_mask_of_a_real_process():
    """A real process under `taskset -c 0` (one CPU allowed) reads one file at once, not one per host core."""
    if len(os.sched_getaffinity(0)) < 2 or not _has_taskset():
        pytest.skip("needs 2 allowed CPUs and taskset")
    code = ("from harness.data.input import stages; from harness.distribute import resources; "
            "print(stages.decide_parallel_reads(['f'] * 8), resources.for_this_process().cpus, "
            "resources.for_this_process().affinity_cpus)")
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["1", "1", "1"]


def _has_taskset() -> bool:
    import shutil
    return shutil.which("taskset") is not None
