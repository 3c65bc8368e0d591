"""harness/profile/report.py: the verdict thresholds and the advice."""
import pytest

from harness.profile import report as report_lib


@pytest.mark.parametrize("share, words", [(0.25, "highly input-bound"), (0.20, "highly input-bound"),
                                          (0.07, "moderately input-bound"), (0.049, "not input-bound")])
def test_verdict_thresholds(share, words):
    assert report_lib.verdict(share) == words


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


def test_verdict_takes_the_input_cost_where_it_is_larger():
    assert report_lib.verdict(0.01, 0.45) == "highly input-bound"
    assert report_lib.verdict(0.30, 0.02) == "highly input-bound"
    assert report_lib.verdict(0.01, None) == report_lib.verdict(0.01, -0.1) == "not input-bound"


def test_disagreements_say_which_figures_part_and_why():
    base = {"input_stall_share": 0.02, "traced_input_stall_share": 0.03, "profiler_input_percent": 1.0,
            "input_cost": 0.45, "real_input_stall_share": 0.02, "probe": {"steps_per_loop": 8}}
    (line,) = report_lib.disagreements(base)
    assert "ran 45% slower than on synthetic batches" in line and "share the cores" in line
    agree = dict(base, input_cost=0.04)
    assert report_lib.disagreements(agree) == []
    apart = dict(base, traced_input_stall_share=0.40, profiler_input_percent=12.0, input_cost=None)
    lines = report_lib.disagreements(apart)
    assert "12.0%" in lines[0] and "40.0%" in lines[0] and "uneven over the run" in lines[1]
    load = dict(base, real_input_stall_share=0.50, input_cost=0.10)
    assert "load changed" in report_lib.disagreements(load)[0]


def test_no_whole_call_of_k_steps_is_no_input_cost_not_100_percent():
    """A short run whose steps are all one-step calls (warm-up, trace window) has no K-step call to time: the input
    cost is unmeasured (None, said so in the table), not 1 - 0 / synthetic = 100% with a "highly input-bound"
    verdict."""
    steps = [{"step": i + 1, "start_s": float(i), "input_wait_s": 0.0, "compute_s": 1.0, "examples": 8,
              "warmup": i == 0, "step_s": 1.0, "call_steps": 1} for i in range(6)]
    part = {"rank": 0, "host": "h", "pid": 1, "replicas": 1, "gpu": "no GPU", "gpu_available": False,
            "sample_interval_s": 0.5, "steps": steps, "samples": [], "trace": None, "profiler": None, "facts": {}}
    probe = {"examples_per_s": 1000.0, "steps": 64, "warmup_steps": 2, "steps_per_loop": 32, "seconds": 0.6}
    s = report_lib.build_report([part], kind="test", config={}, replicas_in_sync=1, probe=probe)["summary"]
    assert s["input_cost"] is None and s["real_examples_per_s"] == 0.0
    assert s["verdict"] == "not input-bound"
    assert "input cost not measured (the run had no whole call of 32 steps" in report_lib.input_line(s)


def test_the_report_states_the_cache_and_the_stages_the_pipeline_applied():
    line = "input pipeline 0/1: 2 files, 64 records; cache: memory (cache='memory'); prefetch: autotune"
    steps = [{"step": i + 1, "start_s": float(i), "input_wait_s": 0.0, "compute_s": 1.0, "examples": 8,
              "warmup": i == 0, "step_s": 1.0, "call_steps": 1} for i in range(6)]
    part = {"rank": 0, "host": "h", "pid": 1, "replicas": 1, "gpu": "no GPU", "gpu_available": False,
            "sample_interval_s": 0.5, "steps": steps, "samples": [], "trace": None, "profiler": None,
            "facts": {"cache": "memory", "input_pipeline": line}}
    report = report_lib.build_report([part], kind="train", config={}, replicas_in_sync=1)
    assert report["summary"]["cache"] == "memory"
    assert line in report_lib.format_table(report).splitlines()
