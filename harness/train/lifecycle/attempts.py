"""Attempts counted beside the backup: a retryable fault that keeps coming back becomes permanent.

Under `restartPolicy: ExitCode` the operators recreate a pod that exits 137 or 138 without end and never count it
against `backoffLimit` (kubeflow/trainer#2045): a worker killed by the OOM killer at the same batch, or a peer
lost on every attempt, restarted for days. The chief counts the attempts that start from the same backup step
(`attempts.json` beside the backup; an attempt that moved the backup on starts the count again at 1):

- the attempt numbered `HARNESS_MAX_ATTEMPTS` (default 5) turns a retryable fault of its own
  (`harness.errors.ClusterFault`: 138) into `AttemptsExhaustedError` (exit 2), said in its line:
  `attempt 5 of 5 from the backup at step 16: PeerLostError: ...; permanent: ...`;
- an attempt past it (the one after a process that could not say so: a SIGKILL's 137, the watchdog's 138) stops
  before its first step with the same error, naming the last attempt's fault where one was recorded.

A preemption (`PreemptedError`: SIGTERM) is not counted.
A run that ends well deletes the count; one that ends permanent otherwise (bad input, a NaN loss, a traceback) or by
Ctrl-C is taken out of it (`settle`, from `harness.cli`): the operators do not restart those. Delete `attempts.json` (or raise the limit) to allow more attempts.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from harness.errors import AttemptsExhaustedError, ClusterFault, PreemptedError
from harness.train.lifecycle import beside_backup

FILE = "attempts.json"
UNSAID = "none recorded: a process ended by a signal (137: the OOM killer, an eviction) or by the step watchdog (138)"


def _path(backup) -> Optional[str]:
    return beside_backup.path(backup, FILE)


def _read(path: Optional[str]) -> Optional[dict]:
    found = beside_backup.read(path)
    return found if found and isinstance(found.get("step"), int) and isinstance(found.get("attempt"), int) else None


_write = beside_backup.write


@dataclasses.dataclass
class Attempt:
    """This run's attempt: `number` of `limit` from the backup at `step` (number None: not the chief, which
    alone counts)."""

    number: Optional[int]
    limit: int
    step: int
    path: Optional[str] = None
    before: Optional[str] = None   # the last attempt's fault, as recorded

    def uncount(self) -> None:
        """Take this attempt back out of the count (it ended in a way a restart does not repeat)."""
        if self.number is not None:
            _write(self.path, {"step": self.step, "attempt": self.number - 1,
                               **({"cause": self.before} if self.before else {})})

    def _remedy(self) -> str:
        return (f"permanent: find the cause in the earlier attempts' logs, then delete {self.path} (or raise "
                "HARNESS_MAX_ATTEMPTS) to try again")

    def judge(self, fault: BaseException) -> BaseException:
        """The error to raise for `fault`: on the last attempt allowed, a `ClusterFault` becomes
        `AttemptsExhaustedError` (permanent); the fault is recorded for the next attempt's line."""
        if self.number is None or not isinstance(fault, ClusterFault):
            return fault
        said = f"{type(fault).__name__}: {fault}"
        if isinstance(fault, PreemptedError):   # the cluster's doing, not the run's: not counted
            self.uncount()
            return fault
        _write(self.path, {"step": self.step, "attempt": self.number, "cause": said})
        if self.number < self.limit:
            return fault
        return AttemptsExhaustedError(f"attempt {self.number} of {self.limit} from the backup at step {self.step}: "
                                      f"{said}; {self._remedy()}")


def begin(backup, context, step: int, limit: int) -> Attempt:
    """Count this attempt (the chief, beside `backup`), resuming at global step `step`.

    Raises:
      AttemptsExhaustedError: past `limit` attempts from that step."""
    path = _path(backup)
    if not context.is_chief or path is None:
        return Attempt(None, limit, step)
    before = _read(path)
    same = before is not None and before["step"] == step
    number = before["attempt"] + 1 if same else 1
    cause = before.get("cause") if same else None
    attempt = Attempt(number, limit, step, path, cause)
    if number > limit:   # not counted: a higher limit lets the next attempt run
        raise AttemptsExhaustedError(
            f"attempt {number} of {limit} from the backup at step {step}: the {number - 1} before it ended with "
            "a retryable exit (137, 138, 143) and no backup past that step"
            f" (the last one's fault: {cause or UNSAID}); {attempt._remedy()}")
    _write(path, {"step": step, "attempt": number})   # the cause of this one, if it can say it: `Attempt.judge`
    _current[0] = attempt
    return attempt


_current: list = [None]   # this process's counted attempt, for `settle`


def settle(error: BaseException) -> None:
    """How this process's attempt ended, as `harness.cli` sees it: one that ends permanent otherwise (bad input, a
    NaN loss, a bug's traceback) or by Ctrl-C is taken out of the count, since the operators do not restart it (a
    person fixing a run is not refused); a retryable fault, and the refusal itself, stay counted."""
    attempt, _current[0] = _current[0], None
    if attempt is not None and not isinstance(error, (ClusterFault, AttemptsExhaustedError)):
        attempt.uncount()


def clear(backup, context) -> None:
    """Forget the count (the chief, once a run ends well)."""
    _current[0] = None
    beside_backup.remove(_path(backup), context)
