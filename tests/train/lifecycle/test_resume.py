"""The rule for resuming a backup on another number of workers (`harness.train.lifecycle.resume.check_workers`), case by case
on the fingerprints `harness.train.job._fingerprint` writes; the runs themselves are in
tests/launch/test_fault_tolerance.py."""
import pytest

from harness.errors import ConfigError
from harness.train.lifecycle import resume


def _print(workers, replicas, global_batch, steps, records=256):
    return {"workers": workers, "replicas_per_worker": replicas, "global_batch_size": global_batch,
            "steps_per_epoch": steps, "records": records}


def test_the_same_workers_and_a_backup_without_counts_pass_silently():
    assert resume.check_workers(_print(2, 1, 16, 16), _print(2, 1, 16, 16), 20, "out/backup") is None
    old = {k: v for k, v in _print(2, 1, 16, 16).items() if k not in resume.COUNT_KEYS}
    assert resume.check_workers(old, _print(1, 1, 16, 16), 32, "out/backup") is None


def test_an_epoch_end_with_the_same_global_batch_continues_on_more_replicas_and_says_so():
    note = resume.check_workers(_print(1, 1, 16, 16), _print(2, 2, 16, 16), 48, "out/backup")
    assert note == ("out/backup: written by 1 worker at the end of epoch 3, continued on 2 workers x 2 replicas: "
                    "the same global batch 16 and 16 steps per epoch; epoch 4 on is planned on the 2 workers")


def test_a_global_batch_the_new_replicas_cannot_split_names_only_the_old_workers():
    with pytest.raises(ConfigError) as e:
        resume.check_workers(_print(2, 1, 18, 14), _print(4, 1, 36, 7), 28, "out/backup")
    assert str(e.value) == (
        "out/backup was written by 2 workers (global batch 18, 14 steps per epoch); now 4 workers (global batch 36, "
        "7 steps per epoch): resuming would change the steps of an epoch; resume with 2 workers (harness launch "
        "local --workers 2, horovodrun -np 2), or use a new --output")


def test_the_same_global_batch_with_other_steps_per_epoch_is_refused():
    # the same global batch, but 3 workers keep fewer records of their uneven files: 15 steps, not 16
    with pytest.raises(ConfigError, match=r"now 3 workers \(global batch 16, 15 steps per epoch\)"):
        resume.check_workers(_print(2, 1, 16, 16), _print(3, 1, 16, 15), 32, "out/backup")


def _backup(folder, **changes):
    """A backup of one variable in `folder`, its fingerprint a one-worker run's with `changes`."""
    import dataclasses

    import tensorflow as tf

    from harness.distribute.context import WorkerContext
    from harness.train.lifecycle.backup import Backup, Fingerprint

    fingerprint = Fingerprint(steps_per_epoch=4, global_batch_size=8, records=32, label="class", bands=["a"],
                              input_shape="(1,)", policy="float32", workers=1, replicas_per_worker=1)
    return Backup(str(folder), WorkerContext.single(), fingerprint=dataclasses.replace(fingerprint, **changes),
                  weight=tf.Variable(1.0))


def test_a_backup_of_a_model_of_the_other_keras_kind_is_refused_by_name(tmp_path):
    _backup(tmp_path, keras="keras3").save(4)
    with pytest.raises(ConfigError, match=r"different run \(keras: backup 'keras3', now 'tf_keras'\); resume with "
                                          r"the same data, batch size, precision and model"):
        _backup(tmp_path).restore()
    assert _backup(tmp_path, keras="keras3").restore() == 4


def test_a_fact_an_older_backup_did_not_record_is_not_compared(tmp_path):
    import json

    _backup(tmp_path, keras="keras3").save(4)
    path = next(tmp_path.rglob("run.json"))
    saved = json.loads(path.read_text())
    del saved["keras"]                      # as written before the fingerprint named the Keras kind
    path.write_text(json.dumps(saved))
    assert _backup(tmp_path).restore() == 4
