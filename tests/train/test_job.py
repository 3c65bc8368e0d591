"""`harness train` refuses what would train the wrong model or lose results, with a named error and exit 2.

A refusal met before the first step (flags, config, the data's counts and labels, the backup) is run in-process
(`harness.cli.main`, as `harness train` runs it: the default strategy, nothing trained); a run that trains, or one
whose error is met mid-shard while training, is a real process."""
import json
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import tensorflow as tf

from harness import cli
from harness.data.export import synth

CLI = [sys.executable, "-m", "harness.cli"]


def _cli(*args, timeout=300):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _main(capsys, *args):
    """`harness ARGS` in this process, read as `_cli`'s result: its exit code, stdout and stderr."""
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    folder = tmp_path_factory.mktemp("points")
    synth.write_table_export(str(folder), prefix="points", shards=2, records=256, seed=5)
    return folder


def test_epochs_and_learning_rate_must_be_positive(points):
    for flag, value, message in (("--epochs", 0, "epochs must be >= 1, got 0"),
                                 ("--learning-rate", -1, "learning rate must be > 0, got -1.0")):
        r = _cli("train", "--data", points, "--label", "class", flag, value)
        assert r.returncode == 2 and f"ConfigError: {message}" in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr


def test_continuous_label_is_refused(shared_data, tmp_path, capsys):
    r = _main(capsys, "train", "--data", shared_data / "gee-aces-points" / "validation.tfrecord.gz", "--label",
              "nir_before", "--output", tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "LabelValueError" in r.stderr and "record 0: label 'nir_before' holds" in r.stderr
    assert "class ids are integers >= 0" in r.stderr


def test_rerun_and_changed_resume(tmp_path, capsys):
    """A finished run run again does nothing; with another batch size it is refused. Its first run (which trains)
    also shows a nodata label value pointed out, and trained on all the same."""
    _table(tmp_path / "d", "pts-00000.tfrecord.gz", [255.0 if i % 10 == 0 else i % 3 for i in range(300)])
    out = tmp_path / "out"
    base = ["train", "--data", tmp_path / "d", "--label", "class", "--epochs", "1", "--output", out]
    first = _cli(*base, "--global-batch-size", "50")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "warning: label 'class': the largest value 255 is far above the others (0, 1, 2): a nodata value? " \
           "It makes 256 classes" in first.stdout + first.stderr
    summary = (out / "summary.json").read_text()

    again = _main(capsys, *base, "--global-batch-size", "50")        # finished: nothing to do, nothing rewritten
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already trained 1 epochs (6 steps); nothing to do" in again.stdout
    assert (out / "summary.json").read_text() == summary

    changed = _main(capsys, "train", "--data", tmp_path / "d", "--label", "class", "--epochs", "3", "--output", out,
                    "--global-batch-size", "100")                     # 3 steps per epoch now, not 6
    assert changed.returncode == 2, changed.stderr[-3000:]
    assert "ConfigError" in changed.stderr and "was written by a different run" in changed.stderr
    assert "steps_per_epoch: backup 6, now 3" in changed.stderr


def test_interrupt_exits_cleanly(points, tmp_path):
    proc = subprocess.Popen([*CLI, "train", "--data", str(points), "--label", "class", "--epochs", "1000",
                             "--global-batch-size", "8", "--output", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal: a background job (`make test &`, nohup) would pass SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (tmp_path / "out" / "backup" / "checkpoint").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted; run the same command again to resume from the last backup" in err
    assert "Traceback" not in err


def test_value_errors_are_messages_not_tracebacks(points, capsys):
    r = _main(capsys, "plan", points, "--workers", "0", "--global-batch-size", "8")
    assert r.returncode == 2 and "harness plan: ClusterConfigError: workers (0)" in r.stderr and "Traceback" not in r.stderr
    r = _main(capsys, "train", "--config", "/nonexistent/run.yaml")
    assert r.returncode == 2 and "FileNotFoundError" in r.stderr and "Traceback" not in r.stderr


def test_launch_errors_name_the_launcher():
    r = _cli("launch", "local", "--workers", "2", "--", sys.executable, "-c", "import sys; sys.exit(4)")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and last.startswith("harness launch local: WorkerFailedError"), r.stderr
    assert "Traceback" not in r.stderr


def test_plan_matches_summary(points, tmp_path, capsys):
    r = _main(capsys, "plan", points, "--workers", "1", "--global-batch-size", "32", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["steps_per_epoch"] == 8


def test_record_missing_a_band_mid_shard_is_named_by_file_and_record(tmp_path):
    def example(i, drop=()):
        values = {"a": float(i % 7), "b": float(i % 3), "class": float(i % 2)}
        return tf.train.Example(features=tf.train.Features(feature={
            k: tf.train.Feature(float_list=tf.train.FloatList(value=[v])) for k, v in values.items() if k not in drop}))
    for shard in range(2):
        with tf.io.TFRecordWriter(str(tmp_path / f"pts-0000{shard}.tfrecord.gz"), "GZIP") as w:
            for i in range(300):
                w.write(example(i, drop=("b",) if (shard, i) == (1, 170) else ()).SerializeToString())
    r = _cli("train", "--data", tmp_path, "--label", "class", "--epochs", "1", "--global-batch-size", "32",
             "--output", tmp_path / "out")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"MissingFeatureError: {tmp_path}/pts-00001.tfrecord.gz: record 170: band 'b' declared but absent" \
        in r.stderr, r.stderr[-3000:]


def _table(folder, name, labels, bands=("a", "b")):
    """One GZIP table shard `folder/name` whose record i has label labels[i] and bands derived from it."""
    folder.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(folder / name), "GZIP") as w:
        for i, y in enumerate(labels):
            values = {b: float((i * (k + 3)) % 7) + y for k, b in enumerate(bands)}
            values["class"] = float(y)
            w.write(tf.train.Example(features=tf.train.Features(feature={
                k: tf.train.Feature(float_list=tf.train.FloatList(value=[v])) for k, v in values.items()})
            ).SerializeToString())


def test_label_outside_the_classes_mid_shard_is_named_by_file_and_record(tmp_path):
    _table(tmp_path / "d", "pts-00000.tfrecord.gz", [i % 3 for i in range(300)])
    _table(tmp_path / "d", "pts-00001.tfrecord.gz", [-1.0 if i == 211 else i % 3 for i in range(300)])
    r = _cli("train", "--data", tmp_path / "d", "--label", "class", "--epochs", "1", "--global-batch-size", "32",
             "--num-classes", "3", "--output", tmp_path / "out")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"{tmp_path}/d/pts-00001.tfrecord.gz: record 211: label 'class' holds -1.0: class ids are integers >= 0" \
        in r.stderr, r.stderr[-3000:]


def test_training_and_validation_data_must_not_share_files(points, tmp_path, capsys):
    r = _main(capsys, "train", "--data", points, "--validation-data", points / "points-00001.tfrecord.gz",
              "--label", "class", "--output", tmp_path)
    assert r.returncode == 2 and "1 file(s) are both training and validation data" in r.stderr, r.stderr[-2000:]


def test_bad_yaml_is_a_one_line_error(points, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  bands: [a, b\ntrain:\n  epochs: 1\n")
    r = _cli("train", "--data", points, "--config", bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr and f"{bad}: line 3" in r.stderr \
        and "not valid YAML" in r.stderr, r.stderr[-2000:]
    bad.write_text("data: 5\n")
    r = _cli("train", "--data", points, "--config", bad)
    assert r.returncode == 2 and "section 'data:' must be a mapping" in r.stderr, r.stderr[-2000:]


def test_export_folder_missing_a_shard_is_refused(tmp_path, capsys):
    folder = tmp_path / "img"
    synth.write_image_export(str(folder), prefix="exp", shards=3, records=12, patch_size=8, seed=1)
    (folder / "exp-00002.tfrecord.gz").unlink()  # the last shard: no gap in the indices, only the mixer knows
    r = _main(capsys, "train", "--data", folder, "--epochs", "1", "--global-batch-size", "4", "--output",
              tmp_path / "o")
    assert r.returncode == 2 and "MixerError" in r.stderr and "totalPatches 12 but the shards hold 8" in r.stderr \
        and "a shard of the export is missing or extra" in r.stderr, r.stderr[-2000:]
    r = _main(capsys, "plan", str(folder / "exp-*.tfrecord.gz"), "--global-batch-size", "4")  # a glob: a subset
    assert r.returncode == 0, r.stderr[-2000:]


# A nodata label value pointed out (a run that trains on all the same): test_rerun_and_changed_resume's first run.


def test_train_section_values_are_type_checked(points, tmp_path):
    cfg = tmp_path / "run.yaml"
    for text, message in (('train:\n  epochs: "5"\n', "train.epochs: expected an integer, got '5' (str)"),
                          ("train:\n  augment: 1\n", "train.augment: expected true or false, got 1 (int)"),
                          ("train:\n  learning_rate: fast\n", "train.learning_rate: expected a number, got 'fast'")):
        cfg.write_text(text)
        r = _cli("train", "--data", points, "--label", "class", "--config", cfg, "--output", tmp_path / "o")
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_fractional_label_mid_shard_is_not_rounded_silently(tmp_path):
    _table(tmp_path / "d", "pts-00000.tfrecord.gz", [i % 3 for i in range(300)])
    _table(tmp_path / "d", "pts-00001.tfrecord.gz", [2.5 if i == 150 else i % 3 for i in range(300)])
    r = _cli("train", "--data", tmp_path / "d", "--label", "class", "--epochs", "1", "--global-batch-size", "32",
             "--output", tmp_path / "out")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"{tmp_path}/d/pts-00001.tfrecord.gz: record 150: label 'class' holds 2.5: class ids are integers >= 0" \
        in r.stderr, r.stderr[-3000:]


def test_a_sigint_that_tensorflow_swallows_still_ends_the_run():
    """SIGINT whose KeyboardInterrupt is lost (as inside TensorFlow code that catches it): the request stays and
    the loop's next check raises it (harness.train.lifecycle.interrupt); after the block the handler and the flag are as
    before. Where SIGINT is ignored (a background job) it stays ignored."""
    import os

    from harness.train.lifecycle import interrupt

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupt.handling():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)
            except KeyboardInterrupt:
                pass  # what the swallowing library code does
            assert interrupt.requested()
            with pytest.raises(KeyboardInterrupt):
                interrupt.check()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not interrupt.requested()
        interrupt.check()  # no request left for the next run in this process
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with interrupt.handling():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            assert not interrupt.requested()
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("fault", ["PreemptedError", "PeerLostError", "StalledWorkerError"])
def test_a_worker_leaving_on_a_cluster_fault_ignores_the_launchers_sigterm(fault):
    """A worker that learned of a preemption through the all-reduce (no SIGTERM of its own), or of a lost or
    stuck peer, leaves `interrupt.handling()` with SIGTERM ignored: the launcher's stop of the workers still
    running must not kill it in its exit (before, the default handler was back and the SIGTERM ended it by signal,
    its atexit work undone: tests/launch/test_fault_tolerance.py's launch-local case, one records file missing).
    Bad input (a permanent error) leaves the previous handler."""
    from harness import errors
    from harness.train.lifecycle import interrupt

    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(getattr(errors, fault)):
            with interrupt.handling():
                raise getattr(errors, fault)("worker 1 (host h) at step 7")
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        signal.signal(signal.SIGTERM, before)
        with pytest.raises(errors.ConfigError):
            with interrupt.handling():
                raise errors.ConfigError("bad input")
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_final_save_that_fails_keeps_the_previous_model_and_the_same_command_saves_it(tmp_path, monkeypatch,
                                                                                        capsys):
    """In this process (`job.run`, one device): epoch 1 trains and saves; the command again with 2 epochs resumes,
    and its final save fails once the file is written, before it is put in place (a full disk): epoch 1's
    model.keras is kept byte for byte, no partial file is left, summary.json says the save failed, the run raises
    one line; the same command once more saves epoch 2's weights from the backup instead of saying "nothing to
    do", and a fourth time has nothing to do."""
    import dataclasses

    from harness import keras_kinds, model_code
    from harness.errors import ModelError
    from harness.train import job
    from harness.train.report.run_summary import weights_digest

    synth.write_table_export(str(tmp_path / "d"), prefix="p", shards=1, records=32, seed=2)
    out = tmp_path / "out"
    one = job.TrainOptions(data=(str(tmp_path / "d"),), epochs=1, per_replica_batch_size=16, strategy="single",
                           output=str(out))
    two = dataclasses.replace(one, epochs=2)
    job.run(one, data_config={"label": "class"})
    before = (out / "model.keras").read_bytes()
    write = model_code.write

    def full_disk(path, code):
        write(path, code)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_code, "write", full_disk)
    with pytest.raises(ModelError) as e:
        job.run(two, data_config={"label": "class"})
    monkeypatch.undo()
    error = "OSError: [Errno 28] No space left on device"
    assert str(e.value) == (f"{out}/model.keras: the final model was not saved ({error}); the previous one is kept, "
                            "and summary.json says so (model_error): run the same command again to save it from the "
                            "backup of step 4")
    assert (out / "model.keras").read_bytes() == before and not [p for p in out.iterdir() if "partial" in p.name]
    failed = json.loads((out / "summary.json").read_text())
    assert failed["model"] is None and failed["model_error"] == error and failed["final_step"] == 4
    assert f"final loss {failed['history'][-1]['loss']:.4f}; model: NOT SAVED ({error})" in capsys.readouterr().out

    job.run(two, data_config={"label": "class"})
    printed = capsys.readouterr().out
    assert (f"{out}: already trained 2 epochs (4 steps), but its last save failed ({error}): saving the model "
            "from the backup") in printed and "nothing to do" not in printed
    saved = json.loads((out / "summary.json").read_text())
    assert saved["model"] == str(out / "model.keras") and "model_error" not in saved
    assert saved["history"] == failed["history"] and saved["weights_sha256"] == failed["weights_sha256"]
    loaded = keras_kinds.load_model(str(out / "model.keras"), flag="--model")
    assert weights_digest(loaded) == failed["weights_sha256"]   # epoch 2's weights, restored from the backup

    job.run(two, data_config={"label": "class"})
    assert "already trained 2 epochs (4 steps); nothing to do" in capsys.readouterr().out
