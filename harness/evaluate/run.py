"""Score a trained run on a labelled export, exactly as its validation did: the run's spec (bands, label, crop,
normalization inside the model), validation's input pipeline (every record once, the last batch partial,
`plan.make_plan(evaluation=True)`), and validation's pass (`harness.train.loop.factory.build_evaluator`: counts summed
over replicas, workers and ranks), on any number of workers: the metrics of the same records equal the run's
`summary.json` validation metrics to the last count.

    report = run(EvaluateOptions(model="runs/unet", data=("gs://bucket/test",)))
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable, Optional

from harness.errors import ConfigError
from harness.train.report.page import EVALUATION_KIND   # `harness report` shows the run folder's reports of this kind


@dataclasses.dataclass(frozen=True)
class EvaluateOptions:
    """What `harness evaluate` needs.

    Attributes:
      model: a run folder (`model.keras`, `summary.json`) or a `.keras` file with its run's `summary.json` beside it.
      data: the labelled export (folders, globs or paths, local or gs://).
      output: where the report is written as JSON (a `.json` path, or a folder: `evaluation.json` in it); None:
        printed only.
      per_replica_batch_size: records per replica per step (validation's default, 32).
      loss: the loss the val_loss is of; None: the run's (`summary.json` "loss"), else the task's default.
      backend, strategy: as `harness train` (`--backend horovod` under a launcher's ranks).
    """

    model: str
    data: tuple[str, ...]
    output: Optional[str] = None
    per_replica_batch_size: int = 32
    loss: Optional[str] = None
    backend: str = "tf"
    strategy: str = "auto"


def run(options: EvaluateOptions, *, say: Callable[[str], None] = print) -> dict:
    """Score `options.model` on `options.data`; returns the report (also written to `options.output` by the chief).

    Returns:
      `{"kind": "evaluation", "evaluated" (UTC, ISO 8601), "model", "data", "records", "pixels", "loss", "metrics":
      {val_loss, val_accuracy, ...}, "class_names", "per_class"}`: the metrics keyed as the run's history holds
      them (`val_*`). Written into the run folder (`--output RUN_DIR`, or a .json in it), `harness report` shows it.
    Raises:
      ConfigError: a model without its run's summary.json (no spec: bands, label); a loss of another task.
      SpecMismatchError and the other data errors: the export does not hold the run's bands or label.
      PredictError: the model cannot be loaded.
    """
    from harness.distribute.backend import make_backend
    from harness.distribute import plan as plan_lib
    from harness.data.spec import validate as spec_lib
    from harness.data.export.source import open_shards
    from harness.predict import model as model_lib
    from harness.train.inputs import Inputs
    from harness.train.loop.factory import build_evaluator
    from harness.train.model import metrics
    from harness.train.model.parts import RunParts
    from harness.train.options import TrainOptions
    from harness.train.report.provenance import utc

    backend = make_backend(options.backend, strategy=options.strategy)   # before any other TensorFlow op
    context = backend.context
    with backend.scope():
        loaded = model_lib.load(options.model)
    if loaded.spec is None or loaded.spec.label is None:
        raise ConfigError(f"{loaded.path}: no run summary.json with a labelled spec beside the model: evaluate "
                          "scores a run of `harness train` (its bands, label and classes)")
    run_summary = _summary(loaded.path)
    spec = loaded.spec
    shards = open_shards(list(options.data))
    spec_lib.validate_shards(spec, shards)
    plan = plan_lib.make_plan(shards.counts, workers=context.num_workers,
                              replicas_per_worker=context.replicas_per_worker,
                              per_replica_batch_size=options.per_replica_batch_size, evaluation=True)
    given_loss = options.loss or run_summary.get("loss", {}).get("name")
    # the run's loss and validation's input pipeline: its TrainOptions, less what only training reads
    train_options = TrainOptions(data=tuple(options.data), per_replica_batch_size=options.per_replica_batch_size,
                                 loss=given_loss, focal_gamma=run_summary.get("loss", {}).get("focal_gamma", 2.0))
    parts = RunParts(train_options, task=spec.task, ignore=spec.ignore_label is not None)
    inputs = Inputs(train=shards, validation=shards, spec=spec, plan=plan, validation_plan=plan,
                    num_classes=spec.num_classes, mean=None, variance=None, class_weights=None,
                    options=train_options)
    say(f"evaluate: {sum(plan.records)} records of {len(shards.shards)} file(s), {context.num_workers} worker(s) x "
        f"{context.replicas_per_worker} replica(s), per-replica batch {options.per_replica_batch_size}")
    evaluator = build_evaluator(backend, loaded.model, parts.loss_for(loaded.model),
                                parts.build_metrics(spec.num_classes))
    scores = evaluator.evaluate(backend.distribute(inputs.dataset_fn(False)))
    class_names = list(spec.class_names) or [str(c) for c in range(spec.num_classes or 0)]
    report = {"kind": EVALUATION_KIND, "evaluated": utc(time.time()), "model": loaded.path,
              "data": list(options.data), "records": scores["val_records"],
              "pixels": scores["val_pixels"], "loss": parts.loss_name(),
              "metrics": scores,
              **({"class_names": class_names, "per_class": metrics.by_class(scores, class_names)}
                 if spec.task == "classification" else {})}
    for line in format_report(report):
        say(line)
    if options.output and context.is_chief:
        path = options.output if options.output.endswith(".json") else os.path.join(options.output, "evaluation.json")
        import tensorflow as tf
        tf.io.gfile.makedirs(os.path.dirname(path) or ".")
        with tf.io.gfile.GFile(path, "w") as f:
            json.dump(report, f, indent=1)
        say(f"wrote {path}")
    return report


def _summary(model_path: str) -> dict:
    """The run's summary.json beside the model ({} when absent)."""
    import tensorflow as tf

    path = os.path.join(os.path.dirname(model_path), "summary.json")
    if not tf.io.gfile.exists(path):
        return {}
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def format_report(report: dict) -> list[str]:
    """The report as printed: the records, the loss and the whole-set metrics, then a row per class."""
    m = report["metrics"]
    lines = [f"records {report['records']}, labels counted {report['pixels']}; {report['loss']} loss "
             f"{m['val_loss']:.4f}"]
    scalars = [k for k in ("val_accuracy", "val_mean_iou", "val_rmse", "val_mae", "val_r2") if k in m]
    if scalars:
        lines.append("  ".join(f"{k[4:]} {m[k]:.4f}" for k in scalars))
    if report.get("per_class"):
        from harness.choices import PER_CLASS_METRICS
        lines.append(f"{'class':<16} " + " ".join(f"{k:>9}" for k in PER_CLASS_METRICS))
        for name, row in report["per_class"].items():
            lines.append(f"{name[:16]:<16} " + " ".join(f"{row.get(k, float('nan')):>9.4f}"
                                                        for k in PER_CLASS_METRICS))
    return lines
