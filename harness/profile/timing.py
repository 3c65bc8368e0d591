"""Per-step timing of the training loop: time waiting for input vs time computing.

A step's input wait is the time `next(iterator)` blocks (the input pipeline did not have the batch ready); its
compute time runs from then until the step's loss is on the host (the step is synchronous, so this covers the
device work). Input-stall share = sum(input wait) / sum(step time) over the timed (post-warm-up) steps; the
TensorFlow profiler's input-pipeline analyzer reports the same ratio and calls a run highly input-bound at >= 20%
and moderately at >= 5% (tensorflow.org/guide/data_performance_analysis).
"""
from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass(frozen=True)
class StepTime:
    """One training step. Times in seconds since the timer started (`start_s`) or as durations."""

    step: int
    start_s: float
    input_wait_s: float
    compute_s: float
    examples: int
    warmup: bool = False

    @property
    def step_s(self) -> float:
        return self.input_wait_s + self.compute_s


class StepTimer:
    """Collects `StepTime`s. The first `warmup_steps` (tracing, cache filling) are kept but excluded from `summary`.

    Use: `t = timer.begin(); batch = next(it); timer.got_input(t); ...run step...; timer.end(t, step, examples)`.
    """

    def __init__(self, warmup_steps: int = 2):
        self.warmup_steps = warmup_steps
        self.steps: list[StepTime] = []
        self._origin = time.perf_counter()

    def begin(self) -> list[float]:
        return [time.perf_counter()]

    def got_input(self, mark: list[float]) -> None:
        mark.append(time.perf_counter())

    def end(self, mark: list[float], step: int, examples: int) -> StepTime:
        now = time.perf_counter()
        t0, t1 = mark
        st = StepTime(step, t0 - self._origin, t1 - t0, now - t1, examples, len(self.steps) < self.warmup_steps)
        self.steps.append(st)
        return st

    def summary(self, steps: list[StepTime] | None = None) -> dict:
        """Totals over `steps` (default: all) minus warm-up: examples/s, input-stall share, mean step time (s).

        Warm-up steps are excluded unless `steps` holds nothing else."""
        steps = self.steps if steps is None else steps
        timed = [s for s in steps if not s.warmup] or list(steps)
        wait = sum(s.input_wait_s for s in timed)
        total = sum(s.step_s for s in timed)
        examples = sum(s.examples for s in timed)
        return {
            "steps": len(timed),
            "warmup_steps": len(steps) - len(timed),
            "examples_per_s": examples / total if total > 0 else 0.0,
            "input_stall_share": wait / total if total > 0 else 0.0,
            "mean_step_s": total / len(timed) if timed else 0.0,
            "input_wait_s": wait,
            "compute_s": total - wait,
        }
