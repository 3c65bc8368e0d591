"""`harness evaluate` (harness/evaluate/run.py): docs/predictions.md's block run as printed (a table run, its test split
scored on 1 worker and on 2 with `harness launch local`: the same counts), and the run's validation split scored
again: equal to the validation metrics in its summary.json, to the last count; a model without its run refused.

The commands that train nothing and start no worker (synth, plan, the 1-worker evaluate and the scores again) run in
this process (`predict_support.cli_in_process`: each saves a process that imports TensorFlow); `harness train` and
`harness launch local`, with its 2 workers, are processes of their own, as printed."""
import contextlib
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from predict_support import cli_in_process

README = pathlib.Path(__file__).resolve().parents[2] / "docs" / "predictions.md"


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    """The fenced block of docs/predictions.md's `harness evaluate` section, word for word, in an empty folder (the
    lines that train nothing and start no worker in this process): its outputs, and the folder."""
    folder = tmp_path_factory.mktemp("readme")
    section = README.read_text().partition("\n## Scoring a test split: `harness evaluate`\n")[2].split("\n## ", 1)[0]
    block = re.search(r"^```\n(.*?)^```$", section, re.S | re.M).group(1)
    lines = [line for line in block.replace("\\\n", "").splitlines() if line.strip()]
    assert [shlex.split(line)[:2] for line in lines] == [["harness", "synth"], ["harness", "plan"], ["harness", "train"],
                                                         ["harness", "evaluate"], ["harness", "launch"]]
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    out = []
    for line in lines:
        argv = shlex.split(line)
        if argv[1] in ("synth", "plan", "evaluate"):
            with contextlib.chdir(folder):
                r = cli_in_process(*argv[1:])
        else:
            r = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, (line, r.stdout[-2000:], r.stderr[-2000:])
        out.append(r.stdout)
    return folder, out


def test_the_test_split_is_scored_on_one_worker_and_on_two_alike(readme):
    folder, out = readme
    report = json.loads((folder / "runs" / "points" / "test.json").read_text())
    m = report["metrics"]
    assert report["records"] == m["val_records"] == m["val_pixels"] == 200 and report["loss"] == "crossentropy"
    assert np.sum(m["val_confusion_matrix"]) == 200 and set(report["per_class"]) == {"0", "1", "2"}
    assert "steps per epoch: 12" in out[1], out[1]      # 800 records on 2 workers, global batch 64
    one, two = out[3].splitlines(), out[4]
    assert "evaluate: 200 records of 1 file(s), 1 worker(s) x 1 replica(s), per-replica batch 32" in one
    assert f"records 200, labels counted 200; crossentropy loss {m['val_loss']:.4f}" in one
    assert any(line.split()[:1] == ["2"] and len(line.split()) == 5 for line in one), out[3]   # a row per class
    # Two workers: the chief's lines, the same counts and metrics (the loss summed in another order)
    assert "evaluate: 200 records of 1 file(s), 2 worker(s) x 1 replica(s)" in two, two[-2000:]
    assert f"accuracy {m['val_accuracy']:.4f}  mean_iou {m['val_mean_iou']:.4f}" in two, two[-2000:]


def test_the_validation_split_scored_again_equals_the_runs_last_validation(readme, tmp_path):
    folder, _ = readme
    summary = json.loads((folder / "runs" / "points" / "summary.json").read_text())
    cli_in_process("evaluate", "--model", folder / "runs" / "points", "--data",
                   folder / "points" / "export-00002.tfrecord.gz", "--output", tmp_path / "out")
    metrics, last = json.loads((tmp_path / "out" / "evaluation.json").read_text())["metrics"], summary["history"][-1]
    assert (metrics["val_records"], metrics["val_pixels"]) == (last["val_records"], last["val_pixels"]) == (200, 200)
    assert metrics["val_confusion_matrix"] == last["val_confusion_matrix"]
    for key in ("val_accuracy", "val_mean_iou", "val_precision", "val_recall", "val_f1", "val_iou"):
        np.testing.assert_allclose(metrics[key], last[key], rtol=1e-12, err_msg=key)   # of the same counts
    np.testing.assert_allclose(metrics["val_loss"], last["val_loss"], rtol=1e-6)


def test_a_model_without_its_run_is_refused(readme, tmp_path, capsys):
    """`harness evaluate` in this process: the model is loaded, then refused before any data is read."""
    import shutil

    from harness import cli

    folder, _ = readme
    shutil.copy(folder / "runs" / "points" / "model.keras", tmp_path / "bare.keras")
    code = cli.main(["evaluate", "--model", str(tmp_path / "bare.keras"), "--data", str(folder / "points")])
    err = capsys.readouterr().err
    assert code == 2
    assert "no run summary.json with a labelled spec beside the model" in err, err[-2000:]
