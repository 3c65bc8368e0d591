"""The trace window (one .xplane.pb per worker, the profiler's own input figure), missing traces named, the plot,
the verdict thresholds and the advice."""
import os

import pytest

from harness.errors import ConfigError
from harness.profile import report as report_lib
from harness.profile.sampler import UtilizationSampler, _visible_indices
from harness.profile.session import default_window
from harness.profile.trace import missing_traces, parse_step_window


def test_trace_window_and_profiler_figure(tmp_path, delayed_run, capsys):
    session, report = delayed_run(0.050, 0.010, tmp_path, trace_steps=(8, 14), plot=True)
    trace = report["parts"][0]["trace"]
    assert trace["ok"] and trace["bytes"] > 0 and tuple(trace["steps"]) == (8, 14)
    assert trace["xplane"].startswith(str(tmp_path / "tensorboard" / "worker-0" / "plugins" / "profile"))
    assert report["traces"]["missing"] == []
    prof = report["parts"][0]["profiler"]
    assert "error" not in prof, prof
    assert prof["steps"] >= 5 and prof["input_percent"] > 20          # the profiler agrees: highly input-bound
    out = capsys.readouterr().out
    assert f"tensorboard --logdir {tmp_path / 'tensorboard'}" in out and "profiler measured" in out
    png = tmp_path / "timeline.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_missing_trace_is_named():
    ok = {"rank": 0, "ok": True, "error": "", "logdir": "tb/worker-0"}
    empty = {"rank": 1, "ok": False, "error": "tb/worker-1/x.xplane.pb is empty", "logdir": "tb/worker-1"}
    assert missing_traces([ok, empty], 3) == ["worker 1: tb/worker-1/x.xplane.pb is empty (log dir tb/worker-1)",
                                              "worker 2: no trace reported"]


@pytest.mark.parametrize("share, words", [(0.25, "highly input-bound"), (0.20, "highly input-bound"),
                                          (0.07, "moderately input-bound"), (0.049, "not input-bound")])
def test_verdict_thresholds(share, words):
    assert report_lib.verdict(share) == words


def test_step_window_parsing():
    assert parse_step_window("10:20") == (10, 20) and parse_step_window("3,3") == (3, 3)
    for bad in ("20:10", "0:5", "x", ""):
        with pytest.raises(ConfigError, match="--profile-steps"):
            parse_step_window(bad)
    assert default_window(100, 2) == (5, 14) and default_window(6, 2) == (5, 6) and default_window(2, 2) is None


def test_advice_is_concrete():
    worker = {"rank": 0, "input_stall_share": 0.5}
    slow = {"rank": 1, "input_stall_share": 0.9}
    summary = {"input_stall_share": 0.9, "cpu_percent": 95.0, "accelerator_busy_share": None}
    tips = report_lib.advice(summary, [worker, slow], {"compression": "GZIP", "files_per_worker": 1,
                                                        "cpu_count": 8, "cache": "none"})
    text = "\n".join(tips)
    for words in ("harness reshard", "more parallel reads", "cache placement", "tf.data service", "worker 1"):
        assert words in text
    calm = report_lib.advice({"input_stall_share": 0.01, "accelerator_busy_share": 0.93}, [worker], {})
    assert "busy 93%" in calm[0]


def test_no_gpu_is_said_not_zero(monkeypatch):
    sampler = UtilizationSampler(interval_s=0.01)
    if sampler.gpu.available:
        pytest.skip("a GPU is visible here")
    assert "no GPU" in sampler.gpu.describe()
    with sampler:
        import time
        time.sleep(0.1)
    assert sampler.samples and all(s.gpu_util is None for s in sampler.samples)
    assert all(0.0 <= s.cpu_percent <= 100.0 for s in sampler.samples)


def test_cuda_visible_devices_maps_nvml_indices():
    assert _visible_indices(4, {}) == [0, 1, 2, 3]
    assert _visible_indices(4, {"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert _visible_indices(4, {"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == [1]
    assert _visible_indices(4, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert _visible_indices(2, {"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == [0, 1]
