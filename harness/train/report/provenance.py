"""What ran: the part of `summary.json` a reviewer needs to trust a run or to run it again ("run"), and what
`harness report` shows of it.

    {"data": [...], "validation_data": [...], "model_file": "examples/pixel_mlp.py:build" | "built-in U-Net",
     "model_code": {"given", "module", "function", "path" (absolute), "sha256"} (a user's model: what every saved
     `.keras` of the run records, with the file's text, `harness.model_code`),
     "optimizer": {"name": "adam", ...}, "started": "2026-12-07T02:10:04Z", "ended": ..., "duration_s": 31.2,
     "workers": 2, "replicas_in_sync": 2, "hosts": [...], "options": {every option not at its default},
     "versions": {"harness", "tensorflow", "keras", "tf-keras", "python", ...}}
"""
from __future__ import annotations

import dataclasses
import datetime
from typing import Optional


def utc(seconds: float) -> str:
    """Unix seconds as ISO 8601 UTC to the second (`2026-12-07T02:10:04Z`)."""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def optimizer(options) -> dict:
    """The optimizer as the run built it (`harness.train.model.optim.make_optimizer`): its name and the settings
    that apply to it (SGD's momentum and Nesterov; AdamW's weight decay, its default where none was given;
    clipping by global norm), None values left out."""
    from harness.train.model.optim import ADAMW_WEIGHT_DECAY

    decay = options.weight_decay
    if options.optimizer == "adamw" and decay is None:
        decay = ADAMW_WEIGHT_DECAY
    out = {"name": options.optimizer, "weight_decay": decay, "clip_norm": options.clip_norm}
    if options.optimizer == "sgd":
        out.update(momentum=options.momentum or 0.0, nesterov=bool(options.nesterov))
    return {k: v for k, v in out.items() if v is not None}


def non_default(options) -> dict:
    """The `TrainOptions` fields whose value in the run is not the field's default: what the command line or
    config said, and what `TrainOptions` derived from it (the per-replica batch from the global one, or 32)."""
    out = {}
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        default = field.default if field.default is not dataclasses.MISSING else (
            field.default_factory() if field.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if value != default:
            if field.name == "mlflow":   # a URI may carry a user and password: never written
                from harness.train.report.tracking import shown
                value = shown(value)
            out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


def provenance(options, context, *, started: float, model: str, hosts: Optional[list] = None, code=None) -> dict:
    """The run's "run" entry of `summary.json` as known at its start (`finished` adds its end): built once per run,
    sent to MLflow as parameters (`tracking.params_of`) and written with the summary.

    Args:
      options: the run's `TrainOptions`.
      context: its `WorkerContext` (workers, replicas).
      started: Unix seconds at the start of `harness.train.job.run`.
      model: what built the model: `options.model` (FILE.py:FUNCTION) or the built-in model's name.
      hosts: every worker's host name in rank order, where known.
      code: the model's `harness.model_code.ModelCode` (its file's absolute path and digest, not its text), or None.
    """
    from harness.profile.report import versions

    return {"data": list(options.data), "validation_data": list(options.validation_data or ()),
            "model_file": model, **({"model_code": code.to_dict(source=False)} if code is not None else {}),
            "init_from": options.init_from, "optimizer": optimizer(options),
            "started": utc(started), "workers": context.num_workers, "replicas_in_sync": context.replicas_in_sync,
            **({"hosts": hosts} if hosts else {}), "options": non_default(options), "versions": versions()}


def finished(run: dict, started: float, ended: float) -> dict:
    """`provenance`'s entry with the run's end: "ended" (UTC) and "duration_s" (seconds from `started`)."""
    return {**run, "ended": utc(ended), "duration_s": round(ended - started, 3)}


def rows(run: dict) -> list[list]:
    """The report's "run" table: [name, value] rows of `provenance`'s dict (values as text where not numbers)."""
    v = run.get("versions") or {}
    opt = run.get("optimizer") or {}
    settings = ", ".join(f"{k.replace('_', ' ')} {val}" for k, val in opt.items() if k != "name")
    out = [["data", ", ".join(run.get("data") or [])],
           ["validation data", ", ".join(run.get("validation_data") or []) or "none"],
           ["model", run.get("model_file")]]
    if run.get("init_from"):
        out.append(["initialized from", run["init_from"]])
    out += [["optimizer", opt.get("name", "?") + (f" ({settings})" if settings else "")],
            ["started (UTC)", run.get("started")], ["ended (UTC)", run.get("ended")],
            ["duration s", run.get("duration_s")], ["workers", run.get("workers")],
            ["replicas in sync", run.get("replicas_in_sync")]]
    if run.get("hosts"):
        out.append(["hosts", ", ".join(run["hosts"])])
    keras = ", ".join(f"{name} {v[name]}" for name in ("keras", "tf-keras") if name in v)
    out += [["harness", v.get("harness")], ["TensorFlow", v.get("tensorflow_runtime") or v.get("tensorflow")],
            ["Keras", keras or None], ["Python", v.get("python")]]
    return out
