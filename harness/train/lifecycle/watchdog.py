"""The step-progress watchdog: a worker that makes no step progress for `HARNESS_PEER_TIMEOUT_S` ends its run with
one `StalledWorkerError` line and exit 138 (retryable), instead of blocking without end.

Why a thread that ends the process: a worker whose peer is stuck (its input blocked) or gone without an error (its
link down under Horovod) waits inside a collective in TensorFlow's or Horovod's C++ code, which no Python exception
or signal handler interrupts; TensorFlow releases the GIL there, so this thread runs, prints the line and leaves
with `os._exit(RETRYABLE)`. Every worker runs one, so every worker ends within the bound.

The controller `beat`s after each call of K steps and `idle`s over the epoch-end work (evaluation, backup) and
before the first call, which traces the step function; both can take longer than a step without a fault. A call
itself may be long (a fixed `--steps-per-loop` of slow steps): the bound is counted from the time the longest call
so far took past the last beat, so a healthy call is never taken for a stall (bound + longest call, in all).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Optional

from harness import exit_codes
from harness.distribute import environment
from harness.errors import StalledWorkerError

# Seconds a worker whose own input is stuck waits after its line before it exits (at most a quarter of the bound):
# its peers' bounds end at about the same time (each adds its own longest call), and its exit would close their
# collectives' sockets, turning their "waits for a peer that is lost or stuck: worker N" into a lost-peer error.
LINGER_S = 5.0


class Watchdog:
    """Ends the process when `beat` is not called for `bound_s` seconds, plus the longest interval between two
    beats seen so far (the longest call), while armed.

    Args:
      bound_s: seconds without a beat (default `HARNESS_PEER_TIMEOUT_S`, else 60).
      describe: `fn(step, seconds) -> str`, the message (step: the last step beaten; seconds: since that beat).
      exit: called with `harness.exit_codes.RETRYABLE` after the line is printed (tests pass their own).
      poll_s: how often the thread looks (seconds).
      linger_s: `fn() -> seconds` to wait between the line and the exit (read after `describe`; default none):
        the worker whose own input is stuck lingers (`stalled`), so that its peers, whose bounds end at about the
        same time, name it as stuck before its exit closes their collectives' sockets.
      clock: `fn() -> seconds`, monotonic (tests pass their own, and call `check` themselves).
    """

    def __init__(self, describe: Callable[[int, float], str], *, bound_s: Optional[float] = None,
                 exit: Callable[[int], None] = os._exit, poll_s: float = 0.5,
                 linger_s: Optional[Callable[[], float]] = None, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.bound_s = bound_s if bound_s is not None else environment.read_peer_timeout_s()
        self._describe, self._exit, self._poll_s = describe, exit, min(poll_s, self.bound_s / 4)
        self._linger_s = linger_s or (lambda: 0.0)
        self._lock = threading.Lock()
        self._armed_at: Optional[float] = None
        self._step = 0
        self._longest_s = 0.0   # the longest interval between two beats with no idle between (a call's length)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="harness-watchdog", daemon=True)
        self._thread.start()

    def beat(self, step: int) -> None:
        """Step `step` completed: (re)arm with a fresh bound."""
        with self._lock:
            now = self._clock()
            if self._armed_at is not None:
                self._longest_s = max(self._longest_s, now - self._armed_at)
            self._step, self._armed_at = step, now

    def idle(self) -> None:
        """Disarm until the next `beat` (work of unbounded length without collectives of a step)."""
        with self._lock:
            self._armed_at = None

    # The controller's action (`harness.train.loop.controller`): beaten after each call, idle over the epoch's end
    # (evaluation, whose first pass traces, and the backup: not a step's length).
    def after_call(self, step: int) -> None:
        self.beat(step)

    def before_epoch_end(self, epoch: int) -> None:
        self.idle()

    def after_epoch_end(self, epoch: int, logs: dict) -> None:
        self.beat(logs["step"])

    def close(self) -> None:
        """Stop the thread (the run ended)."""
        self._stop.set()
        self._thread.join(5)

    def check(self) -> bool:
        """One look: past the bound, print the line, linger, call `exit` and return True (the thread's poll)."""
        with self._lock:
            since = None if self._armed_at is None else self._clock() - self._armed_at
            step, allowed = self._step, self.bound_s + self._longest_s
        if since is None or since <= allowed:
            return False
        print(f"harness train: {StalledWorkerError.__name__}: {self._describe(step, since)}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        self._stop.wait(self._linger_s())
        self._exit(exit_codes.RETRYABLE)
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            if self.check():
                return


def stalled(cluster, backup, bound_s: float, progress=None, data_service: str = "") -> Callable[[int, float], str]:
    """The watchdog's message for `cluster` (`harness.train.lifecycle.peers.Cluster`), `backup` and this worker's
    `progress` (`harness.train.loop.trainer.StepProgress`, read when the bound has passed):

      - inside a call, before its batch: `worker 1 on host-b has waited 20 s for the batch after step 37: its own
        input is stuck, unless a collective before the step waits for a peer (peers: worker 0 on host-a); ...`
        (seen under Horovod with a peer gone: a rank whose step ended can wait before its next batch)
      - between calls: `... it waits in a collective between calls for a peer that is lost or stuck: ...`
      - waiting inside its step: `no step progress on worker 0 on host-a for 20 s after step 37: it has its batch
        and waits in the step's all-reduce for a peer that is lost or stuck: worker 1 on host-b; ...` (the peer is
        named when there is one; with several, each names itself where it is the one waiting for its input)

    then `a re-run resumes from /out/backup at step 32; HARNESS_PEER_TIMEOUT_S=20 sets the bound`. With
    `data_service` (the dispatcher's address) the input named is the tf.data service's: its workers produce the
    batches, and one that stopped serving leaves the job waiting (with one training worker too).

    `describe.linger_s()` is LINGER_S after a description of this worker's own input stuck, with peers (it is the
    cause; they wait on it), else 0: the seconds the Watchdog waits before the exit (`Watchdog(linger_s=...)`)."""
    from harness.train.lifecycle.peers import resume_from

    cause = []

    def describe(step: int, seconds: float) -> str:
        me = cluster.describe(cluster.me)
        tail = f"{resume_from(backup)}; {environment.PEER_TIMEOUT}={bound_s:g} sets the bound"
        if progress is not None and progress.waiting_for_input():
            cause.append(bool(cluster.peers()))
            own = (f"its input, the tf.data service at {data_service}, sends no batch (a service worker stopped "
                   "serving, or the dispatcher)" if data_service else "its own input is stuck")
            return (f"{me} has waited {seconds:.0f} s for the batch after step {step}: {own}, unless "
                    f"a collective before the step waits for a peer (peers: {cluster.peers() or 'none'}); {tail}")
        if progress is not None:
            many = len(cluster.names) > 2
            where = "it has its batch and waits in the step's all-reduce" if progress.in_call else (
                "it waits in a collective between calls")
            return (f"no step progress on {me} for {seconds:.0f} s after step {step}: {where} for a peer that is "
                    f"lost or stuck: {cluster.peers() or 'none'}"
                    f"{' (the stuck one names itself in its own log)' if many else ''}; {tail}")
        return (f"no step progress on {me} for {seconds:.0f} s after step {step}: a peer is lost or stuck, or this "
                f"worker's own step or input is (peers: {cluster.peers() or 'none'}); {tail}")

    describe.linger_s = lambda: min(LINGER_S, bound_s / 4) if cause and cause[-1] else 0.0
    return describe
