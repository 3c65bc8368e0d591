"""One object that profiles a training run on every worker: the step timer, the utilization sampler and the trace
window for the `Controller`, then the gather to the chief and the report.

    profiler = ProfileSession(context=context, strategy=strategy, output=out, trace_steps=(10, 20), total_steps=n)
    run = build_run(backend, model, optimizer, plan, schedule, **profiler.controller_kwargs())
    with profiler:                      # starts sampling; stops it on exit
        run.controller.fit(...)
    report = profiler.finish(kind="train", config={...}, facts={...})   # the report on the chief, None elsewhere
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from harness.profile import report as report_lib
from harness.distribute.gather import gather_to_chief
from harness.profile.sampler import DEFAULT_INTERVAL_S, UtilizationSampler
from harness.profile.trace import ProfileWindow, profiler_device_idle, profiler_input_analysis
from harness.profile.timing import StepTimer

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 10


def default_window(total_steps: int, warmup_steps: int) -> Optional[tuple[int, int]]:
    """A window of up to 10 steps starting 3 steps after warm-up, inside a run of `total_steps`; None when the run
    has no step after warm-up."""
    first = warmup_steps + 3 if total_steps >= warmup_steps + 3 else warmup_steps + 1
    if first > total_steps:
        return None
    return first, min(total_steps, first + DEFAULT_WINDOW - 1)


class ProfileSession:
    """Args (keyword-only):
      context, strategy: the worker context and strategy (for the gather).
      output: the chief's report folder.
      trace_steps: `(first, last)` global steps to trace with tf.profiler, or None for no trace.
      logdir: TensorBoard log dir of the traces (each worker writes `worker-<rank>/` under it); default
        `output/tensorboard`. Give a shared path (gs://...) on a multi-host cluster.
      warmup_steps: steps excluded from the figures.
      interval_s: utilization sampling period; None: no sampling (the timeline alone).
    """

    def __init__(self, *, context, strategy=None, output: str, trace_steps: Optional[tuple[int, int]] = None,
                 logdir: Optional[str] = None, warmup_steps: int = 2,
                 interval_s: Optional[float] = DEFAULT_INTERVAL_S):
        self.context, self.strategy, self.output = context, strategy, output
        self.logdir = logdir or f"{output.rstrip('/')}/tensorboard"
        origin = time.perf_counter()
        self.timer = StepTimer(warmup_steps)  # its clock starts now: within microseconds of `origin`
        self.sampler = UtilizationSampler(origin=origin, interval_s=interval_s) if interval_s else None
        self.window = (ProfileWindow(self.logdir, first=trace_steps[0], last=trace_steps[1], rank=context.rank)
                       if trace_steps else None)

    @property
    def hooks(self) -> list:
        return [self.window] if self.window else []

    def controller_kwargs(self) -> dict:
        """`build_run(..., **session.controller_kwargs())`: the timer and the trace window's action."""
        return {"timer": self.timer, "actions": self.hooks}

    def start(self) -> "ProfileSession":
        """Start sampling (`finish` stops it)."""
        if self.sampler is not None:
            self.sampler.start()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if self.sampler is not None:
            self.sampler.stop()
        if self.window is not None and exc[0] is not None:
            self.window.close()

    def finish(self, *, kind: str, config: dict, facts: Optional[dict] = None, plot: bool = True,
               amend: Optional[Callable[[dict], None]] = None, probe: Optional[dict] = None) -> Optional[dict]:
        """Stop sampling, check this worker's trace and read it with the profiler's analyzer, gather every worker's
        part to the chief; the chief writes `report.json` and `timeline.png` into `output` and prints the table.

        Every worker must call it (it is a collective). `amend(report)` may add figures (the chief's) before the
        report is written and printed. Returns the report on the chief, None elsewhere.
        """
        if self.sampler is not None:
            self.sampler.stop()
        trace = profiler = None
        if self.window is not None:
            result = self.window.close()
            trace = result.to_dict()
            if result.ok:
                profiler = {**profiler_input_analysis(result.xplane), **profiler_device_idle(result.xplane)}
        part = report_lib.worker_part(rank=self.context.rank, replicas=self.context.replicas_per_worker,
                                      timer=self.timer, sampler=self.sampler, trace=trace, profiler=profiler,
                                      facts=facts)
        parts = gather_to_chief(part, context=self.context, strategy=self.strategy)
        if not self.context.is_chief:
            return None
        report = report_lib.build_report(parts, kind=kind, config=config,
                                         replicas_in_sync=self.context.replicas_in_sync,
                                         trace_logdir=self.logdir if self.window else None, probe=probe)
        if amend is not None:
            amend(report)
        paths = report_lib.write_report(report, self.output, plot=plot)
        report["files"] = paths
        print(report_lib.format_table(report), flush=True)
        print(f"report: {paths['report']}" + (f", plot: {paths['plot']}" if "plot" in paths else ""), flush=True)
        return report

