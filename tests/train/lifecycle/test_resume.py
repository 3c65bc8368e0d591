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
