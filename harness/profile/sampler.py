"""Accelerator and CPU utilization, sampled in a background thread on the step timeline's clock.

GPU figures come from NVML (`nvidia-ml-py`, imported as `pynvml`): `nvmlDeviceGetUtilizationRates` gives the
percent of the last sample period during which a kernel ran (`gpu`) and the memory controller was busy
(`memory`); plus memory used and power draw. CPU utilization is `psutil.cpu_percent` over the interval (all cores,
0-100). Where NVML has no driver or no device the sampler says "no GPU" and records `None`, never 0.

Sample times are seconds on the `time.perf_counter` clock minus `origin`, the same clock as
`harness.profile.timing.StepTimer`, so samples line up with steps.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Optional, Sequence

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.05
NO_GPU = "no GPU"


@dataclasses.dataclass(frozen=True)
class Sample:
    """One sample. GPU fields are per visible GPU (lists), or None when there is no GPU."""

    t_s: float
    cpu_percent: float
    gpu_util: Optional[tuple[float, ...]] = None
    gpu_mem_util: Optional[tuple[float, ...]] = None
    gpu_mem_used_mb: Optional[tuple[float, ...]] = None
    gpu_power_w: Optional[tuple[float, ...]] = None


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """What NVML sees for this worker: device names (empty when none) and, when empty, why."""

    names: tuple[str, ...]
    reason: str = ""

    @property
    def available(self) -> bool:
        return bool(self.names)

    def describe(self) -> str:
        return ", ".join(self.names) if self.names else f"{NO_GPU} ({self.reason})"


def _visible_indices(count: int, environ=None) -> list[int]:
    """NVML indices of the GPUs this process may use: NVML ignores CUDA_VISIBLE_DEVICES, so apply it here
    (numeric lists only; UUIDs or MIG names: every device)."""
    value = (environ if environ is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return list(range(count))
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        return []
    if all(p.lstrip("-").isdigit() for p in parts):
        out = []
        for p in parts:
            i = int(p)
            if i < 0:  # CUDA stops at the first invalid index
                break
            if i < count:
                out.append(i)
        return out
    return list(range(count))


def open_gpus(environ=None):
    """`(pynvml module or None, handles, GpuInfo)`; never raises for a missing library, driver or device."""
    try:
        import pynvml
    except ImportError:
        return None, [], GpuInfo((), "nvidia-ml-py not installed")
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as e:  # no driver (NVML shared library not found), driver/library mismatch, ...
        return None, [], GpuInfo((), f"NVML: {e}")
    indices = _visible_indices(count, environ)
    if not indices:
        pynvml.nvmlShutdown()
        return None, [], GpuInfo((), "NVML found no device" if not count else "CUDA_VISIBLE_DEVICES hides all")
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
    names = []
    for h in handles:
        name = pynvml.nvmlDeviceGetName(h)
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return pynvml, handles, GpuInfo(tuple(names))


class UtilizationSampler:
    """Samples CPU (psutil) and GPU (NVML) utilization every `interval_s` in a daemon thread.

    Use as a context manager or `start()` / `stop()`; `samples` holds the `Sample`s, `gpu` the `GpuInfo`.

    Args (keyword-only):
      origin: `time.perf_counter()` value that is t = 0 (the step timer's origin); default: now.
      interval_s: seconds between samples (a few tens of milliseconds: NVML's own utilization period is
        1/6 s to 1 s depending on the GPU, so faster sampling repeats values).
    """

    def __init__(self, *, origin: Optional[float] = None, interval_s: float = DEFAULT_INTERVAL_S):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.origin = time.perf_counter() if origin is None else origin
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._nvml, self._handles, self.gpu = open_gpus()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "UtilizationSampler":
        import psutil

        psutil.cpu_percent(None)  # the first call only sets the reference point
        self._thread = threading.Thread(target=self._run, name="harness-utilization", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None
        return self.samples

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _run(self) -> None:
        import psutil

        # A fixed wait, not a schedule: after a late wake-up, catching up with back-to-back samples would read a
        # CPU share over microseconds.
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append(self._sample(psutil.cpu_percent(None)))
            except Exception as e:  # a sampler must never take training down; say so once and stop sampling
                log.warning("utilization sampling stopped: %s", e)
                return

    def _sample(self, cpu: float) -> Sample:
        t = time.perf_counter() - self.origin
        if not self._handles:
            return Sample(t, cpu)
        nv = self._nvml
        util, mem_util, used, power = [], [], [], []
        for h in self._handles:
            rates = nv.nvmlDeviceGetUtilizationRates(h)
            util.append(float(rates.gpu))
            mem_util.append(float(rates.memory))
            used.append(nv.nvmlDeviceGetMemoryInfo(h).used / 2 ** 20)
            try:
                power.append(nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
            except nv.NVMLError:  # not supported on every board
                power.append(float("nan"))
        return Sample(t, cpu, tuple(util), tuple(mem_util), tuple(used), tuple(power))


def mean_in(samples: Sequence[Sample], start_s: float, end_s: float) -> dict:
    """Mean CPU and GPU utilization (percent; GPU averaged over devices, None without GPU) of the samples in
    [start_s, end_s]; None for both when no sample falls inside."""
    inside = [s for s in samples if start_s <= s.t_s <= end_s]
    if not inside:
        return {"cpu_percent": None, "gpu_util_percent": None, "samples": 0}
    gpu = [sum(s.gpu_util) / len(s.gpu_util) for s in inside if s.gpu_util]
    return {"cpu_percent": sum(s.cpu_percent for s in inside) / len(inside),
            "gpu_util_percent": sum(gpu) / len(gpu) if gpu else None, "samples": len(inside)}
