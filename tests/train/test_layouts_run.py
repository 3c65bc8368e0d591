"""Each Earth Engine layout trained as a user runs it (`harness train`, the built-in model, no layout flag but the
collapsed bands' names), on 2 workers (`harness launch local`, the layouts one after the other in one launch): the
label is cut from one plane of one array band (or the third of four collapsed bands), so only a reader that puts that
plane in the right place reaches the accuracy asserted on a held-out shard. The array run is then predicted (no
mixer: said why no upload), exported (Earth Engine's array input shape) and checked against predict; docs/data.md's
time-series block trains an array band on 1 worker; a record corrupted after the counts is named by file and
record."""
import json
import os
import pathlib
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf
from predict_support import cli_in_process, read_outputs, run_cli

from harness import cli
from harness.data.export import records, synth
from harness.data.export import shards as S
from harness.predict.upload import NO_MIXER

TRAIN, HELD_OUT = "export-0000[0-3].tfrecord.gz", "export-00004.tfrecord.gz"
TRAIN_RUNS = pathlib.Path(__file__).resolve().parent / "scripts" / "train_runs.py"
# 2 epochs each (an epoch of a 2-worker run, its steps, validation and backup, costs 1.5-3 CPU-s): 320 patches (256
# trained, 32 steps an epoch) over 2 epochs reach 0.93-0.97 on 2 workers and on 1, as 160 over 5 did
# (0.93-0.97); the sequence and table layouts score 0.98 from their first epoch (they ran 6).
IMAGE_RECORDS = 320
IMAGE_FLAGS = ["--global-batch-size", 8, "--learning-rate", 0.006, "--epochs", 2]
LAYOUTS = {
    # name: (synth arguments, train flags)
    "array": (dict(kind="image", records=IMAGE_RECORDS, patch_size=16, bands=("B2", "ndvi", "B3"),
                   depths={"ndvi": 4}, label_from="ndvi[2]"), IMAGE_FLAGS),
    "collapsed": (dict(kind="image", records=IMAGE_RECORDS, patch_size=16, bands=("B1", "B2", "B3", "B4"),
                       collapse=True, label_from="B3"),
                  ["--bands", "B1", "B2", "B3", "B4", "--label", "landcover", *IMAGE_FLAGS]),
    "sequence": (dict(kind="image", records=16, patch_size=16, bands=("elev", "ndvi"), depths={"ndvi": 6},
                      sequence=True, label_from="ndvi[4]"),
                 ["--global-batch-size", 64, "--learning-rate", 0.01, "--epochs", 2]),
    "table": (dict(kind="table", records=2048, bands=("a", "ts"), depths={"ts": 5}, label_from="ts[3]"),
              ["--global-batch-size", 64, "--learning-rate", 0.01, "--epochs", 2]),
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    for name, (args, _) in LAYOUTS.items():
        args = dict(args)
        write = synth.write_table_export if args.pop("kind") == "table" else synth.write_image_export
        write(str(root / name), shards=5, classes=2, **args)
    return root


@pytest.fixture(scope="module")
def runs(exports, tmp_path_factory):
    """Every layout trained on 2 workers in one launch (`harness launch local`), one layout after the other in
    each worker's process, each through `harness train`'s CLI (tests/train/scripts/train_runs.py: the launch and
    the workers' start paid once, ~4 CPU-s less a layout than a launch each): per layout its summary, its lines of
    the output and its run folder."""
    root = tmp_path_factory.mktemp("runs")
    args = []
    for name in LAYOUTS:
        folder = exports / name
        args += [*(["---"] if args else []), "--data", folder / TRAIN, "--validation-data", folder / HELD_OUT,
                 *LAYOUTS[name][1], "--output", root / name]
    r = run_cli("launch", "local", "--workers", 2, "--timeout", 540, "--", sys.executable, TRAIN_RUNS, *args,
                timeout=600)
    lines, at = {}, {}   # each run's lines (every worker's), and the run each worker is in
    for line in r.stdout.splitlines():
        worker, _, text = line.partition("] ")
        if text.startswith("RUN "):
            at[worker] = int(text[4:])
        else:
            lines.setdefault(at.get(worker), []).append(line)
    return {name: (json.loads((root / name / "summary.json").read_text()), "\n".join(lines.get(i, [])),
                   root / name) for i, name in enumerate(LAYOUTS)}


# Every layout on 2 workers (each worker reads its own files of the export through the sharded pipeline). A record
# is parsed the same on 1 worker as on 2 (one worker reads every file): the 1-worker runs of the layouts, each a
# process of ~5-9 CPU-s, were dropped (the array layout's last, its run now the 2-worker one that the predict and
# export test reads); their assertions are the 2-worker runs' (the same accuracy, spec and message), and 1 worker
# reads a table's array property in test_input_nodata_reaches_the_run_and_its_predictions and an image export's
# array band in test_the_readme_time_series_commands_run_as_printed (its spec and message asserted there).
RUNS = [(name, 2) for name in LAYOUTS]


@pytest.mark.parametrize("name, workers", RUNS)
def test_each_layout_learns_a_label_only_its_right_plane_predicts(runs, name, workers):
    summary, out, _ = runs[name]
    last = summary["history"][-1]
    assert summary["plan"]["workers"] == workers
    assert last["val_accuracy"] >= 0.9, (name, last)   # 2 equal classes: a misplaced plane gives ~0.5
    spec = summary["spec"]
    if name == "collapsed":
        assert spec["collapsed"] == {"B1": ["B1", "B2", "B3", "B4", "landcover"]}
        assert "collapsed feature 'B1' read as B1, B2, B3, B4, landcover" in out
    else:
        assert spec["depths"] == LAYOUTS[name][0]["depths"] and spec.get("sequence", False) == (name == "sequence")
        assert "delivered as one channel per plane" in out


@pytest.fixture(scope="module")
def array_run(runs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("array_run")
    shutil.copytree(runs["array"][2], tmp / "run")
    return tmp


def _main(capsys, *args) -> str:
    """`harness ARGS` in this process (predict and export train nothing): its stdout; exit 0 asserted."""
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    assert code == 0, out.out[-3000:] + out.err[-3000:]
    return out.out


def test_predict_and_the_exported_model_agree_on_an_array_band_export_without_a_mixer(exports, array_run, capsys):
    """maxMaskedRatio < 1: Earth Engine writes no mixer. Predict still writes every patch in order, says why
    there is no upload line; the SavedModel takes the array band as Earth Engine sends it ([tile, tile, depth])."""
    data = array_run / "no-mixer"
    shutil.copytree(exports / "array", data)
    os.remove(data / "export-mixer.json")
    out = _main(capsys, "predict", "--model", array_run / "run", "--data", data, "--output", array_run / "pred")
    assert NO_MIXER in out and "earthengine upload" not in out
    rows = read_outputs(sorted((array_run / "pred").glob("*.tfrecord")))
    assert len(rows) == IMAGE_RECORDS and not (array_run / "pred" / "export-mixer.json").exists()
    exported = _main(capsys, "export", "--format", "savedmodel", "--model", array_run / "run", "--output",
                     array_run / "sm")
    assert 'inputShapes={"ndvi": [4]}' in exported
    (shard, *_) = S.discover_shards(str(data))
    examples = records.first_examples(shard, 4)
    labels = np.stack([np.reshape(e.features.feature["landcover"].float_list.value, (16, 16)) for e in examples])

    def band(name, depth):
        v = np.stack([np.asarray(e.features.feature[name].float_list.value, np.float32) for e in examples])
        v = v.reshape(len(examples), depth, 16, 16)   # CHW as stored; Earth Engine sends HWC
        return np.transpose(v, [0, 2, 3, 1]) if depth > 1 else v[:, 0]
    serve = tf.saved_model.load(str(array_run / "sm")).signatures["grpc"]
    served = serve(B2=band("B2", 1), B3=band("B3", 1), ndvi=band("ndvi", 4))["class"].numpy()
    predicted = np.stack([row["class"].reshape(16, 16) for row in rows[:4]])
    np.testing.assert_array_equal(served, predicted)
    assert (predicted == labels).mean() >= 0.9


def test_a_record_corrupted_after_the_counts_is_named_by_file_and_record(exports, tmp_path):
    """A mount returning a bad block once training began (tensorflow/tensorflow#36802): the validation shard
    counted, then one byte flipped (its size and time kept, so the count is reused) and met at the first
    evaluation. The run ends naming the file and the record, with the permanent exit code."""
    val = tmp_path / "val-00000.tfrecord"
    synth.write_table_export(str(tmp_path / "v"), records=600, bands=("a", "ts"), depths={"ts": 5}, classes=2,
                             label_from="ts[3]", compressed=False)
    shutil.move(tmp_path / "v" / "export.tfrecord", val)
    assert cli.main(["inspect", str(val)]) == 0   # counts it (the cached index, on disk), in this process
    stat, raw = os.stat(val), bytearray(val.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    val.write_bytes(bytes(raw))
    os.utime(val, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    r = run_cli("train", "--data", exports / "table" / TRAIN, "--validation-data", val, "--epochs", 1,
                "--global-batch-size", 64, "--output", tmp_path / "run", ok=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"CorruptShardError: {val}: corrupt record after 300 good records (last good record index 299)" \
        in r.stderr, r.stderr[-2000:]
    assert "epoch 1/1" not in r.stdout   # met at the epoch's evaluation, before its line


def test_the_readme_time_series_commands_run_as_printed(tmp_path):
    """The fenced block of docs/data.md's "Time series" section, word for word, in a folder holding only the
    project's examples/: `harness train` a process of its own, as printed (the second with a time axis, from the
    examples' YAML and model); synth, inspect and predict, which train nothing, in this process
    (`predict_support.cli_in_process`: each saves a process that imports TensorFlow)."""
    import contextlib
    import re
    import shlex
    import subprocess

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    section = text.partition("\n## Time series and Earth Engine's layout options\n")[2].split("\n## ", 1)[0]
    block = re.search(r"^```\n(.*?)^```$", section, re.S | re.M).group(1)
    lines = [line for line in block.replace("\\\n", "").splitlines() if line.strip()]
    assert [shlex.split(line, comments=True)[:2] for line in lines] == [
        ["harness", "synth"], ["harness", "inspect"], ["harness", "train"], ["harness", "predict"],
        ["harness", "train"]]
    (tmp_path / "examples").symlink_to(pathlib.Path(__file__).resolve().parents[2] / "examples")   # the root's
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    out = []
    for line in lines:
        argv = shlex.split(line, comments=True)
        if argv[1] == "train":
            r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        else:
            with contextlib.chdir(tmp_path):
                r = cli_in_process(*argv[1:], ok=False)
        assert r.returncode == 0, (line, r.stdout[-2000:], r.stderr[-2000:])
        out.append(r.stdout + r.stderr)
    assert "6 x 16x16 (an array band of depth 6" in out[1] and "depths: {ndvi: 6}" in out[1]
    summary = json.loads((tmp_path / "runs" / "series" / "summary.json").read_text())
    assert summary["spec"]["depths"] == {"ndvi": 6} and summary["plan"]["steps_per_epoch"] == 8
    assert summary["plan"]["workers"] == 1 and "delivered as one channel per plane" in out[2]   # as the layouts' runs
    assert len(read_outputs(sorted((tmp_path / "series-preds").glob("*.tfrecord")))) == 64
    # the planes as a time axis: the model example's input [time, height, width, bands], and it learns
    timed = json.loads((tmp_path / "runs" / "series-time" / "summary.json").read_text())
    assert timed["spec"]["group_delivery"] == "time" and timed["spec"]["depths"] == {"ndvi": 6}
    assert timed["spec"]["band_groups"] == {f"t{i}": [f"ndvi[{i}]"] for i in range(6)}   # a step per plane
    assert timed["run"]["model_file"] == "examples/temporal_patch.py:build"
    import keras
    model = keras.models.load_model(tmp_path / "runs" / "series-time" / "model.keras", compile=False)
    assert tuple(model.input_shape) == (None, 6, 16, 16, 1) and tuple(model.output_shape) == (None, 16, 16, 4)
    assert timed["history"][-1]["loss"] < timed["history"][0]["loss"], timed["history"]


def test_input_nodata_reaches_the_run_and_its_predictions(tmp_path, capsys):
    """`--input-nodata 0` on a table whose array property is padded with Earth Engine's defaultValue 0 in half
    its rows: the run's spec (summary.json, and the model's for predict) delivers the padding as the mean of the
    measured values (~1500 here; ~750 if the padding were averaged in)."""
    rng = np.random.default_rng(0)
    values = rng.uniform(1000, 2000, size=(1024, 4)).round()
    values[::2, 3] = 0   # padded: the array was 3 long at these points
    data = tmp_path / "pts.tfrecord.gz"
    with tf.io.TFRecordWriter(str(data), "GZIP") as w:
        for v in values:
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "ts": tf.train.Feature(int64_list=tf.train.Int64List(value=v.astype(np.int64))),
                "class": tf.train.Feature(float_list=tf.train.FloatList(value=[float(v[1] > 1500)]))}))
                .SerializeToString())
    run_cli("train", "--data", data, "--label", "class", "--input-nodata", 0, "--epochs", 1,
            "--global-batch-size", 64, "--output", tmp_path / "run")
    fill = json.loads((tmp_path / "run" / "summary.json").read_text())["spec"]["input_fill"]
    assert set(fill) == {"ts[0]", "ts[1]", "ts[2]", "ts[3]"}
    assert all(1400 < f < 1600 for f in fill.values()), fill
    out = _main(capsys, "predict", "--model", tmp_path / "run", "--data", data, "--output", tmp_path / "pred",
                "--format", "tfrecord")
    assert "1024 rows" in out
