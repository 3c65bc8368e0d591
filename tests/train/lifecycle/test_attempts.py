"""Attempts counted beside the backup (harness.train.lifecycle.attempts): a retryable fault made permanent past
HARNESS_MAX_ATTEMPTS. In-process: the count, the lines, and `harness train`'s exit code."""
import contextlib
import io
import json
from types import SimpleNamespace

import pytest

from harness.distribute import environment
from harness.distribute.context import WorkerContext
from harness.errors import AttemptsExhaustedError, ClusterConfigError, PeerLostError, PreemptedError
from harness.train.lifecycle import attempts

LOST = "worker 1 on 10.0.0.2 is lost (UnavailableError on worker 0 on 10.0.0.1 after step 21: reset)"


def test_the_limit_is_read_from_the_environment():
    assert environment.read_max_attempts({}) == 5
    assert environment.read_max_attempts({"HARNESS_MAX_ATTEMPTS": "2"}) == 2
    for bad in ("0", "two", "-1"):
        with pytest.raises(ClusterConfigError, match=f"HARNESS_MAX_ATTEMPTS='{bad}' must be a positive whole"):
            environment.read_max_attempts({"HARNESS_MAX_ATTEMPTS": bad})


def test_attempts_from_one_step_are_counted_and_the_last_makes_a_fault_permanent(tmp_path):
    backup, chief = SimpleNamespace(chief_dir=str(tmp_path / "backup")), WorkerContext.single()
    for n in (1, 2):
        attempt = attempts.begin(backup, chief, 16, 3)
        assert attempt.number == n
        assert attempt.judge(PeerLostError(LOST)).args == (LOST,)       # retryable while attempts are left
    attempt = attempts.begin(backup, chief, 32, 3)                     # the backup moved on: counted from 1
    assert attempt.number == 1
    for n in (2, 3):
        attempt = attempts.begin(backup, chief, 32, 3)
    preempted = PreemptedError("SIGTERM at step 40")
    assert attempt.judge(preempted) is preempted                       # a preemption is not counted
    attempt = attempts.begin(backup, chief, 32, 3)
    assert attempt.number == 3
    made = attempt.judge(PeerLostError(LOST))
    path = tmp_path / "backup" / "attempts.json"
    assert isinstance(made, AttemptsExhaustedError)
    assert str(made) == (f"attempt 3 of 3 from the backup at step 32: PeerLostError: {LOST}; permanent: find the "
                         f"cause in the earlier attempts' logs, then delete {path} (or raise HARNESS_MAX_ATTEMPTS) "
                         "to try again")
    with pytest.raises(AttemptsExhaustedError) as refused:             # the next one stops before its first step
        attempts.begin(backup, chief, 32, 3)
    assert str(refused.value).startswith(
        "attempt 4 of 3 from the backup at step 32: the 3 before it ended with a retryable exit (137, 138, 143) "
        f"and no backup past that step (the last one's fault: PeerLostError: {LOST}); permanent: ")
    attempts.clear(backup, chief)
    assert not path.exists() and attempts.begin(backup, chief, 32, 3).number == 1


def test_a_killed_attempt_is_counted_and_only_the_chief_counts(tmp_path):
    backup = SimpleNamespace(chief_dir=str(tmp_path / "backup"))
    (tmp_path / "backup").mkdir()
    (tmp_path / "backup" / "attempts.json").write_text(json.dumps({"step": 0, "attempt": 5}))  # a SIGKILL said nothing
    other = SimpleNamespace(is_chief=False)
    assert attempts.begin(backup, other, 0, 5).number is None
    with pytest.raises(AttemptsExhaustedError, match=r"^attempt 6 of 5 from the backup at step 0: .*fault: none "
                                                     r"recorded: a process ended by a signal \(137"):
        attempts.begin(backup, WorkerContext.single(), 0, 5)


def test_train_stops_past_the_limit_before_its_first_step_and_trains_under_a_higher_one(tmp_path, monkeypatch):
    """`harness train` in this process: attempts.json says 5 attempts started at step 0: exit 2, one line, no
    epoch; with HARNESS_MAX_ATTEMPTS=6 the same command trains and forgets the count."""
    from harness import cli
    from harness.data.export import synth

    synth.write_table_export(str(tmp_path / "data"), prefix="points", shards=1, records=16, classes=3, seed=1)
    (tmp_path / "run" / "backup").mkdir(parents=True)
    counted = tmp_path / "run" / "backup" / "attempts.json"
    counted.write_text(json.dumps({"step": 0, "attempt": 5, "cause": f"PeerLostError: {LOST}"}))
    argv = ["train", "--data", str(tmp_path / "data"), "--label", "class", "--epochs", "1", "--global-batch-size",
            "8", "--strategy", "single", "--output", str(tmp_path / "run")]
    monkeypatch.delenv("HARNESS_MAX_ATTEMPTS", raising=False)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 2, err.getvalue()[-3000:]
    assert err.getvalue().strip().splitlines()[-1].startswith(
        "harness train: AttemptsExhaustedError: attempt 6 of 5 from the backup at step 0: the 5 before it ended "
        f"with a retryable exit (137, 138, 143) and no backup past that step (the last one's fault: PeerLostError: "
        f"{LOST}); permanent: ")
    assert "epoch 1/1" not in out.getvalue()
    monkeypatch.setenv("HARNESS_MAX_ATTEMPTS", "6")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert cli.main(argv) == 0, err.getvalue()[-3000:]
    assert not counted.exists() and (tmp_path / "run" / "model.keras").exists()


def test_an_attempt_that_ends_permanent_otherwise_is_not_counted(tmp_path):
    """`settle` (harness.cli, on the way out): bad input, a traceback or Ctrl-C take the attempt out of the count;
    a retryable fault and the refusal keep it."""
    from harness.errors import ConfigError

    backup, chief = SimpleNamespace(chief_dir=str(tmp_path / "backup")), WorkerContext.single()
    path = tmp_path / "backup" / "attempts.json"
    attempts.begin(backup, chief, 8, 5).judge(PeerLostError(LOST))
    attempts.settle(PeerLostError(LOST))
    for ended in (ConfigError("bad"), ValueError("a bug"), KeyboardInterrupt()):
        assert attempts.begin(backup, chief, 8, 5).number == 2
        attempts.settle(ended)
        assert json.loads(path.read_text()) == {"step": 8, "attempt": 1, "cause": f"PeerLostError: {LOST}"}
    attempts.settle(ConfigError("no attempt of this process: nothing"))
    assert json.loads(path.read_text())["attempt"] == 1
