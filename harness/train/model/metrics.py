"""Validation metrics as distributed sums: each replica counts, the counts are summed over replicas, workers, ranks
and steps, and only then turned into ratios. Averaging each replica's IoU, F1 or RMSE would weigh a replica's few
pixels as much as another's many ("averaged averages"); ratios of summed counts are the metrics of the whole
validation set. Pixels whose label is nodata (`ignore_label`, `harness.data.spec.labels.valid`) are not counted.

Classification, from one confusion matrix M[true, predicted] counted as int64 (exact below 2**63 pixels), per class
c: precision = M[c,c] / Σ_t M[t,c], recall = M[c,c] / Σ_p M[c,p], F1 = 2·M[c,c] / (Σ_t M[t,c] + Σ_p M[c,p]),
IoU = M[c,c] / (Σ_t M[t,c] + Σ_p M[c,p] − M[c,c]) (Jaccard); accuracy = trace / total; mean IoU over the classes
present in labels or predictions (a class absent from both has no IoU, as in Keras' MeanIoU, which divides by the
classes with a non-zero denominator).

Regression, from five float64 sums over the valid pixels (n, Σe², Σ|e|, Σy, Σy², e = prediction − label):
RMSE = √(Σe²/n), MAE = Σ|e|/n, R² = 1 − Σe² / (Σy² − (Σy)²/n) (the coefficient of determination, as
scikit-learn's `r2_score` for one output). float64 sums of float32 values: relative error about 1e-16 per addition.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from harness.choices import PER_CLASS_METRICS
from harness.data.spec.labels import valid


def confusion_counts(labels, logits, num_classes: int):
    """`[classes, classes]` int64 counts of (true, predicted) over every valid example or pixel of a batch
    (labels int32 `[batch, ...]`, nodata `IGNORED` not counted); predicted = argmax of the logits."""
    labels, predicted = tf.reshape(labels, [-1]), tf.reshape(tf.argmax(logits, axis=-1, output_type=tf.int32), [-1])
    counted = valid(labels)
    return tf.math.confusion_matrix(tf.where(counted, labels, 0), predicted, num_classes=num_classes,
                                    weights=tf.cast(counted, tf.int64), dtype=tf.int64)


def from_confusion(matrix, prefix: str = "val_") -> dict:
    """Metrics of a summed confusion matrix (numpy or tensor, `[classes, classes]`, rows true, columns
    predicted): accuracy, per-class precision, recall, F1 and IoU (lists; NaN where undefined), mean IoU, and the
    matrix itself (nested lists of ints), keys prefixed with `prefix`."""
    m = np.asarray(matrix, dtype=np.int64)
    hits = np.diag(m).astype(np.float64)
    predicted, actual = m.sum(axis=0).astype(np.float64), m.sum(axis=1).astype(np.float64)
    union = predicted + actual - hits

    def ratio(num, den):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    iou = ratio(hits, union)
    present = union > 0
    return {f"{prefix}accuracy": float(hits.sum() / max(m.sum(), 1)),
            f"{prefix}mean_iou": float(iou[present].mean()) if present.any() else float("nan"),
            f"{prefix}precision": ratio(hits, predicted).tolist(), f"{prefix}recall": ratio(hits, actual).tolist(),
            f"{prefix}f1": ratio(2 * hits, predicted + actual).tolist(), f"{prefix}iou": iou.tolist(),
            f"{prefix}confusion_matrix": m.tolist()}


def regression_sums(labels, outputs):
    """float64 `[5]`: n, Σe², Σ|e|, Σy, Σy² over the valid pixels of a batch (labels float32 `[batch, ...]`,
    NaN = nodata; outputs of the labels' shape, or with a trailing channel of 1)."""
    if outputs.shape.rank == labels.shape.rank + 1:
        outputs = outputs[..., 0]
    counted = valid(labels)
    y = tf.cast(tf.where(counted, labels, 0.0), tf.float64)
    e = tf.where(counted, tf.cast(outputs, tf.float64) - y, tf.zeros_like(y))
    w = tf.cast(counted, tf.float64)
    return tf.stack([tf.reduce_sum(w), tf.reduce_sum(e * e), tf.reduce_sum(tf.abs(e)), tf.reduce_sum(y),
                     tf.reduce_sum(y * y)])


def from_regression_sums(sums, prefix: str = "val_") -> dict:
    """RMSE, MAE and R² (NaN where undefined: no pixel; R² of a constant target) of summed `regression_sums`, and
    the pixels counted."""
    n, sse, sae, sy, syy = (float(v) for v in np.asarray(sums, np.float64))
    total = syy - sy * sy / n if n else 0.0
    nan = float("nan")
    return {f"{prefix}rmse": float(np.sqrt(sse / n)) if n else nan, f"{prefix}mae": sae / n if n else nan,
            f"{prefix}r2": 1.0 - sse / total if total > 0 else nan, f"{prefix}count": int(n)}


class Classification:
    """The evaluation seam of `harness.train.loop.evaluator.Evaluator(metrics=...)`: `counts(labels, logits)` per
    replica (`dtype`, `shape`; summed across replicas, ranks and steps by the evaluator), `results(summed)` the
    metrics dict, `counted(summed)` the labels counted (valid pixels or examples)."""

    dtype = tf.int64

    def __init__(self, num_classes: int):
        self.num_classes = num_classes

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_classes, self.num_classes)

    def counts(self, labels, logits):
        return confusion_counts(labels, logits, self.num_classes)

    def results(self, summed) -> dict:
        return from_confusion(summed)

    def counted(self, summed) -> int:
        return int(np.asarray(summed).sum())


class Regression:
    """As `Classification`, for a regression output: RMSE, MAE, R² from `regression_sums`."""

    dtype = tf.float64
    shape = (5,)

    def counts(self, labels, outputs):
        return regression_sums(labels, outputs)

    def results(self, summed) -> dict:
        return from_regression_sums(summed)

    def counted(self, summed) -> int:
        return int(np.asarray(summed)[0])


def for_task(task: str, num_classes: int):
    """The metrics of a run: `Classification(num_classes)` or `Regression()`."""
    return Regression() if task == "regression" else Classification(num_classes)


PER_CLASS = PER_CLASS_METRICS


def per_class_scalars(logs: dict, class_names: Sequence[str] = ()) -> dict:
    """`{"val_iou/<class>": value, ...}` for every per-class list in `logs` (`val_precision`, `val_recall`,
    `val_f1`, `val_iou`), the class named by `class_names` when given, else by its id; NaN values left out."""
    out = {}
    for key in PER_CLASS:
        values = logs.get(f"val_{key}")
        if not isinstance(values, list):
            continue
        for c, v in enumerate(values):
            name = class_names[c] if c < len(class_names) else str(c)
            if v is not None and np.isfinite(v):
                out[f"val_{key}/{name}"] = float(v)
    return out


def by_class(logs: dict, class_names: Sequence[str]) -> dict:
    """`{name: {"precision": p, "recall": r, "f1": f, "iou": i}}` from an epoch's per-class lists (NaN kept)."""
    return {name: {key: logs[f"val_{key}"][c] for key in PER_CLASS if f"val_{key}" in logs}
            for c, name in enumerate(class_names)}
