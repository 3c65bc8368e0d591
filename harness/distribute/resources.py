"""The CPUs and memory this worker may use, as the kernel limits the process, shared among the workers on its host.

A process may run on fewer CPUs than `os.cpu_count()` and hold less memory than the host has free:

- its CPU affinity mask (`taskset`, `mpirun --bind-to`, Kubernetes' static CPU manager): `os.sched_getaffinity`;
- its cgroup's CPU bandwidth limit: cgroup v2 `cpu.max` ("$MAX $PERIOD", "max" for none), cgroup v1
  `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1 for none); quota / period CPUs, rounded up (a pod's
  `resources.limits.cpu`);
- its cgroup's memory limit: cgroup v2 `memory.max` ("max" for none) less `memory.current`, cgroup v1
  `memory.limit_in_bytes` less `memory.usage_in_bytes` (a pod's `resources.limits.memory`: above it the kernel
  kills the process). Page cache the kernel can reclaim (`inactive_file` of `memory.stat`) is not counted as
  used, as the kubelet counts a container's working set (Kubernetes, "Node-pressure Eviction").

Sources: the kernel's Documentation/admin-guide/cgroup-v2.rst ("cpu.max", "memory.max", "memory.current",
"memory.stat"; /proc/PID/cgroup's "0::$PATH" line), Documentation/scheduler/sched-bwc.rst (cgroup v1
cpu.cfs_quota_us and cpu.cfs_period_us), Documentation/admin-guide/cgroup-v1/memory.rst (memory.limit_in_bytes,
memory.usage_in_bytes) and proc(5) for /proc/PID/mountinfo. A limit set on an ancestor cgroup binds its
descendants too, so every cgroup from the process's own up to the mount's root is read and the smallest limit
wins.

The workers on one host (the local size: `WorkerContext.local_size`) share the host, its cgroup and usually its
affinity mask, so each worker's share is the process's figure divided by the local size (at least 1 CPU). A mask
a launcher gave each worker on its own (`mpirun --bind-to core`) is divided too: that undercounts, never
oversubscribes.

The readers below take file contents and paths, so tests give them a cgroup tree of their own.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping, Optional

PROC_CGROUP = "/proc/self/cgroup"
PROC_MOUNTINFO = "/proc/self/mountinfo"
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit value (9223372036854771712); anything this large
# is no limit.
NO_LIMIT_BYTES = 1 << 62


@dataclasses.dataclass(frozen=True)
class CgroupDirs:
    """Where this process's cgroup controllers are, as directories from the process's own cgroup up to the
    mount's root (the innermost first): `unified` for cgroup v2, `cpu` and `memory` for cgroup v1 (empty when
    that hierarchy is not mounted)."""

    unified: tuple[str, ...] = ()
    cpu: tuple[str, ...] = ()
    memory: tuple[str, ...] = ()


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """`/proc/self/cgroup` as `{controller: path}`: "" for the cgroup v2 line ("0::/path"), else each v1
    controller named on its line ("4:memory:/a", "2:cpu,cpuacct:/b" gives both "cpu" and "cpuacct")."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in (controllers.split(",") if controllers else [""]):
            out[name] = path
    return out


def parse_mountinfo(text: str) -> list[tuple[str, str, str, set]]:
    """The cgroup mounts of `/proc/self/mountinfo` (proc(5)): `(fstype, root, mount point, super options)` each,
    fstype "cgroup2" or "cgroup"; the super options of a v1 mount name its controllers ({"rw", "cpu",
    "cpuacct"})."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        unescape = lambda s: s.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")  # noqa: E731
        mounts.append((tail[0], unescape(fields[3]), unescape(fields[4]), set(tail[2].split(","))))
    return mounts


def _chain(mount_root: str, mount_point: str, path: str) -> tuple[str, ...]:
    """Directories from the cgroup at `path` up to the mount point. A path outside the mount's root (a cgroup
    namespace the mount does not show) gives the mount point alone."""
    inside = mount_root == "/" or path == mount_root or path.startswith(mount_root.rstrip("/") + "/")
    rel = os.path.relpath(path, mount_root) if inside else "."
    parts = [] if rel == "." else rel.split(os.sep)
    return tuple(os.path.join(mount_point, *parts[:i]) for i in range(len(parts), -1, -1))


def cgroup_dirs(proc_cgroup: str, mountinfo: str) -> CgroupDirs:
    """This process's cgroup directories from the texts of `/proc/self/cgroup` and `/proc/self/mountinfo`."""
    paths, found = parse_proc_cgroup(proc_cgroup), {}
    for fstype, root, point, options in parse_mountinfo(mountinfo):
        if fstype == "cgroup2" and "" in paths:
            found.setdefault("unified", _chain(root, point, paths[""]))
        for name in ("cpu", "memory"):
            if fstype == "cgroup" and name in options and name in paths:
                found.setdefault(name, _chain(root, point, paths[name]))
    return CgroupDirs(**found)


def _read(directory: str, name: str) -> Optional[str]:
    try:
        with open(os.path.join(directory, name)) as f:
            return f.read().strip()
    except OSError:  # not there: no such controller at this level (or not enabled)
        return None


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def cgroup_cpu_limit(dirs: CgroupDirs) -> Optional[float]:
    """The smallest CPU bandwidth limit (CPUs, quota / period, not rounded) of the cgroups in `dirs`, or None
    where none is set (v2 "max", v1 quota -1, or no such file)."""
    limits = []
    for d in dirs.unified:
        fields = (_read(d, "cpu.max") or "").split()
        quota, period = (_int(fields[0]), _int(fields[1])) if len(fields) == 2 else (None, None)
        if quota and period and quota > 0:
            limits.append(quota / period)
    for d in dirs.cpu:
        quota, period = _int(_read(d, "cpu.cfs_quota_us")), _int(_read(d, "cpu.cfs_period_us"))
        if quota and period and quota > 0:
            limits.append(quota / period)
    return min(limits) if limits else None


def _inactive_file(directory: str) -> int:
    for line in (_read(directory, "memory.stat") or "").splitlines():
        key, _, value = line.partition(" ")
        if key in ("inactive_file", "total_inactive_file"):
            return _int(value) or 0
    return 0


def cgroup_memory_limit(dirs: CgroupDirs) -> tuple[Optional[int], Optional[int]]:
    """`(limit, free)` in bytes of the tightest memory limit among the cgroups in `dirs`: the limit (v2
    `memory.max`, v1 `memory.limit_in_bytes`) and what is left of it (the limit less the usage, `memory.current`
    or `memory.usage_in_bytes`, less reclaimable page cache `inactive_file`); `(None, None)` where no limit is
    set ("max", the v1 no-limit value, or no such file)."""
    best = (None, None)
    for d, limit_file, usage_file in ([(d, "memory.max", "memory.current") for d in dirs.unified]
                                      + [(d, "memory.limit_in_bytes", "memory.usage_in_bytes") for d in dirs.memory]):
        limit = _int(_read(d, limit_file))
        if limit is None or limit >= NO_LIMIT_BYTES:
            continue
        used = max(0, (_int(_read(d, usage_file)) or 0) - _inactive_file(d))
        free = max(0, limit - used)
        if best[1] is None or free < best[1]:
            best = (limit, free)
    return best


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one worker may use (`cpus`, `memory_bytes`) and the figures they come from.

    Attributes:
      cpus: CPUs for this worker: min(affinity, cgroup quota rounded up, host) // local_size, at least 1.
      memory_bytes: bytes of memory for this worker: min(host available, cgroup limit less usage) // local_size.
      local_size: workers on this host sharing the figures below.
      host_cpus: `os.cpu_count()`.
      affinity_cpus: CPUs in this process's affinity mask (`os.sched_getaffinity(0)`).
      cgroup_cpus: the cgroup CPU quota in CPUs (quota / period), None without one.
      host_available_bytes: the host's available memory (psutil `virtual_memory().available`).
      cgroup_memory_limit_bytes: the cgroup's memory limit, None without one.
      cgroup_memory_free_bytes: what is left of it (the limit less the usage), None without one.
    """

    cpus: int
    memory_bytes: int
    local_size: int
    host_cpus: int
    affinity_cpus: int
    cgroup_cpus: Optional[float]
    host_available_bytes: int
    cgroup_memory_limit_bytes: Optional[int]
    cgroup_memory_free_bytes: Optional[int]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line, e.g. "1 CPU (affinity 1 of 2 cores), 3.20 GiB memory (cgroup memory limit 8.00 GiB, 6.40
        GiB free, shared by 2 local workers)"."""
        shared = f", shared by {self.local_size} local workers" if self.local_size > 1 else ""
        cpu = [f"affinity {self.affinity_cpus} of {self.host_cpus} cores"]
        if self.cgroup_cpus is not None:
            cpu.append(f"cgroup quota {self.cgroup_cpus:g} CPU{'s' if self.cgroup_cpus != 1 else ''}")
        mem = (f"cgroup memory limit {_gib(self.cgroup_memory_limit_bytes)}, {_gib(self.cgroup_memory_free_bytes)} "
               f"free" if self.cgroup_memory_limit_bytes is not None else
               f"host {_gib(self.host_available_bytes)} available, no cgroup limit")
        return (f"{self.cpus} CPU{'s' if self.cpus != 1 else ''} ({', '.join(cpu)}{shared}), "
                f"{_gib(self.memory_bytes)} memory ({mem}{shared})")


def _gib(b: Optional[int]) -> str:
    return f"{(b or 0) / 2 ** 30:.2f} GiB"


def _host_available() -> int:
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil is a dependency; keep working without it
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # not Linux, or /proc not mounted: no cgroup figures
        return ""


def combine(*, local_size: int, host_cpus: int, affinity_cpus: int, cgroup_cpus: Optional[float],
            host_available_bytes: int, cgroup_memory: tuple[Optional[int], Optional[int]] = (None, None)
            ) -> Resources:
    """One worker's `Resources` from the process's figures (see `Resources`).

    Raises:
      ValueError: if local_size < 1.
    """
    if local_size < 1:
        raise ValueError(f"local_size must be >= 1, got {local_size}")
    limit, free = cgroup_memory
    process_cpus = min([affinity_cpus, host_cpus, *([math.ceil(cgroup_cpus)] if cgroup_cpus else [])])
    process_memory = min([host_available_bytes, *([free] if free is not None else [])])
    return Resources(cpus=max(1, process_cpus // local_size), memory_bytes=process_memory // local_size,
                     local_size=local_size, host_cpus=host_cpus, affinity_cpus=affinity_cpus,
                     cgroup_cpus=cgroup_cpus, host_available_bytes=host_available_bytes,
                     cgroup_memory_limit_bytes=limit, cgroup_memory_free_bytes=free)


def quota_threads(res: Resources) -> Optional[int]:
    """`res.cpus` where a cgroup CPU quota (a pod's CPU limit) is below the cores this process may run on, else
    None: the threads tf.data's maps must be held to (`PipelinePlan.thread_limit`). tf.data's autotune budget
    alone does not hold them: an AUTOTUNE map ran one call per schedulable core with `cpu_budget=1`
    (tensorflow/tensorflow#62821), and a process past its quota is throttled for the rest of the period."""
    if res.cgroup_cpus and math.ceil(res.cgroup_cpus) < min(res.affinity_cpus, res.host_cpus):
        return res.cpus
    return None


def detect(local_size: int = 1, *, proc_cgroup: str = PROC_CGROUP, mountinfo: str = PROC_MOUNTINFO,
           host_available_bytes: Optional[int] = None) -> Resources:
    """This process's `Resources`, measured now, for one of `local_size` workers on this host.

    Args:
      local_size: workers on this host (`WorkerContext.local_size`).
      proc_cgroup, mountinfo: the files naming the process's cgroups and the cgroup mounts (tests give their own).
      host_available_bytes: the host's available memory (default: measured now, psutil).
    Raises:
      ValueError: if local_size < 1.
    """
    dirs = cgroup_dirs(_text(proc_cgroup), _text(mountinfo))
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return combine(local_size=local_size, host_cpus=os.cpu_count() or affinity, affinity_cpus=affinity,
                   cgroup_cpus=cgroup_cpu_limit(dirs),
                   host_available_bytes=_host_available() if host_available_bytes is None else host_available_bytes,
                   cgroup_memory=cgroup_memory_limit(dirs))


def for_this_process(environ: Optional[Mapping[str, str]] = None) -> Resources:
    """`detect` with the local size of this process's `WorkerContext` (from TF_CONFIG or the launcher's
    variables): the default of the input pipeline when no resources are given."""
    from harness.distribute.context import WorkerContext

    return detect(WorkerContext.from_environment(environ).local_size)
