"""What the chief shows while an epoch runs: a progress bar on a terminal, else one line every interval.

A pod's log (`kubectl logs`), `nohup`, a pipe or `harness launch local` (whose workers' output is a pipe) is not a
terminal: a bar drawn there is either nothing (tqdm's `disable`) or carriage returns a log cannot hold, and an
epoch of an hour is an hour of silence. There, every `interval_s` seconds (`--progress-every`, 30 by default; 0:
none) the chief prints

    epoch 2/5 step 1200/4000 (30%): loss 0.4312 | 1,234 examples/s, input stall 12.0%, ETA 9m02s

(examples/s and the input stall over the epoch's steps so far, warm-up left out as in the epoch's line; the ETA is
the epoch's remaining steps at the epoch's mean step time). Other workers print nothing.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

DEFAULT_INTERVAL_S = 30.0   # seconds between two lines where the output is not a terminal (`--progress-every`)


def eta(seconds: float) -> str:
    """`1h02m`, `9m02s` or `41s` for a number of seconds (rounded to whole seconds)."""
    s = int(round(max(0.0, seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """The progress of one epoch on the chief (`Controller.fit` makes one per epoch).

    Args:
      is_chief: only the chief shows anything.
      epoch, epochs: the epoch (from 1) and the run's epochs.
      steps: the epoch's steps.
      interval_s: seconds between lines where `stream` is not a terminal; 0 or None: no lines.
      stream: where the bar or the lines go (default: the bar on stderr, the lines on stdout, as the epoch lines).
    """

    def __init__(self, *, is_chief: bool, epoch: int, epochs: int, steps: int,
                 interval_s: Optional[float] = DEFAULT_INTERVAL_S, stream: Optional[TextIO] = None):
        self.epoch, self.epochs, self.steps = epoch, epochs, steps
        self.bar = self.stream = None
        if not is_chief:
            return
        if sys.stderr.isatty() and stream is None:
            from tqdm import tqdm
            self.bar = tqdm(total=steps, desc=f"epoch {epoch}/{epochs}", leave=False)
        elif interval_s:
            self.stream, self.interval_s = stream or sys.stdout, float(interval_s)
            self.next_line = time.monotonic() + self.interval_s

    def update(self, done: int, k: int, loss: float, summary) -> None:
        """After a call of `k` steps: `done` steps of the epoch run, `loss` the call's last step's; `summary`: a
        function returning the epoch's `StepTimer.summary` so far, called only when a line is due."""
        if self.bar is not None:
            self.bar.update(k)
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        elif self.stream is not None and time.monotonic() >= self.next_line:
            self.stream.write(self.line(done, loss, summary()) + "\n")
            self.stream.flush()
            self.next_line = time.monotonic() + self.interval_s

    def line(self, done: int, loss: float, timing: dict) -> str:
        """`epoch 2/5 step 1200/4000 (30%): loss 0.4312 | 1,234 examples/s, input stall 12.0%, ETA 9m02s`."""
        text = f"epoch {self.epoch}/{self.epochs} step {done}/{self.steps} ({done / max(self.steps, 1):.0%}): " \
               f"loss {loss:.4f}"
        if timing.get("steps"):
            text += (f" | {timing['examples_per_s']:,.0f} examples/s, input stall "
                     f"{100 * timing['input_stall_share']:.1f}%, ETA {eta((self.steps - done) * timing['mean_step_s'])}")
        return text

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
