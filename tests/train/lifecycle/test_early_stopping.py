"""`--monitor` / `--early-stopping` (`harness.train.lifecycle.early_stopping`): the decision rule, and 2 workers stopping together
with the best epoch's model kept."""
import json
import math
import pathlib
import subprocess
import sys

import pytest

from harness.data.export import synth
from harness.errors import ConfigError
from harness.train.lifecycle.early_stopping import EarlyStopping
from harness.train.loop.controller import StopTraining


def _feed(stopper, values, key="val_mean_iou"):
    for epoch, v in enumerate(values, 1):
        logs = {key: v, "epoch": epoch}
        stopper.on_epoch_end(epoch, logs)      # before the epoch's backup: the record
        stopper.after_epoch_end(epoch, logs)   # after it: the decision


def test_patience_min_delta_and_mode():
    saved = []
    s = EarlyStopping(monitor="val_mean_iou", patience=2, min_delta=0.01, save_best=saved.append)
    with pytest.raises(StopTraining) as e:
        _feed(s, [0.50, 0.55, 0.555, 0.56, 0.70])  # +0.005 and +0.01 do not count: stop after epoch 4
    assert str(e.value) == ("early stopping at epoch 4: val_mean_iou has not improved by more than 0.01 for 2 "
                            "epochs (best 0.5500 at epoch 2)")
    assert [h["epoch"] for h in e.value.history] == [1, 2, 3, 4] and saved == [1, 2] and s.best_epoch == 2
    loss = EarlyStopping(monitor="val_loss", patience=1)
    assert loss.mode == "min"
    _feed(loss, [1.0, 0.9], key="val_loss")
    with pytest.raises(StopTraining):
        _feed(loss, [0.95], key="val_loss")
    keep = EarlyStopping(monitor="val_accuracy")  # no patience: only the best model is kept
    _feed(keep, [0.5, float("nan"), 0.4, 0.6, 0.1], key="val_accuracy")
    assert keep.best_epoch == 4 and keep.best == 0.6
    with pytest.raises(ConfigError, match=r"--monitor val_miou: not in the epoch's logs; choose one of \['epoch', "
                                          r"'val_mean_iou'\]"):
        _feed(EarlyStopping(monitor="val_miou"), [0.5])


def test_validation_metric_needs_validation_data(tmp_path, capsys):
    """`harness train` in this process (refused before any data is read)."""
    from harness import cli

    synth.write_table_export(str(tmp_path / "d"), shards=1, records=64, seed=1)
    code = cli.main(["train", "--data", str(tmp_path / "d"), "--label", "class", "--epochs", "1", "--monitor",
                     "val_mean_iou", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "ConfigError: --monitor val_mean_iou is a validation metric: give " \
                         "--validation-data" in err, err[-2000:]


def test_two_workers_stop_at_the_same_epoch_and_keep_the_best(tmp_path):
    """min-delta 1.0 on mean IoU (at most 1): only epoch 1 improves, so both workers stop after epoch 2 of 6."""
    synth.write_table_export(str(tmp_path / "train"), prefix="t", shards=2, records=512, seed=1)
    synth.write_table_export(str(tmp_path / "val"), prefix="v", shards=2, records=256, seed=2)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "harness.cli", "launch", "local", "--workers", "2", "--timeout", "400",
                        "--", sys.executable, "-m", "harness.cli", "train", "--data", str(tmp_path / "train"),
                        "--validation-data", str(tmp_path / "val"), "--label", "class", "--epochs", "6",
                        "--per-replica-batch-size", "32", "--monitor", "val_mean_iou", "--early-stopping", "1",
                        "--min-delta", "1.0", "--output", str(out)], capture_output=True, text=True, timeout=450)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    assert [h["epoch"] for h in summary["history"]] == [1, 2]
    assert summary["final_step"] == 2 * summary["plan"]["steps_per_epoch"]
    assert len(set(summary["workers_weights_sha256"])) == 1 and len(summary["workers_weights_sha256"]) == 2
    assert summary["best"] == {"monitor": "val_mean_iou", "mode": "max", "epoch": 1,
                               "value": summary["history"][0]["val_mean_iou"], "model": str(out / "best" / "model.keras")}
    assert (out / "best" / "model.keras").is_file()
    assert "early stopping at epoch 2: val_mean_iou has not improved by more than 1.0 for 1 epochs" in r.stdout
    assert not math.isnan(summary["best"]["value"])


class _Recorder:
    pass


def test_keras_callbacks_through_the_python_api(tmp_path):
    """A recording callback sees Keras' 0-based epochs and the epoch's numbers; a CSVLogger writes one row per
    epoch on the chief; the refused ones name the harness's flag; writers are left out on other workers."""
    import tensorflow as tf
    import tf_keras as keras

    from harness.distribute.context import WorkerContext
    from harness.errors import UserCodeError
    from harness.train import job
    from harness.train.loop import keras_callbacks
    from harness.train.options import TrainOptions

    class Recorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.events = []

        def on_train_begin(self, logs=None):
            self.events.append(("begin", self.model.name))

        def on_epoch_end(self, epoch, logs=None):
            self.events.append((epoch, sorted(logs)))

        def on_train_end(self, logs=None):
            self.events.append(("end",))

    synth.write_table_export(str(tmp_path / "train"), prefix="t", shards=1, records=128, seed=1)
    synth.write_table_export(str(tmp_path / "val"), prefix="v", shards=1, records=64, seed=2)
    recorder, csv = Recorder(), keras.callbacks.CSVLogger(str(tmp_path / "epochs.csv"))
    options = TrainOptions(data=(str(tmp_path / "train"),), validation_data=(str(tmp_path / "val"),), epochs=2,
                           per_replica_batch_size=32, output=str(tmp_path / "out"))
    job.run(options, data_config={"label": "class"}, callbacks=[recorder, csv],
            distribution=(tf.distribute.OneDeviceStrategy("/cpu:0"), WorkerContext.single()))
    assert recorder.events[0] == ("begin", "pixel_classifier") and recorder.events[-1] == ("end",)
    assert [e[0] for e in recorder.events[1:-1]] == [0, 1]
    assert {"loss", "val_loss", "val_accuracy", "val_mean_iou"} <= set(recorder.events[1][1])
    assert "val_confusion_matrix" not in recorder.events[1][1]  # numbers only
    rows = (tmp_path / "epochs.csv").read_text().strip().splitlines()
    assert len(rows) == 3 and rows[0].startswith("epoch,") and rows[1].startswith("0,")
    with pytest.raises(UserCodeError, match="callback ModelCheckpoint: the harness does this itself under "
                                            "distribution; use --monitor METRIC"):
        keras_callbacks.check_callbacks([keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))])
    with pytest.raises(UserCodeError, match="callback EarlyStopping: .*use --early-stopping PATIENCE"):
        keras_callbacks.check_callbacks([keras.callbacks.EarlyStopping()])
    with pytest.raises(UserCodeError, match=r"callback _Recorder: not a Keras callback \(keras.callbacks.Callback of "
                                            r"Keras 3 or tf_keras\)"):
        keras_callbacks.check_callbacks([_Recorder()])
    from harness.distribute.context import Backend
    worker = WorkerContext(1, 2, 0, 1, "worker", 1, Backend.MULTI_WORKER)
    chosen = keras_callbacks.KerasCallbacks([Recorder(), keras.callbacks.CSVLogger(str(tmp_path / "w.csv"))],
                                    keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]), worker)
    assert [type(c).__name__ for c in chosen.callbacks] == ["Recorder"]  # the writer runs on the chief only


def _early_stop_run(tmp_path, output, kill_at):
    script = pathlib.Path(__file__).parents[1] / "scripts" / "early_stop_worker.py"
    return subprocess.run([sys.executable, str(script), str(output), str(tmp_path / "train"), str(tmp_path / "val"),
                           str(kill_at)], capture_output=True, text=True, timeout=300)


def _lines(text, tag):
    return [json.loads(line.split(tag, 1)[1]) for line in text.splitlines() if line.startswith(tag)]


def test_a_run_killed_and_resumed_stops_where_an_uninterrupted_one_does(tmp_path):
    """Patience 2, min-delta 1.0 on mean IoU: only epoch 1 improves, so a run stops after epoch 3 of 6. A run killed
    (SIGKILL) right after the backup of epoch 2 and started again resumes at epoch 3 with the best value, its epoch
    and the wait of 1 from the backup: it stops after epoch 3 too, and keeps epoch 1's best model (a restarted
    wait would find epoch 3 "better" than no best, overwrite best/model.keras and run to epoch 5). The
    uninterrupted run is this process's (`job.run` with early_stop_worker.py's options, as
    test_keras_callbacks_through_the_python_api runs it); the killed one and its resumption are real processes."""
    import tensorflow as tf

    from harness.distribute.context import WorkerContext
    from harness.train import job

    synth.write_table_export(str(tmp_path / "train"), prefix="t", shards=2, records=256, seed=1)
    synth.write_table_export(str(tmp_path / "val"), prefix="v", shards=1, records=64, seed=2)
    options = job.TrainOptions(data=(str(tmp_path / "train"),), validation_data=(str(tmp_path / "val"),),
                               output=str(tmp_path / "straight"), epochs=6, per_replica_batch_size=32,
                               monitor="val_mean_iou", early_stopping=2, min_delta=1.0, steps_per_loop=4)
    straight = job.run(options, data_config={"label": "class"},
                       distribution=(tf.distribute.OneDeviceStrategy("/cpu:0"), WorkerContext.single()))
    assert [h["epoch"] for h in straight["history"]] == [1, 2, 3] and straight["best"]["epoch"] == 1

    out = tmp_path / "killed"
    killed = _early_stop_run(tmp_path, out, 2)
    assert killed.returncode == -9, killed.stderr[-3000:]
    first = _lines(killed.stdout, "EPOCH ")
    assert [e["epoch"] for e in first] == [1, 2]
    best_bytes = (out / "best" / "model.keras").read_bytes()
    resumed = _early_stop_run(tmp_path, out, 0)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (result,) = _lines(resumed.stdout, "RESULT ")
    steps = result["final_step"] // 3
    assert result["initial_step"] == 2 * steps and result["epochs"] == [3]
    assert result["best"] == {"monitor": "val_mean_iou", "mode": "max", "epoch": 1,
                              "value": first[0]["val_mean_iou"], "model": str(out / "best" / "model.keras")}
    assert "early stopping at epoch 3: val_mean_iou has not improved by more than 1.0 for 2 epochs" in resumed.stdout
    assert (out / "best" / "model.keras").read_bytes() == best_bytes  # epoch 1's model, not overwritten


@pytest.mark.parametrize("task, flags, message", [
    ("classification", dict(monitor="val_rmse", validation_data=["v"]),
     "--monitor val_rmse: not a metric of task classification (a regression metric); choose one of ['loss', "
     "'val_loss', 'val_accuracy', 'val_mean_iou']"),
    ("regression", dict(monitor="val_mean_iou", validation_data=["v"]),
     "--monitor val_mean_iou: not a metric of task regression (a classification metric); choose one of ['loss', "
     "'val_loss', 'val_rmse', 'val_mae', 'val_r2']"),
    ("classification", dict(monitor="val_bogus", validation_data=["v"]),
     "--monitor val_bogus: not a metric of task classification; choose one of ['loss', 'val_loss', 'val_accuracy', "
     "'val_mean_iou']"),
    ("regression", dict(monitor="val_r2"), "--monitor val_r2 is a validation metric: give --validation-data"),
    ("classification", dict(min_delta=0.1), "--min-delta 0.1 given without --early-stopping or --monitor: it would "
                                            "be ignored"),
    ("classification", dict(min_delta=-0.1, early_stopping=2), "--min-delta must be >= 0"),
])
def test_monitor_and_min_delta_are_checked_before_any_data(task, flags, message):
    from harness.train.lifecycle import early_stopping
    from harness.train.options import TrainOptions

    with pytest.raises(ConfigError) as e:
        early_stopping.check(TrainOptions(data=["d"], **flags), task)
    assert str(e.value).startswith(message)
    early_stopping.check(TrainOptions(data=["d"], monitor="val_rmse", validation_data=["v"], early_stopping=1, min_delta=0.1),
                  "regression")
    early_stopping.check(TrainOptions(data=["d"], monitor="loss"), "classification")
