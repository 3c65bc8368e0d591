"""The profile report: every step of every worker, per-worker and job summaries, the verdict and advice.

A worker's part (`worker_part`) holds its steps (`StepTime`s: input wait, compute, examples, warm-up flag), its
utilization samples and its trace check; the chief gathers the parts (`harness.distribute.gather`) and builds the
report (`build_report`), writes `report.json` and the timeline plot (`write_report`) and prints `format_table`.

Figures (warm-up steps excluded, counted apart):
  input-stall share   sum(input wait) / sum(step time) on a worker (`StepTimer.summary`);
  accelerator busy    mean NVML GPU utilization over the samples inside the worker's timed steps, as a share;
                      "no GPU" (None in JSON) where NVML sees none, never 0;
  examples/s          global batch x timed steps / timed seconds (steps are synchronous, so every worker sees the
                      job's rate); per replica: divided by the replicas in sync.
  traced stall share  the same ratio over the steps inside the trace window only: the steps the profiler saw;
  profiler input      the input-pipeline analyzer's "% of the total step time sampled is waiting for input" on
                      the trace window (`trace.profiler_input_analysis`; tensorflow.org/guide/profiler, section
                      "Input Pipeline Analyzer"), compared with the traced stall share, not the whole run's;
  input cost          1 - real / synthetic examples/s: the run's rate against a short probe of the same model,
                      batch and loop on synthetic batches on the device (`harness.train.measure.probe`, `harness train
                      --profile`), both from the median call of K steps (`timing.median_call_rate`: the calls
                      `auto` times before choosing K and the trace window's are not K-step calls); None without
                      a probe.
The job is as input-bound as its most input-bound worker (the others wait for it in the all-reduce, which they
count as compute), so the verdict uses the largest worker share and names the worker.
Thresholds are the TensorFlow profiler's: highly input-bound at >= 20% of step time, moderately at >= 5%. With a
probe the verdict's figure is the larger of the stall share and the input cost: a step that never waits for its
batch is still slowed by a pipeline that takes CPU cores from it, and only the input cost shows that.
`disagreements` says in words where the three figures part by more than `AGREE` and why.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import platform
import socket
from typing import Optional, Sequence

from harness.profile import timing
from harness.profile.sampler import NO_GPU, Sample, mean_in

log = logging.getLogger(__name__)

HIGHLY, MODERATELY = 0.20, 0.05
AGREE = 0.10   # figures within 10 points of each other agree
REPORT_NAME, PLOT_NAME = "report.json", "timeline.png"


def verdict(share: float, cost: Optional[float] = None) -> str:
    """The profiler's wording for an input-stall share, or for the input cost where it is larger."""
    share = max(share, cost or 0.0)
    if share >= HIGHLY:
        return "highly input-bound"
    if share >= MODERATELY:
        return "moderately input-bound"
    return "not input-bound"


def worker_part(*, rank: int, replicas: int, timer, sampler=None, trace: Optional[dict] = None,
                profiler: Optional[dict] = None, facts: Optional[dict] = None) -> dict:
    """This worker's share of the report, JSON-ready (what `gather_to_chief` carries)."""
    samples = sampler.samples if sampler is not None else []
    return {
        "rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "replicas": replicas,
        "gpu": sampler.gpu.describe() if sampler is not None else NO_GPU,
        "gpu_available": bool(sampler is not None and sampler.gpu.available),
        "sample_interval_s": sampler.interval_s if sampler is not None else None,
        "steps": [dict(dataclasses.asdict(s), step_s=s.step_s) for s in timer.steps],
        "samples": [dataclasses.asdict(s) for s in samples],
        "trace": trace, "profiler": profiler, "facts": facts or {},
    }


def _samples(part: dict) -> list[Sample]:
    return [Sample(**{k: tuple(v) if isinstance(v, list) else v for k, v in s.items()}) for s in part["samples"]]


def _share_and_rate(steps: Sequence[dict]) -> tuple[float, float]:
    """(input-stall share, examples/s) over `steps`."""
    total = sum(s["step_s"] for s in steps)
    if total <= 0:
        return 0.0, 0.0
    return sum(s["input_wait_s"] for s in steps) / total, sum(s["examples"] for s in steps) / total


def _traced(part: dict, step: dict) -> bool:
    first, last = (part.get("trace") or {}).get("steps") or (0, -1)
    return first <= step["step"] <= last


def summarize_worker(part: dict, replicas_in_sync: int) -> dict:
    """Timing and utilization of one worker's timed (post-warm-up) steps, and the stall share of the traced steps
    (those the profiler saw)."""
    steps = part["steps"]
    timed = [s for s in steps if not s["warmup"]] or steps
    wait = sum(s["input_wait_s"] for s in timed)
    total = sum(s["step_s"] for s in timed)
    examples = sum(s["examples"] for s in timed)
    rate = examples / total if total > 0 else 0.0
    traced = [s for s in timed if _traced(part, s)]
    out = {"rank": part["rank"], "host": part["host"], "steps": len(timed), "warmup_steps": len(steps) - len(timed),
           "input_stall_share": wait / total if total > 0 else 0.0, "input_wait_s": wait,
           "compute_s": total - wait, "mean_step_s": total / len(timed) if timed else 0.0,
           "examples_per_s": rate, "examples_per_s_per_replica": rate / max(replicas_in_sync, 1),
           "gpu": part["gpu"], "accelerator_busy_share": None, "cpu_percent": None,
           "traced_input_stall_share": _share_and_rate(traced)[0] if traced else None}
    if timed:
        start = timed[0]["start_s"]
        end = timed[-1]["start_s"] + timed[-1]["step_s"]
        util = mean_in(_samples(part), start, end)
        out["cpu_percent"] = util["cpu_percent"]
        if part["gpu_available"] and util["gpu_util_percent"] is not None:
            out["accelerator_busy_share"] = util["gpu_util_percent"] / 100.0
    prof = part.get("profiler") or {}
    out["profiler_input_percent"] = prof.get("input_percent")
    out["profiler_device_idle_percent"] = prof.get("device_idle_percent")
    return out


def disagreements(summary: dict) -> list[str]:
    """Where the stall share, the profiler's input figure and the input cost part by more than `AGREE`, and why."""
    stall, traced = summary["input_stall_share"], summary.get("traced_input_stall_share")
    prof, cost = summary.get("profiler_input_percent"), summary.get("input_cost")
    lines = []
    if prof is not None and traced is not None and abs(prof / 100 - traced) > AGREE:
        lines.append(f"on the traced steps the profiler counts {prof:.1f}% of step time as input and the harness "
                     f"{traced:.1%}: they time different spans (the profiler the iterator's ops inside its step "
                     "markers, the harness the whole next(iterator) call on the host)")
    if traced is not None and abs(stall - traced) > AGREE:
        lines.append(f"the traced steps stalled {traced:.1%}, all timed steps {stall:.1%}: the profiler saw only its "
                     "window, whose steps run one per call under the tracer; the stall is uneven over the run")
    if cost is None:
        return lines
    real_stall, k = summary["real_input_stall_share"], summary["probe"]["steps_per_loop"]
    if cost - real_stall > AGREE:
        lines.append(f"the steps run {k} per call waited {real_stall:.1%} of their time for input, yet ran {cost:.0%} "
                     "slower than on synthetic batches: the pipeline's work takes CPU time from the step (they "
                     "share the cores), which neither the stall share nor the profiler's input figure counts")
    if real_stall - cost > AGREE:
        lines.append(f"the steps run {k} per call waited {real_stall:.1%} of their time for input, but synthetic "
                     f"batches ran only {max(cost, 0):.0%} faster: the machine's load changed between the run and "
                     "the probe (which runs after training); rerun on a quiet machine")
    return lines


def advice(summary: dict, workers: Sequence[dict], facts: dict) -> list[str]:
    """Concrete next steps for the verdict, from the measured figures and the pipeline's facts
    (`compression`, `files_per_worker`, `cpu_count`, `cache`, `data_service`, `synthetic`)."""
    share, tips = summary["input_stall_share"], []
    cost = summary.get("input_cost")
    if facts.get("synthetic"):
        return ["synthetic batches on the device: this is the compute ceiling; run the same command with "
                "--data PATH to measure your input pipeline's cost against it"]
    if max(share, cost or 0.0) < MODERATELY:
        busy = summary.get("accelerator_busy_share")
        tips.append("the input pipeline keeps up: speed up the step itself (mixed precision, a larger per-replica "
                    "batch, XLA)" + (f"; the accelerator is busy {busy:.0%} of the time" if busy is not None else ""))
        return tips
    cores, files = facts.get("cpu_count") or 0, facts.get("files_per_worker")
    if cost is not None and cost - summary["real_input_stall_share"] >= MODERATELY:
        tips.append(f"the pipeline slows the step beyond its stalls ({cost:.0%} input cost, "
                    f"{summary['real_input_stall_share']:.0%} stall on the same steps): "
                    f"it competes with the step for {cores or 'the'} CPU cores; cut its work per example (decode "
                    "once and cache it, resize at export) or move it off this host (--data-service)")
    if facts.get("compression") == "GZIP":
        tips.append("GZIP shards are decompressed by one thread per file: `harness reshard` them into uncompressed "
                    "shards (a multiple of the workers) before training")
    if files is not None and cores and files < cores:
        tips.append(f"more parallel reads: each worker reads {files} file(s) with {cores} cores; reshard into at "
                    f"least {cores} shards per worker so the interleave can read them all at once")
    if facts.get("cache") in ("none", None):
        tips.append("cache placement: the records are not cached; use --cache memory when a worker's share fits in "
                    "RAM, else --cache file --cache-dir on a local SSD")
    elif facts.get("cache") == "file":
        tips.append("cache placement: the file cache is read back every epoch; put --cache-dir on a local SSD, or "
                    "use --cache memory if the records fit")
    cpu = summary.get("cpu_percent")
    if cpu is not None and cpu >= 80 and not facts.get("data_service"):
        tips.append(f"the host CPU is {cpu:.0f}% busy: offload preprocessing to a tf.data service "
                    "(`harness data-service dispatcher/worker`, then --data-service grpc://HOST:PORT)")
    shares = [w["input_stall_share"] for w in workers]
    if len(shares) > 1 and max(shares) - min(shares) >= MODERATELY:
        worst = max(workers, key=lambda w: w["input_stall_share"])
        tips.append(f"worker {worst['rank']} stalls most ({worst['input_stall_share']:.0%} vs "
                    f"{min(shares):.0%}): balance the shards with `harness reshard --workers {len(workers)}`")
    if not tips:
        tips.append("raise the pipeline's parallelism (more files to interleave, a larger prefetch) or offload "
                    "preprocessing with --data-service")
    return tips


def build_report(parts: Sequence[dict], *, kind: str, config: dict, replicas_in_sync: int,
                 trace_logdir: Optional[str] = None, probe: Optional[dict] = None) -> dict:
    """The whole report from every worker's part (ordered by rank); `probe`: the chief's synthetic probe
    (`harness.train.measure.probe.synthetic_probe`), for the input cost."""
    from harness.profile.trace import missing_traces, tensorboard_command

    parts = sorted(parts, key=lambda p: p["rank"])
    workers = [summarize_worker(p, replicas_in_sync) for p in parts]
    worst = max(workers, key=lambda w: w["input_stall_share"])
    busy = [w["accelerator_busy_share"] for w in workers if w["accelerator_busy_share"] is not None]
    cpu = [w["cpu_percent"] for w in workers if w["cpu_percent"] is not None]
    total = sum(w["examples_per_s"] for w in workers) / len(workers)
    summary = {
        "workers": len(workers), "replicas_in_sync": replicas_in_sync,
        "steps": workers[0]["steps"], "warmup_steps": workers[0]["warmup_steps"],
        "input_stall_share": worst["input_stall_share"], "input_stall_worker": worst["rank"],
        "mean_input_stall_share": sum(w["input_stall_share"] for w in workers) / len(workers),
        "accelerator_busy_share": sum(busy) / len(busy) if busy else None,
        "gpu": "; ".join(sorted({w["gpu"] for w in workers})),
        "cpu_percent": sum(cpu) / len(cpu) if cpu else None,
        "examples_per_s": total, "examples_per_s_per_replica": total / max(replicas_in_sync, 1),
        "profiler_input_percent": worst.get("profiler_input_percent"),
        "traced_input_stall_share": worst.get("traced_input_stall_share"),
        "profiler_device_idle_percent": worst.get("profiler_device_idle_percent"),
        "input_cost": None,
    }
    if probe:
        k = probe["steps_per_loop"]
        calls = [timing.calls_of(p["steps"], k) for p in parts]
        real_stall = max(_share_and_rate([s for c in cs for s in c])[0] for cs in calls)
        rate = sum(timing.median_call_rate(cs) for cs in calls) / len(calls)
        summary.update(real_examples_per_s=rate, real_input_stall_share=real_stall,
                       synthetic_examples_per_s=probe["examples_per_s"], probe=probe,
                       input_cost=1.0 - rate / probe["examples_per_s"] if probe["examples_per_s"] > 0 and rate > 0
                       else None)  # rate 0: the run had no whole call of K steps to time, not an infinite cost
    summary["verdict"] = verdict(summary["input_stall_share"], summary["input_cost"])
    summary["disagreements"] = disagreements(summary)
    facts = dict(parts[0].get("facts") or {})
    summary["cache"] = facts.get("cache")  # the cache the chief's input pipeline applied (its PipelinePlan)
    report = {"kind": kind, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "config": config, "summary": summary, "verdict": summary["verdict"],
              "advice": advice(summary, workers, facts), "workers": workers, "parts": list(parts)}
    if trace_logdir is not None:
        traces = [p["trace"] for p in parts if p.get("trace")]
        window = next((t["steps"] for t in traces if t.get("steps")), None)
        report["traces"] = {"logdir": trace_logdir, "tensorboard": tensorboard_command(trace_logdir),
                            "window": list(window) if window else None,
                            "files": {t["rank"]: t["xplane"] for t in traces},
                            "missing": missing_traces(traces, len(parts)),
                            "viewer": sorted({line for t in traces for line in t.get("viewer") or ()}),
                            "analysis": [f"worker {p['rank']}: {p['profiler']['error']}" for p in parts
                                         if (p.get("profiler") or {}).get("error")]}
    return report


def versions() -> dict:
    """Versions of what produced the figures."""
    from importlib import metadata

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("harness", "tensorflow", "tensorflow-cpu", "keras", "tf-keras", "numpy", "tensorboard-plugin-profile",
                 "nvidia-ml-py", "psutil", "horovod", "mpi4py"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:
        import tensorflow as tf
        out["tensorflow_runtime"] = tf.__version__
        build = tf.sysconfig.get_build_info()
        out["cuda"], out["cudnn"] = build.get("cuda_version"), build.get("cudnn_version")
    except Exception:  # a report must be written even where TensorFlow's build info is odd
        pass
    return out


def _pct(x: Optional[float]) -> str:
    return "no GPU" if x is None else f"{100 * x:.1f}%"


def input_line(s: dict) -> str:
    """The three input figures side by side."""
    traced = s.get("traced_input_stall_share")
    prof, cost = s.get("profiler_input_percent"), s.get("input_cost")
    parts = [f"input: stall {100 * s['input_stall_share']:.1f}% of step time"
             + (f" ({100 * traced:.1f}% on the traced steps)" if traced is not None else "")]
    if prof is not None:
        parts.append(f"profiler {prof:.1f}% on the traced steps")
    if cost is None and s.get("probe") and not s.get("real_examples_per_s"):
        k = s["probe"]["steps_per_loop"]
        parts.append(f"input cost not measured (the run had no whole call of {k} steps outside the warm-up and the "
                     "trace window to time against the probe: train more steps per epoch or more epochs)")
    if cost is not None:
        probe = s["probe"]
        parts.append(f"input cost {100 * cost:.1f}% ({s['real_examples_per_s']:.1f} examples/s against "
                     f"{s['synthetic_examples_per_s']:.1f} on synthetic batches: a {probe['seconds']:.1f} s probe of "
                     f"{probe['steps']} steps at {probe['steps_per_loop']} per call)")
    return "; ".join(parts)


WINDOW_NOTE = ("there each call runs one step, its batch drawn on the host (steps_per_loop is 1 inside the window), so "
               "that the profiler's input-pipeline analyzer finds every step; elsewhere K steps run per call")


def format_table(report: dict) -> str:
    """The short table printed at the end of a run."""
    s = report["summary"]
    lines = [f"{'worker':>6}  {'steps':>5}  {'input stall':>11}  {'accel busy':>10}  {'examples/s':>10}  "
             f"{'/replica':>9}  {'CPU':>5}  {'profiler input':>14}"]
    for w in report["workers"]:
        prof = w.get("profiler_input_percent")
        cpu = w.get("cpu_percent")
        lines.append(f"{w['rank']:>6}  {w['steps']:>5}  {100 * w['input_stall_share']:>10.1f}%  "
                     f"{_pct(w['accelerator_busy_share']):>10}  {w['examples_per_s']:>10.1f}  "
                     f"{w['examples_per_s_per_replica']:>9.1f}  "
                     f"{'-' if cpu is None else f'{cpu:.0f}%':>5}  "
                     f"{'-' if prof is None else f'{prof:.1f}%':>14}")
    lines.append(f"job: {s['examples_per_s']:.1f} examples/s ({s['examples_per_s_per_replica']:.1f} per replica, "
                 f"{s['replicas_in_sync']} replicas), input stall {100 * s['input_stall_share']:.1f}% "
                 f"(worker {s['input_stall_worker']}), accelerator busy {_pct(s['accelerator_busy_share'])}, "
                 f"{s['warmup_steps']} warm-up steps excluded")
    prof = s.get("profiler_input_percent")
    lines.append(input_line(s))
    stages = (report["parts"][0].get("facts") or {}).get("input_pipeline") if report.get("parts") else None
    if stages:
        lines.append(stages)  # the chief's PipelinePlan.describe(): the stages its input pipeline applied
    lines.append(f"verdict: {s['verdict']} (profiler thresholds: >= {HIGHLY:.0%} highly, >= {MODERATELY:.0%} "
                 f"moderately)" + (f"; the profiler measured {prof:.1f}% input" if prof is not None else ""))
    lines += [f"  ! {line}" for line in s.get("disagreements", ())]
    if "scaling_efficiency" in s:
        lines.append(f"scaling efficiency vs one replica: {s['scaling_efficiency']:.0%}")
    lines += [f"  - {tip}" for tip in report["advice"]]
    traces = report.get("traces")
    if traces:
        for line in traces["missing"]:
            lines.append(f"MISSING TRACE: {line}")
        for line in traces.get("viewer", []):
            lines.append(f"TENSORBOARD BROKEN: {line}")
        for line in traces.get("analysis", []):
            lines.append(f"PROFILER ANALYSIS FAILED: {line}")
        lines.append(f"trace window: steps {traces['window'][0]}-{traces['window'][1]}; {WINDOW_NOTE}"
                     if traces.get("window") else f"trace window: {WINDOW_NOTE}")
        lines.append(f"traces: {traces['tensorboard']}")
        lines.append("  (TensorBoard's Profile tab loads its charts from the internet; offline, `harness report "
                     "RUN_DIR` writes RUN_DIR/report.html with this table and the timeline)")
    return "\n".join(lines)


def write_report(report: dict, output: str, *, plot: bool = True) -> dict:
    """Write `report.json` (and `timeline.png`) into `output`; returns their paths."""
    os.makedirs(output, exist_ok=True)
    paths = {"report": os.path.join(output, REPORT_NAME)}
    with open(paths["report"], "w") as f:
        json.dump(report, f, indent=1, default=str)
    if plot:
        try:
            from harness.profile.plot import plot_timeline
            paths["plot"] = plot_timeline(report, os.path.join(output, PLOT_NAME))
        except ImportError as e:  # matplotlib comes with the `profile` extra; the figures do not need it
            log.warning("no timeline plot: %s (pip install 'harness[profile]')", e)
    return paths
