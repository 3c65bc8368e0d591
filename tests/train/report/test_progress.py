"""The chief's progress within an epoch where its output is not a terminal (issue 68): one line every
`--progress-every` seconds, read from a log file as a pod's log would be written."""
import io
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from harness.train.report.progress import Progress, eta

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "slow_step_model.py"
LINE = re.compile(r"^epoch 1/1 step (\d+)/32 \((\d+)%\): loss \d+\.\d{4} \| ([\d,]+) examples/s, input stall "
                  r"\d+\.\d%, ETA (\d+)s$")


def test_the_line_and_the_eta():
    assert [eta(s) for s in (0, 41.4, 542, 3725)] == ["0s", "41s", "9m02s", "1h02m"]
    p = Progress(is_chief=True, epoch=2, epochs=5, steps=4000, interval_s=30, stream=io.StringIO())
    timing = {"steps": 1198, "examples_per_s": 1234.4, "input_stall_share": 0.12, "mean_step_s": 0.1355}
    assert p.line(1200, 0.43121, timing) == ("epoch 2/5 step 1200/4000 (30%): loss 0.4312 | 1,234 examples/s, "
                                             "input stall 12.0%, ETA 6m19s")   # 2,800 steps x 0.1355 s
    assert p.line(2, 0.5, {"steps": 0}) == "epoch 2/5 step 2/4000 (0%): loss 0.5000"   # still in warm-up


def test_a_line_when_due_on_the_chief_only_and_none_at_0():
    out = io.StringIO()
    calls = []

    def summary():
        calls.append(1)
        return {"steps": 3, "examples_per_s": 10.0, "input_stall_share": 0.0, "mean_step_s": 0.1}

    p = Progress(is_chief=True, epoch=1, epochs=1, steps=10, interval_s=0.05, stream=out)
    p.update(1, 1, 0.9, summary)
    assert out.getvalue() == "" and not calls          # not due yet: the summary is not even computed
    time.sleep(0.06)
    p.update(2, 1, 0.8, summary)
    p.update(3, 1, 0.7, summary)                         # due again only 0.05 s after the last line
    assert out.getvalue().splitlines() == ["epoch 1/1 step 2/10 (20%): loss 0.8000 | 10 examples/s, input stall "
                                           "0.0%, ETA 1s"] and calls == [1]
    for chief, interval in ((False, 0.01), (True, 0), (True, None)):
        quiet = io.StringIO()
        p = Progress(is_chief=chief, epoch=1, epochs=1, steps=10, interval_s=interval, stream=quiet)
        time.sleep(0.02)
        p.update(5, 1, 0.5, summary)
        assert quiet.getvalue() == ""


@pytest.mark.waits("an epoch of 32 steps that sleep 1 s each: about 40 s of wall time, a few CPU-s")
def test_an_epoch_of_half_a_minute_logs_a_line_every_interval_to_a_file(tmp_path):
    from harness.data.export import synth

    synth.write_table_export(str(tmp_path / "d"), prefix="points", shards=1, records=256, classes=4, seed=1)
    log = tmp_path / "train.log"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HARNESS_TEST_STEP_SLEEP_S="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(SCRIPT.parent), os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, "-m", "harness.cli", "train", "--data", str(tmp_path / "d"), "--label", "class",
            "--epochs", "1", "--per-replica-batch-size", "8", "--model", f"{SCRIPT}:build", "--progress-every", "5",
            "--output", str(tmp_path / "run")]
    seen, deadline = {}, time.monotonic() + 300   # line -> when it reached the file
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                for line in log.read_text().splitlines():
                    seen.setdefault(line, time.monotonic())
                time.sleep(0.2)
        finally:
            proc.kill() if proc.poll() is None else None
            proc.wait(30)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    for line in text.splitlines():
        seen.setdefault(line, time.monotonic())
    assert "\r" not in text                                 # no bar drawn into a file
    progress = [(seen[ln], LINE.match(ln)) for ln in text.splitlines() if ln.startswith("epoch 1/1 step ")
                and "/32 (" in ln]
    assert all(m for _, m in progress), [ln for ln in text.splitlines() if ln.startswith("epoch 1/1 step ")]
    end = next(seen[ln] for ln in text.splitlines() if re.match(r"^epoch 1/1 step 32: loss", ln))
    epoch = re.search(r"^epoch 1/1 step 32: loss \S+ \| ([\d.]+) examples/s", text, re.M)
    assert 256 / float(epoch.group(1)) >= 30, epoch.group(0)   # the epoch's 32 steps took at least 30 s
    steps = [int(m.group(1)) for _, m in progress]
    assert len(progress) >= 5 and steps == sorted(steps) and steps[-1] < 32, steps
    # a line at least every interval: 5 s, plus the call a line waits for (one 1-s step) and 1.5 s of polling and
    # a loaded machine; the ETA counts the steps left at about 1 s each
    gaps = [b - a for (a, _), (b, _) in zip(progress, progress[1:])] + [end - progress[-1][0]]
    assert max(gaps) <= 7.5, gaps
    for _, m in progress:
        assert abs(int(m.group(4)) - (32 - int(m.group(1)))) <= 3 + 0.2 * (32 - int(m.group(1))), m.group(0)
