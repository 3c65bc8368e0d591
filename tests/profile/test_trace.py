"""harness/profile/trace.py: the trace window (one .xplane.pb per worker, the profiler's own input figure), missing
traces named, the step-window option. TensorBoard's view of the traces: test_tensorboard.py."""
import pytest

from harness.errors import ConfigError
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


def test_step_window_parsing():
    assert parse_step_window("10:20") == (10, 20) and parse_step_window("3,3") == (3, 3)
    for bad in ("20:10", "0:5", "x", ""):
        with pytest.raises(ConfigError, match="--profile-steps"):
            parse_step_window(bad)
    assert default_window(100, 2) == (5, 14) and default_window(6, 2) == (5, 6) and default_window(2, 2) is None
