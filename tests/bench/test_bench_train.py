"""`harness bench train` and `harness bench input`: synthetic and real data, one replica and two workers gathered
on rank 0 through the local launcher, scaling efficiency against the one-replica run (two Horovod ranks under
horovodrun: tests/bench/test_timeline.py's README lines)."""
import json
import os
import subprocess
import sys

from harness.cli import main as cli_main

COMMON = ["--steps", "6", "--warmup", "2", "--patch-size", "16", "--per-replica-batch-size", "4"]


def test_synthetic_then_two_workers_with_scaling(tmp_path, capsys):
    one = tmp_path / "one"
    assert cli_main(["bench", "train", "--data", "synthetic", "--output", str(one), "--no-trace", *COMMON]) == 0
    base = json.loads((one / "report.json").read_text())
    assert base["kind"] == "bench-train-synthetic" and base["summary"]["replicas_in_sync"] == 1
    assert base["summary"]["input_stall_share"] < 0.05           # batches live on the device: nothing to wait for
    assert "compute ceiling" in capsys.readouterr().out

    two = tmp_path / "two"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "harness.cli", "launch", "local", "--workers", "2", "--timeout", "240", "--",
           sys.executable, "-m", "harness.cli", "bench", "train", "--data", "synthetic", "--output", str(two),
           "--baseline", str(one / "report.json"), "--profile-steps", "4:6", *COMMON]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((two / "report.json").read_text())
    assert [p["rank"] for p in report["parts"]] == [0, 1]          # rank 1's steps reached rank 0
    assert all(len(p["steps"]) == 8 for p in report["parts"])
    assert report["summary"]["replicas_in_sync"] == 2 and "scaling_efficiency" in report["summary"]
    assert report["traces"]["missing"] == [] and sorted(report["traces"]["files"]) == ["0", "1"]
    for rank in (0, 1):                                            # one non-empty trace per worker, own folder
        assert f"/worker-{rank}/plugins/profile/" in report["traces"]["files"][str(rank)]
    assert "[worker 0] verdict:" in done.stdout and "scaling efficiency" in done.stdout
    assert "[worker 1] verdict:" not in done.stdout               # only the chief reports
    assert sorted(os.listdir(two)) == ["report.json", "tensorboard", "timeline.png"]


def test_real_data_and_input_bench(small_images, tmp_path, capsys):
    out = tmp_path / "real"
    assert cli_main(["bench", "train", "--data", str(small_images), "--output", str(out), "--no-plot",
                     *COMMON]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "bench-train-real" and report["config"]["plan"]["workers"] == 1
    assert report["parts"][0]["facts"]["compression"] == "GZIP" and report["parts"][0]["trace"]["ok"]
    assert report["config"]["shapes"]["input_shape"] == [16, 16, 4]
    capsys.readouterr()
    assert cli_main(["bench", "input", "--data", str(small_images), "--batch", "8", "--repeats", "1"]) == 0
    printed = capsys.readouterr().out
    for words in ("read limit", "harness", "per-record", "harness / read limit", "CPU us/ex"):
        assert words in printed


# `bench train --backend horovod` under horovodrun (both ranks' steps in rank 0's report, one replica per rank,
# the chief alone reporting): docs/scaling.md's recording line, run as printed by
# tests/bench/test_timeline.py::test_the_readme_lines_run_as_printed, carries those assertions (one launch, not two).
