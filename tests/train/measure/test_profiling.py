"""harness/train/measure/profiling.py: `harness train --profile`: the job writes report.json, the plot and a trace, and prints
the table."""
import json

from harness.data.export import synth
from harness.train import job


def test_train_profile_writes_report(tmp_path, capsys):
    paths = synth.write_table_export(str(tmp_path / "data"), shards=2, records=512, seed=0)
    out = tmp_path / "run"
    options = job.TrainOptions(data=tuple(paths), epochs=2, per_replica_batch_size=32, strategy="single",
                               output=str(out), profile_steps="4:6")
    summary = job.run(options)
    report = json.loads((out / "report.json").read_text())
    assert summary["profile"]["steps"] == 2 * 16 - 2 and report["summary"]["warmup_steps"] == 2
    assert len(report["parts"][0]["steps"]) == 32 and report["config"]["profile_steps"] == "4:6"
    assert report["parts"][0]["trace"]["ok"] and report["traces"]["missing"] == []
    assert (out / "timeline.png").exists()
    assert report["parts"][0]["facts"]["compression"] == "GZIP"
    printed = capsys.readouterr().out
    assert "verdict:" in printed and "tensorboard --logdir" in printed
    # The input-cost probe ran the same model and batch on synthetic batches, bounded, after the run.
    s = report["summary"]
    probe = s["probe"]
    assert s["synthetic_examples_per_s"] == probe["examples_per_s"] > 0 and s["real_examples_per_s"] > 0
    assert s["input_cost"] == 1 - s["real_examples_per_s"] / s["synthetic_examples_per_s"]
    assert probe["steps"] >= 20 and probe["steps"] % probe["steps_per_loop"] == 0 and probe["seconds"] < 30
    assert f"input cost {100 * s['input_cost']:.1f}%" in printed and "on synthetic batches" in printed
    assert summary["profile"]["input_cost"] == s["input_cost"]
    assert len(report["parts"][0]["steps"]) == 32          # the probe's steps are not the run's
