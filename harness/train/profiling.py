"""`harness train --profile`: the profile session around a training run, and its report at the end."""
from __future__ import annotations

import dataclasses
from typing import Optional


def session(options, backend, config, plan):
    """The `ProfileSession` for --profile / --profile-steps, or None.

    The trace window is `--profile-steps START:STOP` (global steps, both included), else 10 steps from the 3rd
    after warm-up (`profile.session.default_window`)."""
    if not (options.profile or options.profile_steps):
        return None
    from harness.profile.session import ProfileSession, default_window
    from harness.profile.trace import parse_step_window

    total = options.epochs * plan.steps_per_epoch
    window = (parse_step_window(options.profile_steps) if options.profile_steps
              else default_window(total, config.warmup_steps))
    return ProfileSession(context=backend.context, strategy=backend.strategy, output=options.output,
                          trace_steps=window, logdir=options.profile_dir, warmup_steps=config.warmup_steps)


def finish(profiler, options, context, inputs) -> Optional[dict]:
    """Gather every worker's steps and write the profile report; its summary on the chief, None elsewhere."""
    config = dict(dataclasses.asdict(options), plan=inputs.plan.to_dict(), context=str(context))
    report = profiler.finish(kind="train", config=config, facts=inputs.worker_facts(context.rank))
    return report["summary"] if report else None
