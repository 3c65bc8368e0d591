"""Each Earth Engine layout trained as a user runs it (`harness train`, the built-in model, no layout flag but the
collapsed bands' names), on 2 workers (`harness launch local`), and the array layout on 1 worker too: the label is
cut from one plane of one array band (or the third of four collapsed bands), so only a reader that puts that plane
in the right place reaches the accuracy asserted on a held-out shard. The 1-worker array run is then predicted (no
mixer: said why no upload), exported (Earth Engine's array input shape) and checked against predict; a record
corrupted after the counts is named by file and record."""
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from predict_support import harness_cmd, run_cli

from harness import cli
from harness.data import records, synth
from harness.data import shards as S
from harness.predict.run import NO_MIXER, read_outputs

TRAIN, HELD_OUT = "export-0000[0-3].tfrecord.gz", "export-00004.tfrecord.gz"
IMAGE_FLAGS = ["--global-batch-size", 8, "--learning-rate", 0.006, "--epochs", 5]
LAYOUTS = {
    # name: (synth arguments, train flags)
    "array": (dict(kind="image", records=160, patch_size=16, bands=("B2", "ndvi", "B3"), depths={"ndvi": 4},
                   label_from="ndvi[2]"), IMAGE_FLAGS),
    "collapsed": (dict(kind="image", records=160, patch_size=16, bands=("B1", "B2", "B3", "B4"), collapse=True,
                       label_from="B3"),
                  ["--bands", "B1", "B2", "B3", "B4", "--label", "landcover", *IMAGE_FLAGS]),
    "sequence": (dict(kind="image", records=16, patch_size=16, bands=("elev", "ndvi"), depths={"ndvi": 6},
                      sequence=True, label_from="ndvi[4]"),
                 ["--global-batch-size", 64, "--learning-rate", 0.01, "--epochs", 6]),
    "table": (dict(kind="table", records=2048, bands=("a", "ts"), depths={"ts": 5}, label_from="ts[3]"),
              ["--global-batch-size", 64, "--learning-rate", 0.01, "--epochs", 6]),
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    for name, (args, _) in LAYOUTS.items():
        args = dict(args)
        write = synth.write_table_export if args.pop("kind") == "table" else synth.write_image_export
        write(str(root / name), shards=5, classes=2, **args)
    return root


_RUNS = {}


def _train(exports, name, output, workers):
    """One run per layout and worker count in the module, read by every test that needs it."""
    if (name, workers) in _RUNS:
        return _RUNS[name, workers]
    folder = exports / name
    train = ["train", "--data", folder / TRAIN, "--validation-data", folder / HELD_OUT, *LAYOUTS[name][1],
             "--output", output]
    args = train if workers == 1 else ["launch", "local", "--workers", workers, "--timeout", 300, "--",
                                       *harness_cmd(*train)]
    r = run_cli(*args)
    _RUNS[name, workers] = json.loads((output / "summary.json").read_text()), r, output
    return _RUNS[name, workers]


# Every layout on 2 workers (each worker reads its own files of the export through the sharded pipeline), and the
# array layout on 1 (the run the predict and export test reads). A record is parsed the same on 1 worker as on 2
# (one worker reads every file): the 1-worker runs of the collapsed, sequence and table layouts, each a process of
# ~5-8 CPU-s, were dropped; their assertions are the 2-worker runs' (the same accuracy, spec and message), and 1
# worker reads a table's array property in test_input_nodata_reaches_the_run_and_its_predictions and an image
# export's array band in test_the_readme_time_series_commands_run_as_printed.
RUNS = [*((name, 2) for name in LAYOUTS), ("array", 1)]


@pytest.mark.parametrize("name, workers", RUNS)
def test_each_layout_learns_a_label_only_its_right_plane_predicts(exports, tmp_path, name, workers):
    summary, r, _ = _train(exports, name, tmp_path / "run", workers)
    last = summary["history"][-1]
    assert summary["plan"]["workers"] == workers
    assert last["val_accuracy"] >= 0.9, (name, last)   # 2 equal classes: a misplaced plane gives ~0.5
    spec = summary["spec"]
    if name == "collapsed":
        assert spec["collapsed"] == {"B1": ["B1", "B2", "B3", "B4", "landcover"]}
        assert "collapsed feature 'B1' read as B1, B2, B3, B4, landcover" in r.stdout + r.stderr
    else:
        assert spec["depths"] == LAYOUTS[name][0]["depths"] and spec.get("sequence", False) == (name == "sequence")
        assert "delivered as one channel per plane" in r.stdout + r.stderr


@pytest.fixture(scope="module")
def array_run(exports, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("array_run")
    _, _, output = _train(exports, "array", tmp / "run", 1)
    if output != tmp / "run":
        shutil.copytree(output, tmp / "run")
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
    assert len(rows) == 160 and not (array_run / "pred" / "export-mixer.json").exists()
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
    """The fenced block of docs/data.md's "Time series" section, word for word, in an empty folder."""
    import pathlib
    import re
    import shlex
    import subprocess
    import sys

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    section = text.partition("\n## Time series and Earth Engine's layout options\n")[2].split("\n## ", 1)[0]
    block = re.search(r"^```\n(.*?)^```$", section, re.S | re.M).group(1)
    lines = [line for line in block.replace("\\\n", "").splitlines() if line.strip()]
    assert [shlex.split(line, comments=True)[:2] for line in lines] == [
        ["harness", "synth"], ["harness", "inspect"], ["harness", "train"], ["harness", "predict"]]
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    out = []
    for line in lines:
        r = subprocess.run(shlex.split(line, comments=True), cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, (line, r.stdout[-2000:], r.stderr[-2000:])
        out.append(r.stdout + r.stderr)
    assert "6 x 16x16 (an array band of depth 6" in out[1] and "depths: {ndvi: 6}" in out[1]
    summary = json.loads((tmp_path / "runs" / "series" / "summary.json").read_text())
    assert summary["spec"]["depths"] == {"ndvi": 6} and summary["plan"]["steps_per_epoch"] == 8
    assert len(read_outputs(sorted((tmp_path / "series-preds").glob("*.tfrecord")))) == 64


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
