"""Classification metrics from one confusion matrix: counted per replica as int64, summed over replicas, workers
and ranks (exact, any number of pixels below 2**63), and only then turned into ratios. Averaging each replica's
IoU or F1 would weigh a replica's few pixels as much as another's many ("averaged averages"); ratios of summed
counts are the metrics of the whole validation set.

Definitions (per class c, from the matrix M[true, predicted]): precision = M[c,c] / Σ_t M[t,c], recall =
M[c,c] / Σ_p M[c,p], F1 = 2·M[c,c] / (Σ_t M[t,c] + Σ_p M[c,p]), IoU = M[c,c] / (Σ_t M[t,c] + Σ_p M[c,p] −
M[c,c]) (Jaccard); accuracy = trace / total; mean IoU over the classes present in labels or predictions (a class
absent from both has no IoU, as in Keras' MeanIoU, which divides by the classes with a non-zero denominator).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf


def confusion_counts(labels, logits, num_classes: int):
    """`[classes, classes]` int64 counts of (true, predicted) over every example or pixel of a batch; predicted
    = argmax of the logits."""
    predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return tf.math.confusion_matrix(tf.reshape(labels, [-1]), tf.reshape(predicted, [-1]),
                                    num_classes=num_classes, dtype=tf.int64)


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
