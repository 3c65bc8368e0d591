"""`harness report RUN_DIR`: one self-contained `report.html` of a run, opened offline.

Everything is inside the file: the styles, the plots as inline SVG (matplotlib, text drawn as paths: no font is
fetched), the images (the profile's timeline, the map's quick-look) as base64 `data:` URIs, and no script. It reads
the run's `summary.json` (and under `--profile` the `timeline.png` beside it, and with `predictions` a predict folder's
`<prefix>.png`), so it can be written for any finished run, on any machine.

Sections: the run (context, model, Keras, precision), what ran (data, model file, optimizer, start, end, workers,
versions: `provenance`); the scores of `harness evaluate` reports written into the run folder; the plan (workers,
replicas, batch sizes, steps, records dropped) and the input pipeline as decided; the optimizer's schedule (the
fields its kind uses) and the loss; per epoch the loss and every scalar metric (a table and plots); per class
precision, recall, F1 and IoU with the class names; the last epoch's confusion matrix as a heat map; throughput and
input stall per epoch and per worker; the profile's step-time breakdown; the tuning decisions under `--tune`; the
map's quick-look.

Every number in a table carries its exact value in `data-value` (what `summary.json` holds), shown rounded.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from typing import Optional, Sequence

from harness.choices import PER_CLASS_METRICS as PER_CLASS
from harness.train.model import optim
from harness.train.report import provenance

EVALUATION_KIND = "evaluation"   # a `harness evaluate` report's "kind" (harness.evaluate.run): the page shows those

REPORT_NAME = "report.html"
_SKIP = {"epoch", "step", "steps", "warmup_steps", "mean_step_s", "input_wait_s", "compute_s", "val_records",
         "val_pixels", "val_count"}

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#222;
padding:0 16px}h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.k,th.k{text-align:left}.note{color:#666;font-size:12px}figure{margin:8px 0}
img,svg{max-width:100%;height:auto}code{background:#f4f4f4;padding:1px 4px}
.row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
"""


def _num(value, digits: int = 4) -> str:
    """A table cell of a number: shown rounded, its exact value in data-value."""
    if value is None:
        return '<td data-value="null">-</td>'
    if isinstance(value, float) and math.isnan(value):
        return '<td data-value="NaN">NaN</td>'
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f'<td class="k">{html.escape(str(value))}</td>'
    shown = f"{value:,}" if isinstance(value, int) else (f"{value:,.1f}" if abs(value) >= 1000 else
                                                          f"{value:.{digits}g}")
    return f'<td data-value="{json.dumps(value)}">{shown}</td>'


def _table(rows: Sequence[Sequence], header: Sequence[str], *, table_id: str) -> str:
    head = "".join(f'<th class="{"k" if i == 0 else ""}">{html.escape(h)}</th>' for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(c if isinstance(c, str) and c.startswith("<td") else _num(c) for c in row)
                   + "</tr>" for row in rows)
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>'


def _key(text) -> str:
    return f'<td class="k">{html.escape(str(text))}</td>'


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    return "<figure>" + text[text.index("<svg"):] + "</figure>"


class _Files:
    """What reads and writes the run's files: the standard library for local paths, TensorFlow's file system for
    gs:// (`tf.io.gfile`, imported only then: a local report needs no TensorFlow)."""

    @staticmethod
    def _tf(path: str):
        import tensorflow as tf
        return tf.io.gfile

    @classmethod
    def exists(cls, path: str) -> bool:
        return cls._tf(path).exists(path) if "://" in path else os.path.exists(path)

    @classmethod
    def open(cls, path: str, mode: str = "r"):
        return cls._tf(path).GFile(path, mode) if "://" in path else open(path, mode)

    @classmethod
    def listdir(cls, path: str) -> list:
        return cls._tf(path).listdir(path) if "://" in path else os.listdir(path)


def _image(path: str, alt: str) -> str:
    with _Files.open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def _epoch_plots(history: list) -> str:
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    scalars = [k for k in history[-1] if k not in _SKIP and isinstance(history[-1][k], (int, float))
               and k not in ("examples_per_s", "input_stall_share")]
    losses = [k for k in scalars if k in ("loss", "val_loss")]
    metrics = [k for k in scalars if k not in losses]
    panels = [p for p in (losses, metrics) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.2), squeeze=False)
    for ax, keys in zip(axes[0], panels):
        for k in keys:
            ax.plot(epochs, [h.get(k, float("nan")) for h in history], marker="o", label=k)
        _epoch_axis(ax)
    return _svg(fig)


def _epoch_axis(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def _worker_plots(history: list, workers: Optional[list]) -> str:
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    rows = workers or [{"rank": 0, "examples_per_s": [h["examples_per_s"] for h in history],
                        "input_stall_share": [h["input_stall_share"] for h in history]}]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10.4, 3.2))
    for w in rows:
        a.plot(epochs, w["examples_per_s"], marker="o", label=f"worker {w['rank']}")
        b.plot(epochs, [100 * v for v in w["input_stall_share"]], marker="o", label=f"worker {w['rank']}")
    a.set_ylabel("examples/s")
    b.set_ylabel("input stall, % of step time")
    for ax in (a, b):
        ax.set_ylim(bottom=0)
        _epoch_axis(ax)
    return _svg(fig)


def _confusion_plot(matrix: list, names: Sequence[str]) -> str:
    import matplotlib.pyplot as plt
    import numpy as np

    m = np.asarray(matrix, np.float64)
    share = m / np.maximum(m.sum(axis=1, keepdims=True), 1)
    n = len(names)
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * n, 1.0 + 0.5 * n))
    image = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(n), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n), names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if n <= 20:
        for (t, p), count in np.ndenumerate(m):
            ax.text(p, t, f"{int(count)}", ha="center", va="center", fontsize=7,
                    color="white" if share[t, p] > 0.5 else "black")
    fig.colorbar(image, ax=ax, fraction=0.046, label="share of the true class")
    return _svg(fig)


def _evaluations(run_dir: str) -> list[tuple[str, dict]]:
    """The `harness evaluate` reports written into the run folder (`--output RUN_DIR` or a .json in it: each JSON
    file whose "kind" is "evaluation"), by file name."""
    found = []
    for name in sorted(_Files.listdir(run_dir)):
        if not name.endswith(".json") or name == "summary.json":
            continue
        try:
            with _Files.open(os.path.join(run_dir, name)) as f:
                report = json.load(f)
        except (OSError, ValueError):   # not ours, or being written: the report is still written
            continue
        if isinstance(report, dict) and report.get("kind") == EVALUATION_KIND:
            found.append((name, report))
    return found


def _evaluation(report: dict, *, table_id: str) -> str:
    """One evaluation: what was scored (the export, records, when), its loss and metrics, and per class."""
    metrics = report.get("metrics") or {}
    rows = [["data", ", ".join(report.get("data") or [])], ["records", report.get("records")],
            ["scored (UTC)", report.get("evaluated")], [f"loss ({report.get('loss')})", metrics.get("val_loss")]]
    rows += [[k[4:].replace("_", " "), metrics[k]] for k in ("val_accuracy", "val_mean_iou", "val_rmse", "val_mae",
                                                             "val_r2") if k in metrics]
    out = _table(rows, ["scores", ""], table_id=table_id)
    per_class = report.get("per_class")
    if per_class:
        out += _table([[_key(name), *(v.get(k) for k in PER_CLASS)] for name, v in per_class.items()],
                      ["class", *PER_CLASS], table_id=f"{table_id}-per-class")
    return f'<div class="row">{out}</div>'


def build(run_dir: str, *, predictions: Optional[str] = None) -> str:
    """The report of the run in `run_dir` as one HTML document (see the module's docstring).

    Raises:
      FileNotFoundError: naming `run_dir/summary.json` when the run has none (not finished, or not a run folder).
    """
    import matplotlib

    files = _Files
    matplotlib.use("Agg")  # files only, no display
    matplotlib.rcParams["svg.fonttype"] = "path"   # glyphs as paths: the page needs no font
    path = os.path.join(run_dir, "summary.json")
    if not files.exists(path):
        raise FileNotFoundError(f"{path}: no summary.json (a run folder holds one once `harness train` finished)")
    with files.open(path) as f:
        s = json.load(f)
    history, plan, spec = s.get("history") or [], s.get("plan") or {}, s.get("spec") or {}
    parts = [f"<h1>harness run <code>{html.escape(run_dir)}</code></h1>",
             f'<p class="note">{html.escape(s.get("context", ""))}; model {html.escape(str(s.get("model")))} '
             f'({html.escape(str(s.get("keras")))}, {html.escape(str(s.get("policy")))}); steps '
             f'{s.get("initial_step")} to {s.get("final_step")}</p>']
    if s.get("run"):   # what ran (runs before this entry existed have none)
        parts.append("<h2>What ran</h2>")
        parts.append(_table(provenance.rows(s["run"]), ["run", ""], table_id="run"))
        changed = s["run"].get("options") or {}
        if changed:
            parts.append('<p class="note">options not at their defaults: ' + html.escape(
                ", ".join(f"{k} {json.dumps(v, default=str)}" for k, v in changed.items())) + "</p>")

    parts.append("<h2>Plan, data and optimization</h2>")
    keys = ("workers", "replicas_per_worker", "replicas_in_sync", "per_replica_batch_size", "per_worker_batch_size",
            "global_batch_size", "steps_per_epoch", "records_per_epoch", "dropped")
    parts.append('<div class="row">')
    parts.append(_table([[k.replace("_", " "), plan[k]] for k in keys if k in plan], ["plan", ""], table_id="plan"))
    data_rows = [["kind", spec.get("kind")], ["bands", ", ".join(spec.get("bands") or [])],
                 ["label", spec.get("label")], ["classes", spec.get("num_classes")]]
    parts.append(_table(data_rows, ["data", ""], table_id="data"))
    lr, loss = s.get("learning_rate") or {}, s.get("loss") or {}
    parts.append(_table([[k.replace("_", " "), v] for k, v in optim.used_fields(lr).items()] +
                        [["loss", loss.get("name") or "default"]], ["optimization", ""], table_id="optimization"))
    parts.append("</div>")
    facts = s.get("facts") or {}
    if facts.get("input_pipeline"):
        parts.append(f'<p class="note">{html.escape(facts["input_pipeline"])}</p>')

    for name, evaluation in _evaluations(run_dir):
        parts.append(f"<h2>Scored by <code>harness evaluate</code>: <code>{html.escape(name)}</code></h2>")
        parts.append(_evaluation(evaluation, table_id=f"evaluation-{name.removesuffix('.json')}"))

    if history:
        parts.append("<h2>Per epoch</h2>")
        columns = [k for k in history[-1] if k not in _SKIP and isinstance(history[-1][k], (int, float))]
        parts.append(_table([[h["epoch"], *(h.get(k) for k in columns)] for h in history], ["epoch", *columns],
                            table_id="epochs"))
        parts.append(_epoch_plots(history))
        parts.append("<h2>Throughput and input stall per worker</h2>")
        workers = s.get("workers")
        parts.append(_worker_plots(history, workers))
        if workers:
            rows = [[w["rank"], e, w["examples_per_s"][i], w["input_stall_share"][i]]
                    for w in workers for i, e in enumerate(h["epoch"] for h in history)]
            parts.append(_table(rows, ["worker", "epoch", "examples/s", "input stall share"], table_id="workers"))
        timing = s.get("timing") or {}
        parts.append(f'<p class="note">whole run (the chief): {timing.get("examples_per_s", 0):,.1f} examples/s, '
                     f'input stall {100 * timing.get("input_stall_share", 0):.1f}% over {timing.get("steps")} timed '
                     "steps</p>")

    per_class = s.get("per_class")
    if per_class:
        parts.append("<h2>Per class (last epoch)</h2>")
        parts.append(_table([[_key(name), *(v.get(k) for k in PER_CLASS)] for name, v in per_class.items()],
                            ["class", *PER_CLASS], table_id="per_class"))
        matrix = history[-1].get("val_confusion_matrix") if history else None
        if matrix:
            names = list(s.get("class_names") or per_class)
            parts.append("<h2>Confusion matrix (last epoch)</h2>")
            parts.append(_confusion_plot(matrix, names))
            parts.append(_table([[_key(n), *row] for n, row in zip(names, matrix)], ["true \\ predicted", *names],
                                table_id="confusion"))

    profile = s.get("profile")   # `--profile`: the report's summary; report.json and timeline.png beside
    if profile:
        parts.append("<h2>Profile: step time</h2>")
        parts.append(_table([[k.replace("_", " "), v] for k, v in profile.items() if isinstance(v, (int, float, str))],
                            ["", "value"], table_id="profile"))
        timeline = os.path.join(run_dir, "timeline.png")
        if files.exists(timeline):
            parts.append(_image(timeline, "step timeline"))

    tune = s.get("tune")
    if tune:
        parts.append("<h2>Tuning (--tune)</h2>")
        parts.append(f"<pre>{html.escape(json.dumps(tune, indent=1, default=str))}</pre>")

    if predictions:
        pngs = sorted(n for n in files.listdir(predictions) if n.endswith(".png"))
        if not pngs:
            raise FileNotFoundError(f"{predictions}: no map quick-look (<prefix>.png): predict an image export "
                                    "with a mixer into it first")
        parts.append(f"<h2>Map: <code>{html.escape(predictions)}</code></h2>")
        parts += [_image(os.path.join(predictions, n), n) for n in pngs]

    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>harness run {html.escape(run_dir)}'
            f"</title><style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>")


def write(run_dir: str, *, predictions: Optional[str] = None, output: Optional[str] = None) -> str:
    """Write `build`'s document to `output` (default `run_dir/report.html`, local or gs://); returns the path."""
    target = output or os.path.join(run_dir, REPORT_NAME)
    text = build(run_dir, predictions=predictions)
    with _Files.open(target, "w") as f:
        f.write(text)
    return target
