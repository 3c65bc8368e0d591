"""Per-step timing of the training loop: time waiting for input vs time computing.

A step's input wait is the time `next(iterator)` blocks (the input pipeline did not have the batch ready); its
compute time runs from then until the step's loss is on the host (the step is synchronous, so this covers the
device work). Input-stall share = sum(input wait) / sum(step time) over the timed (post-warm-up) steps; the
TensorFlow profiler's input-pipeline analyzer reports the same ratio and calls a run highly input-bound at >= 20%
and moderately at >= 5% (tensorflow.org/guide/data_performance_analysis).

When K steps run in one `tf.function` call (`steps_per_loop`), the host sees only the call: the loop times each
step's `next(iterator)` and the step itself in the graph (`tf.timestamp()`, seconds) and `end_call` records one
`StepTime` per step from them; what the call took on the host beyond the steps' sum (dispatch, the wait for the
losses) is compute of the call's first step, so the steps of a call add up to its wall time.
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
    call_steps: int = 1   # steps in the tf.function call this step ran in (K)

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

    def end_call(self, mark: list[float], first_step: int, waits_s, durations_s, examples: int) -> list[StepTime]:
        """Record the steps `first_step, first_step + 1, ...` of one call begun at `mark` (`begin()`).

        Args:
          waits_s: per step, seconds its `next(iterator)` took, timed in the graph.
          durations_s: per step, seconds from its start to its update, timed in the graph.
          examples: examples per step.
        """
        now = time.perf_counter()
        t0 = mark[0]
        overhead = max(0.0, (now - t0) - sum(durations_s))
        start, recorded = t0 - self._origin, []
        for i, (wait, duration) in enumerate(zip(waits_s, durations_s)):
            wait = max(0.0, wait)
            compute = max(0.0, duration - wait) + (overhead if i == 0 else 0.0)
            st = StepTime(first_step + i, start, wait, compute, examples, len(self.steps) < self.warmup_steps,
                          len(durations_s))
            self.steps.append(st)
            recorded.append(st)
            start += st.step_s
        return recorded

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


def _get(step, key, default=None):
    return step.get(key, default) if isinstance(step, dict) else getattr(step, key, default)


def calls_of(steps, steps_per_loop: int) -> list[list]:
    """The timed calls of `steps_per_loop` steps among `steps` (`StepTime`s or their dicts, in order), each a list
    of its steps: not the one-step calls `auto` times before it chooses K, nor the trace window's, nor an epoch's
    shorter last call, nor a call holding a warm-up step. Steps of K-step calls come in whole blocks of K."""
    same = [s for s in steps if _get(s, "call_steps", 1) == steps_per_loop]
    blocks = [same[i:i + steps_per_loop] for i in range(0, len(same), steps_per_loop)]
    return [b for b in blocks if len(b) == steps_per_loop and not any(_get(s, "warmup") for s in b)]


def median_call_rate(calls: list[list]) -> float:
    """Examples/s of the median call (by wall time) of `calls` (`calls_of`); 0.0 when there is none. A median, not
    a total: on a shared machine another process taking the cores for a while slows some calls, not the median."""
    if not calls:
        return 0.0
    timed = sorted((sum(_get(s, "step_s") for s in c),
                    sum(_get(s, "examples") for s in c)) for c in calls)
    seconds, examples = timed[(len(timed) - 1) // 2]
    return examples / seconds if seconds > 0 else 0.0
