"""SIGINT (Ctrl-C) during training: a request that the loop honours at its next call boundary.

Python's default SIGINT handler raises KeyboardInterrupt in whatever Python frame runs next. While the main thread
is inside TensorFlow (a `tf.function` call, a `tf.data` iterator, a checkpoint write) that frame can be library
code that catches it, and training then runs on as if nothing had been asked. (A run that went on to its last
epoch and exited 0 in `tests/train/test_job.py::test_interrupt_exits_cleanly` turned out to have another cause:
the test ran as a background job, whose SIGINT is ignored and inherited; an ignored SIGINT is left ignored here.)
`requested()` keeps the request: the handler still raises KeyboardInterrupt at once, and also sets a flag that
`harness.train.controller.Controller.fit` checks after every call of K steps and after every epoch end, so the interrupt
ends the run within one call (AUTO_TARGET_S, ~0.1-1 s) even when the first raise is lost.
"""
from __future__ import annotations

import contextlib
import signal
import threading

_REQUESTED = threading.Event()


def requested() -> bool:
    """True once SIGINT has arrived while `handling()` was active."""
    return _REQUESTED.is_set()


def check() -> None:
    """Raise KeyboardInterrupt if SIGINT has arrived (see the module docstring)."""
    if _REQUESTED.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def handling():
    """Within the block, SIGINT sets the request flag and raises KeyboardInterrupt; the previous handler is put
    back and the flag cleared at the end. Does nothing outside the main thread (where `signal.signal` is refused)
    and where SIGINT is ignored (`SIG_IGN`: a shell's background job, `nohup`), which stays so."""
    _REQUESTED.clear()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        yield
        return

    def on_sigint(signum, frame):
        _REQUESTED.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _REQUESTED.clear()
