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
