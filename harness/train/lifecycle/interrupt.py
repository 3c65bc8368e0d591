"""SIGINT (Ctrl-C) during training: a request that the loop honours at its next call boundary.

Python's default SIGINT handler raises KeyboardInterrupt in whatever Python frame runs next. While the main thread
is inside TensorFlow (a `tf.function` call, a `tf.data` iterator, a checkpoint write) that frame can be library
code that catches it, and training then runs on as if nothing had been asked. (A run that went on to its last
epoch and exited 0 in `tests/train/test_job.py::test_interrupt_exits_cleanly` turned out to have another cause:
the test ran as a background job, whose SIGINT is ignored and inherited; an ignored SIGINT is left ignored here.)
`requested()` keeps the request: the handler still raises KeyboardInterrupt at once, and also sets a flag that
`harness.train.loop.controller.Controller.fit` checks after every call of K steps and after every epoch end, so the
interrupt ends the run within one call (AUTO_TARGET_S, ~0.1-1 s) even when the first raise is lost.

SIGTERM (Kubernetes' eviction or preemption: the pod gets SIGTERM, then SIGKILL after its grace period, 30 s by
default) raises nothing: the handler only notes the step of the call boundary it arrived after
(`terminated_at`), and `harness.train.lifecycle.preemption.Preemption` makes every worker agree on it at the next call
boundary, write a backup there and exit retryable (tf.distribute's `PreemptionCheckpointHandler` does the same
with a watcher thread and the coordination service).
"""
from __future__ import annotations

import contextlib
import signal
import threading

from harness.errors import ClusterFault

_REQUESTED = threading.Event()
_TERMINATED: list = [None]   # the call boundary (global step) SIGTERM arrived after, or None
_BOUNDARY: list = [0]        # the last call boundary passed (global step)


def requested() -> bool:
    """True once SIGINT has arrived while `handling()` was active."""
    return _REQUESTED.is_set()


def check() -> None:
    """Raise KeyboardInterrupt if SIGINT has arrived (see the module docstring)."""
    if _REQUESTED.is_set():
        raise KeyboardInterrupt


def terminated_at():
    """The global step of the call boundary SIGTERM arrived after (while `handling()` was active), or None."""
    return _TERMINATED[0]


def at_boundary(step: int) -> None:
    """Note that the run passed the call boundary after global step `step` (what `terminated_at` reports)."""
    _BOUNDARY[0] = step


@contextlib.contextmanager
def handling():
    """Within the block, SIGINT sets the request flag and raises KeyboardInterrupt, and SIGTERM notes the step
    (`terminated_at`); the previous handlers are put back and the flags cleared at the end. A process leaving the
    block on its way out of a cluster fault (a SIGTERM that reached it, or a `ClusterFault` raised in the block: a
    peer's preemption agreed through the all-reduce, a lost or stuck peer) leaves SIGTERM ignored: its backup is
    written and it is exiting retryable, and the SIGTERM its launcher sends the workers still running (`harness
    launch local`, horovodrun) must not kill it half-way through its exit (its one line, its atexit work, code
    138 instead of a signal's). The exit stays bounded by the launcher's SIGKILL after its grace period. Does
    nothing outside the main thread (where `signal.signal` is refused); an ignored SIGINT (`SIG_IGN`: a shell's
    background job, `nohup`) stays so."""
    _REQUESTED.clear()
    _TERMINATED[0] = None
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum, frame):
        _REQUESTED.set()
        raise KeyboardInterrupt

    def on_sigterm(signum, frame):
        if _TERMINATED[0] is None:
            _TERMINATED[0] = _BOUNDARY[0]

    previous = {}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_sigint)
    previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_sigterm)
    faulted = False
    try:
        yield
    except ClusterFault:
        faulted = True
        raise
    finally:
        if faulted or _TERMINATED[0] is not None:   # exiting retryable: a launcher's SIGTERM to the workers
            previous[signal.SIGTERM] = signal.SIG_IGN    # still running must not cut the exit short
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _REQUESTED.clear()
        _TERMINATED[0] = None


class Check:
    """The controller's action (`harness.train.loop.controller`) that ends the run at the next call boundary or
    epoch end after a SIGINT whose KeyboardInterrupt TensorFlow swallowed (`check`)."""

    def after_call(self, step: int) -> None:
        check()

    def after_epoch_end(self, epoch: int, logs: dict) -> None:
        check()
