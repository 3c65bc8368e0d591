"""The README's quick start, run as printed: from the project's root (a folder holding `examples/` and `.venv`,
whose `../shared/data` is the real exports), every line of its block that trains, in order, once: on the ACES
points and image when they can be had (../shared/data, or fetched: tests/shared_data.py), else after the README's
no-data block, which writes stand-ins of the same layout where the ACES files are (so the same lines run).
`harness train` runs in `bash -e` after the block's own `. .venv/bin/activate`, as a user's shell runs them (the
console script the venv puts on PATH); the `harness` lines that train nothing (synth, inspect, predict, evaluate,
report) run word for word in this process, in the project's root (`predict_support.cli_in_process`: each saves a
process that imports TensorFlow). Then the report it wrote is opened in headless Chromium with the network blocked
(tests/browser.py): nothing requested, nothing failed, no console message, every plot drawn, its tables equal to
`summary.json` and `evaluation.json`."""
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
from harness.data.export.synth import ACES_BANDS
from predict_support import cli_in_process

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _blocks() -> list[str]:
    """The README's fenced blocks of the "## Quick start" section."""
    text = (ROOT / "README.md").read_text()
    section = text.partition("\n## Quick start")[2].split("\n## ", 1)[0]
    return re.findall(r"^```\n(.*?)^```$", section, re.S | re.M)


def quick_start() -> str:
    """The quick start's block: the one that trains."""
    return next(b for b in _blocks() if "harness train" in b)


def no_data() -> str:
    """The block that makes stand-ins of the ACES exports where none are (`harness synth --scene`)."""
    return next(b for b in _blocks() if "harness synth --scene" in b)


def _lines(block: str) -> list[str]:
    lines = [line for line in block.replace("\\\n", "").splitlines() if line.strip()]
    assert lines[0] == ". .venv/bin/activate", lines
    return lines


def _project(base: pathlib.Path, data: pathlib.Path | None) -> pathlib.Path:
    """A project's root in `base` (its `examples/` and `.venv` this project's), with `../shared/data` the given
    exports, or nothing there."""
    root = base / "project"
    root.mkdir(parents=True)
    if data is not None:
        (base / "shared").mkdir()
        (base / "shared" / "data").symlink_to(data.resolve())
    (root / "examples").symlink_to(ROOT / "examples")
    (root / ".venv").symlink_to(pathlib.Path(sys.prefix))
    return root


def _run(root: pathlib.Path, lines: list[str]) -> subprocess.CompletedProcess:
    """The lines in order after the block's activate line: `harness train` (and any non-harness line) in `bash
    -e`, as a user's shell runs it; the other `harness` lines in this process, in the project's root."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    stdout, stderr = [], []
    for line in lines[1:]:
        argv = shlex.split(line, comments=True)
        if argv[:1] == ["harness"] and argv[1:2] != ["train"]:     # trains nothing: in this process
            with contextlib.chdir(root):
                done = cli_in_process(*argv[1:], ok=False)
        else:                                                       # the shell, after the block's activate line
            script = root.parent / "line.sh"
            script.write_text(f"{lines[0]}\n{line}\n")
            done = subprocess.run(["bash", "-e", str(script)], cwd=root, env=env, capture_output=True, text=True,
                                  timeout=600)
        assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-3000:])
        stdout.append(done.stdout)
        stderr.append(done.stderr)
    return subprocess.CompletedProcess(lines, 0, "".join(stdout), "".join(stderr))


@pytest.fixture(scope="module")
def quick_start_run(tmp_path_factory):
    """The quick start run once, on the ACES exports when they can be had, else after the README's no-data block
    (the stand-ins it writes: each run costs ~12 CPU-s, so the one run carries every test of the quick start):
    (project root, the lines' output, whether it ran on the stand-ins)."""
    import shared_data as sd

    try:
        data = pathlib.Path(sd.shared_data_root())
    except sd.SharedDataUnavailable:
        root = _project(tmp_path_factory.mktemp("no_data"), None)
        made = _run(root, _lines(no_data()))
        done = _run(root, _lines(quick_start()))
        return root, subprocess.CompletedProcess(done.args, 0, made.stdout + done.stdout, made.stderr + done.stderr), \
            True
    root = _project(tmp_path_factory.mktemp("aces"), data)
    return root, _run(root, _lines(quick_start())), False


def test_the_quick_start_is_in_the_readmes_first_60_lines():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:60])
    assert quick_start() in head and "harness predict" in quick_start() and "harness report" in quick_start()
    assert no_data() in head and head.index(no_data()) < head.index(quick_start())
    model = (ROOT / "examples" / "pixel_mlp.py").read_text()
    assert f"```python\n{model}```" in head and len(model.splitlines()) <= 10


def test_without_the_aces_files_the_readmes_stand_ins_train_to_a_sensible_score(quick_start_run, tmp_path):
    """The README's no-data block as printed, then the quick start's `harness train` line: the points were sampled
    from the image under one class rule, so the validation split scores as a real export would (one `harness synth`
    per split with other seeds drew a rule each: val 0.34). Read from the quick start's run where it ran on the
    stand-ins; else the two lines here."""
    root, _, stand_ins = quick_start_run
    if not stand_ins:
        root = _project(tmp_path, None)
        _run(root, _lines(no_data()))
        train = [line for line in _lines(quick_start()) if line.startswith("harness train")]
        _run(root, [_lines(quick_start())[0], *train])
    points = sorted(p.name for p in (root.parent / "shared" / "data" / "gee-aces-points").iterdir())
    assert points == ["testing.tfrecord.gz", "training.tfrecord.gz", "validation.tfrecord.gz"]
    summary = json.loads((root / "runs" / "points" / "summary.json").read_text())
    assert summary["spec"]["bands"] == list(ACES_BANDS) and summary["spec"]["num_classes"] == 5
    assert summary["history"][-1]["val_accuracy"] >= 0.9, summary["history"][-1]


def test_the_quick_start_runs_as_printed_and_ends_on_a_map(quick_start_run):
    from predict_support import read_outputs

    root, done, _ = quick_start_run
    summary = json.loads((root / "runs" / "points" / "summary.json").read_text())
    assert summary["spec"]["bands"] == list(ACES_BANDS) and summary["spec"]["num_classes"] == 5
    assert len(summary["history"]) == 5 and "val_accuracy" in summary["history"][-1]
    rows = read_outputs(sorted((root / "preds").glob("*.tfrecord")))
    counts = np.bincount(np.concatenate([r["class"] for r in rows]), minlength=5)
    assert (counts > 0).sum() > 1, counts                       # a map of several classes, not one
    assert (root / "preds" / "image_2021.tif").stat().st_size > 0 and (root / "preds" / "image_2021.png").is_file()
    assert "pixels per class" in done.stdout                      # `harness inspect preds`
    assert re.search(r"; nodata \(value \d+, declared in the map\): 0 pixels$", done.stdout, re.M), done.stdout
    # the class names where GDAL finds them (and QGIS, through GDAL): gdalinfo's categories and attribute table
    from gdal_info import attribute_table, categories, gdalinfo
    info = gdalinfo(str(root / "preds" / "image_2021.tif"), "-noct")
    assert str(root / "preds" / "image_2021.tif.aux.xml") in info
    names = [f"class {i}" for i in range(5)]     # the run named none: predict's names, as the legend shows them
    assert categories(info) == names
    assert [row[:2] for row in attribute_table(info)] == [[str(i), n] for i, n in enumerate(names)]
    assert re.findall(r"<Row index=\"\d+\">\s*<F>(\d+)</F>\s*<F>([^<]+)</F>", info) == [(str(i), n)
                                                                                 for i, n in enumerate(names)]
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
    root, _, _ = quick_start_run
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
