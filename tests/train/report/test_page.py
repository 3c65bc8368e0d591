"""`harness report`'s page (harness/train/report/page.py) and what ran (provenance.py), in this process: the run's
provenance as the options give it, and only `harness evaluate`'s reports in the run folder shown as test scores.
The whole page of a real run is opened in headless Chromium by tests/test_quickstart.py."""
import json
import re
import types

from harness.train.options import TrainOptions
from harness.train.report import page, provenance


def test_the_optimizer_as_built_and_the_options_not_at_their_defaults():
    sgd = TrainOptions(data=("a", "b"), optimizer="sgd", momentum=0.9, clip_norm=1.0, epochs=7)
    assert provenance.optimizer(sgd) == {"name": "sgd", "momentum": 0.9, "nesterov": False, "clip_norm": 1.0}
    assert provenance.optimizer(TrainOptions(data=("a",), optimizer="adamw")) == {"name": "adamw",
                                                                                 "weight_decay": 0.004}
    assert provenance.non_default(sgd) == {"data": ["a", "b"], "optimizer": "sgd", "momentum": 0.9,
                                           "clip_norm": 1.0, "epochs": 7, "per_replica_batch_size": 32}


def test_the_page_shows_what_ran_and_only_evaluate_reports_as_scores(tmp_path):
    options = TrainOptions(data=("gs://bucket/train",), validation_data=("gs://bucket/val",), model="m.py:build")
    context = types.SimpleNamespace(num_workers=2, replicas_in_sync=2)
    run = provenance.finished(provenance.provenance(options, context, started=1_800_000_000, model="m.py:build",
                                                    hosts=["host0", "host1"]), 1_800_000_000, 1_800_000_061.5)
    assert (run["started"], run["ended"], run["duration_s"]) == ("2027-01-15T08:00:00Z", "2027-01-15T08:01:01Z",
                                                                 61.5)
    (tmp_path / "summary.json").write_text(json.dumps({"context": "2 workers", "run": run}))
    scores = {"kind": "evaluation", "evaluated": "2027-01-15T09:00:00Z", "data": ["gs://bucket/test"],
              "records": 123, "loss": "crossentropy", "metrics": {"val_loss": 0.25, "val_accuracy": 0.875},
              "per_class": {"water": {"precision": 0.5, "recall": 1.0, "f1": 0.6667, "iou": 0.5}}}
    (tmp_path / "test.json").write_text(json.dumps(scores))
    (tmp_path / "tuned.json").write_text(json.dumps({"parse": "batches"}))   # another JSON of the run: not scores
    (tmp_path / "partial.json").write_text('{"kind": "evalu')                # being written: skipped
    text = page.build(str(tmp_path))
    assert re.findall(r'<table id="([^"]+)"', text) == ["run", "plan", "data", "optimization", "evaluation-test",
                                                       "evaluation-test-per-class"]
    for shown in ("gs://bucket/train", "gs://bucket/val", "m.py:build", "host0, host1", "2027-01-15T08:01:01Z",
                  'data-value="61.5"', 'data-value="123"', 'data-value="0.875"', "water", "gs://bucket/test"):
        assert shown in text, shown
