"""The evaluator (orbit's `StandardEvaluator`): every validation record scored exactly once, on any number of
workers, replicas and ranks.

Validation does not use training's equal-steps rule (`drop_remainder=True`, every worker the steps of the one with
fewest records), which leaves up to a batch per worker unscored. The validation pipeline keeps its last, partial
batch and the whole pass runs in one `tf.function` call (a `tf.while_loop` over `get_next_as_optional`):
  - under tf.distribute, the distributed dataset's iterator agrees across workers on whether any worker still has
    data (`get_next_as_optional`, tf.distribute's partial-batch handling: tensorflow.org/tutorials/distribute/input,
    "Partial batches"); a worker or replica without data that step gets an empty batch, which scores nothing;
  - under Horovod each rank scores its own records (the default strategy's reduce is local) and the ranks agree
    at every step whether any still has data (`any_over_ranks`, one int32 all-reduce per step): a rank with fewer
    records draws empty batches until the last one's pass ends. Each rank's whole pass ran alone before, and the
    one with fewer records waited in the sums for the rest: under Horovod's stall inspector
    (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, horovod/horovod#2315) a wait longer than its bound shut the job down at
    every evaluation. In step, no rank waits longer than one validation batch.
The counts (loss sum, records, the metric's sums: a confusion matrix or the regression sums) are summed over
replicas, workers and ranks, so the metrics are those of the whole validation set, the same on every worker.
"""
from __future__ import annotations

from typing import Callable

import tensorflow as tf

from harness.tracing import graph_function, user_code


class Evaluator:
    """Scores `model` on a validation dataset; built by `harness.train.loop.factory.build_run`.

    Args:
      backend: the `TrainingBackend` (its strategy and cross-rank sum).
      model: the Keras model being trained (logits `[batch, ..., classes]` or regression outputs).
      loss_fn: `fn(labels, logits, class_weights) -> [batch]` float32 per-example loss (no weights here).
      metrics: `harness.train.model.metrics.Classification` / `Regression`.
      before_evaluate: called before each evaluation on every worker (the backend's `align_model_state`: every
        replica scores with the model state that is saved).
    """

    def __init__(self, *, backend, model, loss_fn, metrics, before_evaluate: Callable[[], None] | None = None):
        self.backend, self.strategy, self.model = backend, backend.strategy, model
        self.loss_fn, self.metrics, self.before_evaluate = loss_fn, metrics, before_evaluate
        # Traced as written; AutoGraph converts the user's model and loss only (`harness.tracing`).
        self._pass = graph_function(self._whole_pass)
        self._replica_fn = user_code(self._replica_step)

    def _replica_step(self, inputs, labels):
        logits = self.model(inputs, training=False)
        loss = tf.reduce_sum(self.loss_fn(labels, logits, None))
        records = tf.cast(tf.shape(labels)[0], tf.float64)
        return tf.stack([tf.cast(loss, tf.float64), records]), self.metrics.counts(labels, logits)

    def _whole_pass(self, iterator, totals, counts):
        """Sums over the whole of `iterator` (to its end, and to every rank's end under Horovod): `(totals, counts)`:
        float64 `[2]` loss sum and records, and the metric's counts (`metrics.shape`, `metrics.dtype`), over this
        worker's replicas (every worker's under tf.distribute)."""
        # AutoGraph's own rewrite of `for batch in iterator` (`_tf_iterator_for_stmt`): draw an optional, add the
        # batch's sums where it holds a value, stop at the first that does not.
        def one_batch(_, totals, counts):
            batch = iterator.get_next_as_optional()

            def add():
                per_replica = self.strategy.run(self._replica_fn, args=batch.get_value())
                step_totals, step_counts = (self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)
                                            for v in per_replica)
                return totals + step_totals, counts + step_counts
            has_value = batch.has_value()
            totals, counts = tf.cond(has_value, add, lambda: (totals, counts))
            return self.backend.any_over_ranks(has_value), totals, counts

        _, totals, counts = tf.while_loop(lambda more, *_: more, one_batch, (tf.constant(True), totals, counts))
        return totals, counts

    def evaluate(self, dataset) -> dict:
        """One pass over `dataset` (the distributed validation dataset, `Inputs.datasets`); every worker calls it.

        Returns:
          `val_loss` (the mean per-example loss), `val_records` (records scored, every record once), `val_pixels`
          (labels counted: pixels of masks, examples of tables; nodata labels not counted) and the metrics of the
          summed counts: for classification (`metrics.from_confusion`) val_accuracy, val_mean_iou, per-class
          val_precision/val_recall/val_f1/val_iou, val_confusion_matrix; for regression val_rmse, val_mae, val_r2.
        """
        if self.before_evaluate is not None:
            self.before_evaluate()
        # An iterator made here, not the dataset: iterating a distributed dataset inside the function reads its
        # options in graph mode, which TensorFlow warns about on every trace.
        totals, counts = self._pass(iter(dataset), tf.zeros([2], tf.float64),
                                    tf.zeros(self.metrics.shape, self.metrics.dtype))
        loss, records = self.backend.sum_over_ranks(totals).numpy().tolist()
        summed = self.backend.sum_over_ranks(counts)
        return {"val_loss": loss / max(records, 1.0), "val_records": int(records),
                "val_pixels": int(self.metrics.counted(summed)), **self.metrics.results(summed)}

