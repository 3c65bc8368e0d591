"""harness/profile/plot.py: the timeline PNG, one row per worker, from a small report."""
import struct

from harness.profile import report as report_lib
from harness.profile.plot import plot_timeline


def _part(rank, waits):
    """A worker's part as `worker_part` writes it: steps of 1 s, the first a warm-up step; CPU samples, no GPU."""
    steps = [{"step": i + 1, "start_s": float(i), "input_wait_s": w, "compute_s": 1.0 - w, "examples": 8,
              "warmup": i == 0, "step_s": 1.0} for i, w in enumerate(waits)]
    samples = [{"t_s": t / 2, "cpu_percent": 50.0, "gpu_util": None, "gpu_mem_util": None, "gpu_mem_used_mb": None,
                "gpu_power_w": None} for t in range(2 * len(waits))]
    return {"rank": rank, "host": "h", "pid": 1, "replicas": 1, "gpu": "no GPU", "gpu_available": False,
            "sample_interval_s": 0.5, "steps": steps, "samples": samples, "trace": None, "profiler": None,
            "facts": {}}


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])  # IHDR: width, height


def test_timeline_png_has_one_row_per_worker(tmp_path):
    parts = [_part(1, [0.5, 0.2, 0.3]), _part(0, [0.5, 0.0, 0.1])]
    report = report_lib.build_report(parts, kind="test", config={}, replicas_in_sync=2)
    assert report["summary"]["input_stall_worker"] == 1  # what the title names
    two = tmp_path / "two.png"
    assert plot_timeline(report, str(two)) == str(two) and two.stat().st_size > 0
    assert _png_size(two) == (1200, 520)  # 12 x (2.2 per worker + 0.8) inches at 100 dpi
    one = tmp_path / "one.png"
    plot_timeline(report_lib.build_report(parts[1:], kind="test", config={}, replicas_in_sync=1), str(one))
    assert _png_size(one) == (1200, 300)
