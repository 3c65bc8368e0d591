"""`harness train --profile`: the profile session around a training run, the input-cost probe after it, and the
report at the end (the stall share, the profiler's input figure and the input cost side by side)."""
from __future__ import annotations

import dataclasses
from typing import Optional


def session(options, backend, schedule, plan):
    """The `ProfileSession` for --profile / --profile-steps, or None.

    The trace window is `--profile-steps START:STOP` (global steps, both included), else 10 steps from the 3rd
    after warm-up (`profile.session.default_window`)."""
    if not (options.profile or options.profile_steps):
        return None
    from harness.profile.session import ProfileSession, default_window
    from harness.profile.trace import parse_step_window

    total = options.epochs * plan.steps_per_epoch
    window = (parse_step_window(options.profile_steps) if options.profile_steps
              else default_window(total, schedule.warmup_steps))
    return ProfileSession(context=backend.context, strategy=backend.strategy, output=options.output,
                          trace_steps=window, logdir=options.profile_dir, warmup_steps=schedule.warmup_steps)


def probe(make_run, controller, backend, inputs) -> dict:
    """The input-cost probe (`harness.train.measure.probe`) of the run's model, batch and K (as the run's calls had it:
    no more than an epoch's steps): `make_run(schedule, timer)` builds a `Run` over a fresh copy of the run's model and
    optimizer (`harness.train.loop.factory.build_run`); `controller` is the run's. Every worker runs it."""
    from harness.train.measure.probe import synthetic_probe
    from harness.train.loop.synthetic import Shapes

    from harness.profile.timing import calls_of

    plan = inputs.plan
    k = min(controller.steps_per_loop or 1, plan.steps_per_epoch)
    steps = [s for call in calls_of(controller.timer.steps, k) for s in call] or controller.timer.steps
    return synthetic_probe(make_run, context=backend.context,
                           shapes=Shapes.from_spec(inputs.spec, inputs.num_classes),
                           per_replica_batch=plan.per_replica_batch_size,
                           steps_per_loop=k, step_s=sum(s.step_s for s in steps) / max(len(steps), 1))


def finish(profiler, options, context, inputs, probe: Optional[dict] = None) -> Optional[dict]:
    """Gather every worker's steps and write the profile report; its summary on the chief, None elsewhere."""
    config = dict(dataclasses.asdict(options), plan=inputs.plan.to_dict(), context=str(context))
    report = profiler.finish(kind="train", config=config, facts=inputs.worker_facts(context.rank), probe=probe)
    return report["summary"] if report else None
