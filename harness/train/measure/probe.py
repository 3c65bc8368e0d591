"""The input-cost probe of `harness train --profile`: a few steps of the run's own model, batch, precision and loop
on synthetic batches on the device (`harness.train.loop.synthetic`), whose rate the report sets against the run's rate
on real data.

    input cost = 1 - real / synthetic examples/s

The input-stall share counts only the time a step waits for its batch. Where the pipeline and the step share CPU
cores (every CPU run; a GPU host whose cores are saturated), a step that never waits still runs slower while the
pipeline works beside it; only a run without a pipeline shows by how much (as `harness bench train --data synthetic`
against `--data PATH` does, with a separate command).

What it costs: a second copy of the model and optimizer (built fresh: the trained weights are untouched), one trace
of the loop function (seconds for a U-Net on a CPU), one or two warm-up calls, then a number of timed steps fixed
before it starts: enough for about `PROBE_SECONDS` at the run's own step time, at least `PROBE_STEPS`, at most
`PROBE_MAX_STEPS`, in whole calls of the run's K. Measured on 2 shared CPU cores: 1.5 - 4 s in all for a small
model, ~10 s for the U-Net. Every worker must run it (the steps are collectives); `examples_per_s` is this worker's
figure of the job's rate.
"""
from __future__ import annotations

import math
import time
from typing import Callable

from harness.profile.timing import StepTimer, calls_of, median_call_rate
from harness.train.loop.controller import Schedule
from harness.train.loop.synthetic import Shapes, synthetic_batches

PROBE_SECONDS = 2.0      # timed span aimed at, at the run's step time
PROBE_STEPS = 20         # timed steps at least
PROBE_MAX_STEPS = 10000  # and at most (steps of tens of microseconds), before rounding up to whole calls of K


def probe_steps(steps_per_loop: int, step_s: float) -> tuple[int, int]:
    """`(warm-up, timed)` steps for a probe at K steps per call and about `step_s` seconds per step (the run's):
    one call of warm-up (two when K is 1: the first call traces the function), then whole calls lasting about
    `PROBE_SECONDS`, within [PROBE_STEPS, PROBE_MAX_STEPS] steps."""
    k = max(1, steps_per_loop)
    wanted = PROBE_SECONDS / step_s if step_s > 0 else PROBE_STEPS
    timed = int(min(PROBE_MAX_STEPS, max(PROBE_STEPS, wanted)))
    return max(2, k), k * math.ceil(timed / k)


def synthetic_probe(make_run: Callable, *, context, shapes: Shapes, per_replica_batch: int,
                    steps_per_loop: int, step_s: float, seed: int = 0) -> dict:
    """Run the probe; returns `{"examples_per_s", "steps", "warmup_steps", "steps_per_loop", "seconds"}`
    (examples/s: of the median call, `timing.median_call_rate`, as the report takes the run's; seconds: the
    probe's whole wall time, model build and tracing included).

    Args:
      make_run: `fn(schedule, timer) -> Run` over a fresh copy of the run's model and optimizer, with the run's
        loss, class weights, clipping and backend (`harness.train.loop.factory.build_run`, no epoch lines).
      context: the run's `WorkerContext`.
      shapes, per_replica_batch: the run's.
      steps_per_loop: the run's K (after `auto` chose it).
      step_s: the run's mean step time, seconds (sets how many steps are timed).
    """
    start = time.perf_counter()
    warmup, timed = probe_steps(steps_per_loop, step_s)
    timer = StepTimer(warmup)
    run = make_run(Schedule(epochs=1, steps_per_epoch=warmup + timed, warmup_steps=warmup,
                            steps_per_loop=steps_per_loop), timer)
    run.controller.fit(synthetic_batches(run.trainer.strategy, shapes, per_replica_batch, seed))
    summary = timer.summary()
    return {"examples_per_s": median_call_rate(calls_of(timer.steps, steps_per_loop)), "steps": summary["steps"],
            "warmup_steps": summary["warmup_steps"], "steps_per_loop": steps_per_loop,
            "seconds": time.perf_counter() - start}


def sized_synthetic_probe(make_run: Callable, *, context, shapes: Shapes, per_replica_batch: int,
                          steps_per_loop, agree: Callable[[float], float] = float, seed: int = 0) -> dict:
    """`synthetic_probe` where the run's step time is not known yet (`harness train --tune` probes before the
    first epoch): first PROBE_STEPS one-step calls give the call time, then, where that probe lasted less than
    PROBE_SECONDS or the run's K is not 1, a second probe at the run's K (`steps_per_loop`; None: the one `auto`
    would choose from that call time, `controller.choose_steps_per_loop`) for about PROBE_SECONDS. Returns the
    probe kept (its dict, as `synthetic_probe`'s).

    Twenty one-step calls under-measure a fast step: the ACES points' step on 2 CPU cores gave 289k examples/s
    over 20 steps and 546-722k over 200 with auto K (`harness bench train --data synthetic`), which the run then
    beat (real/synthetic 0.95-1.46).

    Args:
      agree: `fn(call seconds) -> call seconds` every worker uses (the chief's, gathered by a collective every
        worker calls): the second probe's steps are collectives, so every worker must take the same K and
        count; the default, for one worker: its own.
    """
    from harness.train.loop.controller import choose_steps_per_loop

    first = synthetic_probe(make_run, context=context, shapes=shapes, per_replica_batch=per_replica_batch,
                            steps_per_loop=1, step_s=0.0, seed=seed)
    rate = first["examples_per_s"]
    step_s = agree(per_replica_batch * context.replicas_in_sync / rate if rate > 0 else 0.0)
    if step_s <= 0:
        return first
    k = steps_per_loop or choose_steps_per_loop(step_s)
    if k == 1 and first["steps"] * step_s >= PROBE_SECONDS:
        return first
    return synthetic_probe(make_run, context=context, shapes=shapes, per_replica_batch=per_replica_batch,
                           steps_per_loop=k, step_s=step_s, seed=seed)

