"""The README's quick start, run as printed: from the project's root (a folder holding `examples/` and `.venv`,
whose `../shared/data` is the real exports), every line of its first fenced block in order, once: on the ACES points
and image when they can be had (../shared/data, or fetched: tests/shared_data.py), else on synthetic exports of the
same bands put where the ACES files are (so the same lines run). `harness train` runs in `bash -e` after the
block's own `. .venv/bin/activate`, as a user's shell runs them (the console script the venv puts on PATH); the
`harness` lines that train nothing (inspect, predict, report, evaluate) run word for word in this process, in the
project's root (`predict_support.cli_in_process`: each saves a process that imports TensorFlow). Then the report it
wrote is opened in headless Chromium with the network blocked (tests/browser.py): nothing requested, nothing
failed, no console message, every plot drawn, its tables equal to `summary.json`."""
import contextlib
import json
import math
import os
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

import browser
from harness.data.export import synth
from predict_support import cli_in_process

ROOT = pathlib.Path(__file__).resolve().parents[1]
ACES_BANDS = ("blue_before", "blue_during", "green_before", "green_during", "nir_before", "nir_during", "red_before",
              "red_during")


def quick_start() -> str:
    """The README's first fenced block after "## Quick start"."""
    text = (ROOT / "README.md").read_text()
    section = text.partition("\n## Quick start")[2]
    return re.search(r"^```\n(.*?)^```$", section, re.S | re.M).group(1)


def _synthetic(data: pathlib.Path) -> None:
    """Exports laid out as the ACES ones: three point files of the eight bands with a 5-class label, and a folder
    of an image export of those bands whose mixer is `<prefix>.json` (as the ACES authors renamed it)."""
    points = data / "gee-aces-points"
    for name, seed in (("training", 1), ("validation", 2), ("testing", 3)):
        synth.write_table_export(str(points), prefix=name, shards=1, records=600, bands=ACES_BANDS, label="class",
                                 classes=5, seed=seed)      # one file: <prefix>.tfrecord.gz, as Earth Engine names it
    image = data / "gee-aces-image"
    synth.write_image_export(str(image), prefix="image_2021", shards=1, records=4, bands=ACES_BANDS, label=None,
                             patch_size=64, kernel_size=0, seed=4)
    (image / "image_2021-00000.tfrecord.gz").rename(image / "image_2021.tfrecord.gz")
    (image / "image_2021-mixer.json").rename(image / "image_2021.json")


def _run_quick_start(base: pathlib.Path, data: pathlib.Path) -> tuple[pathlib.Path, subprocess.CompletedProcess]:
    root = base / "project"
    root.mkdir(parents=True)
    (base / "shared").mkdir()
    (base / "shared" / "data").symlink_to(data.resolve())
    (root / "examples").symlink_to(ROOT / "examples")
    (root / ".venv").symlink_to(pathlib.Path(sys.prefix))
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    lines = [line for line in quick_start().replace("\\\n", "").splitlines() if line.strip()]
    assert lines[0] == ". .venv/bin/activate", lines
    stdout, stderr = [], []
    for line in lines[1:]:
        argv = shlex.split(line, comments=True)
        if argv[:1] == ["harness"] and argv[1:2] != ["train"]:     # trains nothing: in this process
            with contextlib.chdir(root):
                done = cli_in_process(*argv[1:], ok=False)
        else:                                                       # the shell, after the block's activate line
            script = base / "line.sh"
            script.write_text(f"{lines[0]}\n{line}\n")
            done = subprocess.run(["bash", "-e", str(script)], cwd=root, env=env, capture_output=True, text=True,
                                  timeout=600)
        assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-3000:])
        stdout.append(done.stdout)
        stderr.append(done.stderr)
    return root, subprocess.CompletedProcess(lines, 0, "".join(stdout), "".join(stderr))


@pytest.fixture(scope="module")
def quick_start_run(tmp_path_factory):
    """The quick start run once, on the ACES exports when they can be had, else on the synthetic ones (each run
    costs ~12 CPU-s: the two data sets run the same lines, so the one run carries both tests)."""
    import shared_data as sd

    try:
        data = pathlib.Path(sd.shared_data_root())
    except sd.SharedDataUnavailable:
        base = tmp_path_factory.mktemp("synthetic")
        _synthetic(base / "data")
        return _run_quick_start(base, base / "data")
    return _run_quick_start(tmp_path_factory.mktemp("aces"), data)


def test_the_quick_start_is_in_the_readmes_first_60_lines():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:60])
    assert quick_start() in head and "harness predict" in quick_start() and "harness report" in quick_start()
    model = (ROOT / "examples" / "pixel_mlp.py").read_text()
    assert f"```python\n{model}```" in head and len(model.splitlines()) <= 10


def test_the_quick_start_runs_as_printed_and_ends_on_a_map(quick_start_run):
    from predict_support import read_outputs

    root, done = quick_start_run
    summary = json.loads((root / "runs" / "points" / "summary.json").read_text())
    assert summary["spec"]["bands"] == list(ACES_BANDS) and summary["spec"]["num_classes"] == 5
    assert len(summary["history"]) == 5 and "val_accuracy" in summary["history"][-1]
    rows = read_outputs(sorted((root / "preds").glob("*.tfrecord")))
    counts = np.bincount(np.concatenate([r["class"] for r in rows]), minlength=5)
    assert (counts > 0).sum() > 1, counts                       # a map of several classes, not one
    assert (root / "preds" / "image_2021.tif").stat().st_size > 0 and (root / "preds" / "image_2021.png").is_file()
    assert "pixels per class" in done.stdout                      # `harness inspect preds`
    assert "report: runs/points/report.html" in done.stdout
    assert "earthengine upload image" in done.stdout
    # what ran, in summary.json: the data, the model file, the optimizer, when, on what
    run = summary["run"]
    assert run["data"] == ["../shared/data/gee-aces-points/training.tfrecord.gz"]
    assert run["validation_data"] == ["../shared/data/gee-aces-points/validation.tfrecord.gz"]
    assert run["model_file"] == "examples/pixel_mlp.py:build" and run["optimizer"] == {"name": "adam"}
    assert run["started"] <= run["ended"] and 0 < run["duration_s"] < 600 and run["workers"] == 1
    assert run["options"]["model"] == run["model_file"] and run["options"]["output"] == "runs/points"
    import keras
    import tensorflow as tf
    assert run["versions"]["tensorflow_runtime"] == tf.__version__ and run["versions"]["keras"] == keras.__version__
    evaluation = json.loads((root / "runs" / "points" / "evaluation.json").read_text())
    assert evaluation["kind"] == "evaluation" and evaluation["records"] > 0
    assert evaluation["data"] == ["../shared/data/gee-aces-points/testing.tfrecord.gz"]


@pytest.mark.skipif(browser.UNAVAILABLE is not None, reason=str(browser.UNAVAILABLE))
def test_the_report_opens_offline_with_every_plot_drawn_and_the_runs_numbers(quick_start_run):
    root, _ = quick_start_run
    page = browser.open_offline(str(root / "runs" / "points" / "report.html"))
    assert page["requests"] == [] and page["failed"] == [] and page["exceptions"] == []
    assert page["console"] == []
    # losses and metrics per epoch, throughput and stall per worker, the confusion matrix, the map's quick-look
    assert [f["tag"] for f in page["figures"]] == ["svg", "svg", "svg", "IMG"], page["figures"]
    assert all(f["inked"] and f["complete"] and f["width"] > 200 for f in page["figures"]), page["figures"]
    assert browser._inked(page["screenshot"])
    summary = json.loads((root / "runs" / "points" / "summary.json").read_text())
    tables = page["tables"]

    def value(cell):
        return float("nan") if cell == "NaN" else json.loads(cell)

    header, *rows = tables["epochs"]
    for h, row in zip(summary["history"], rows, strict=True):
        for name, cell in zip(header, row):
            want = h["epoch"] if name == "epoch" else h[name]
            assert value(cell) == want or (math.isnan(want) and math.isnan(value(cell))), (name, cell, want)
    _, *rows = tables["per_class"]
    assert [r[0] for r in rows] == summary["class_names"]
    for row in rows:
        want = summary["per_class"][row[0]]
        assert [value(c) for c in row[1:]] == [want[k] for k in ("precision", "recall", "f1", "iou")]
    _, *rows = tables["confusion"]
    assert [[int(value(c)) for c in r[1:]] for r in rows] == summary["history"][-1]["val_confusion_matrix"]
    plan = {r[0]: value(r[1]) for r in tables["plan"][1:]}   # the header row is ["plan", ""]
    assert plan["global batch size"] == summary["plan"]["global_batch_size"]
    assert plan["steps per epoch"] == summary["plan"]["steps_per_epoch"]
    _, *rows = tables["workers"]
    assert [value(r[2]) for r in rows] == summary["workers"][0]["examples_per_s"]
    # what ran, and the test split's scores that `harness evaluate --output runs/points` wrote into the run folder
    ran = {r[0]: r[1] for r in tables["run"][1:]}
    run = summary["run"]
    assert ran["model"] == run["model_file"] and ran["data"] == run["data"][0] and ran["optimizer"] == "adam"
    assert ran["started (UTC)"] == run["started"] and value(ran["duration s"]) == run["duration_s"]
    assert ran["TensorFlow"] == run["versions"]["tensorflow_runtime"] and ran["harness"] == run["versions"]["harness"]
    evaluation = json.loads((root / "runs" / "points" / "evaluation.json").read_text())
    scores = {r[0]: r[1] for r in tables["evaluation-evaluation"][1:]}
    assert value(scores["records"]) == evaluation["records"]
    assert value(scores["accuracy"]) == evaluation["metrics"]["val_accuracy"]
    assert value(scores["loss (crossentropy)"]) == evaluation["metrics"]["val_loss"]
    _, *rows = tables["evaluation-evaluation-per-class"]
    assert [r[0] for r in rows] == list(evaluation["per_class"])
    # the constant learning rate shows no decay period or rate
    optimization = [r[0] for r in tables["optimization"][1:]]
    assert sorted(optimization) == ["kind", "loss", "peak"], optimization
