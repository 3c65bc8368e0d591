"""TensorBoard scalars per epoch, written by the chief only into `output/logs/train` (`tensorboard --logdir
output/logs`): the loss, the validation metrics (per class as `val_iou/<class name>`, ...), throughput, under loss
scaling the updates skipped and the loss scale, and the learning rate per step."""
from __future__ import annotations

import os

from typing import Sequence

import tensorflow as tf

from harness.choices import EPOCH_METRICS
from harness.train.model.metrics import per_class_scalars

SCALARS = (*EPOCH_METRICS, "examples_per_s", "input_stall_share", "skipped_updates", "loss_scale", "val_records",
           "val_pixels")
# TensorBoard's events are written out once per epoch: `SummaryWriter.as_default()` flushes the writer when its
# context exits (tensorflow/python/ops/summary_ops_v2.py, `_SummaryContextManager.__exit__`), so a context per step
# flushed at every step, and each flush of an events file on a bucket uploads the whole, growing file again (an
# object is not appended to: quadratic bytes, and Cloud Storage allows about one write per second to one object,
# https://cloud.google.com/storage/quotas). The steps' learning rates are written at the epoch's end, in one context.
MAX_QUEUE = 2 ** 20             # events held by the writer between its flushes (~100 bytes each)
FLUSH_MILLIS = 30 * 60 * 1000   # below 2**31 / 1000: TensorFlow compares it in microseconds


class EpochSummaries:
    """`on_epoch_end(epoch, logs)` callback: one scalar per key of `SCALARS` present in `logs`, at the global step,
    and one per class of each per-class metric (`val_precision/<name>`, `val_recall/`, `val_f1/`, `val_iou/`;
    `class_names` name the classes, else their ids; `harness.train.model.metrics.per_class_scalars`).

    Only the chief creates a writer; on other workers the callback does nothing (the output folder is the
    chief's). Events are written out once per epoch, at its end (module doc); on a bucket (`gs://` output) each
    epoch's events go to a file of their own, closed at the epoch's end: each object is uploaded once (TensorBoard
    reads every events file of the folder).

    Also a step hook (`Controller(step_hooks=...)`) when given the optimizer's `schedule`: `learning_rate` at every
    global step, the rate the update of that step used (`schedule(step - 1)`, the counter before the update)."""

    def __init__(self, output_dir: str, context, schedule=None, class_names: Sequence[str] = ()):
        self.logdir = os.path.join(output_dir, "logs", "train")
        self.chief, self.per_epoch = context.is_chief, "://" in output_dir
        self._writer, self._steps = None, []
        self.schedule = schedule
        self.class_names = tuple(class_names)

    @property
    def writer(self):
        """The chief's writer (opened at its first event), else None."""
        if self._writer is None and self.chief:
            self._writer = tf.summary.create_file_writer(self.logdir, max_queue=MAX_QUEUE, flush_millis=FLUSH_MILLIS)
        return self._writer

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        if self.chief and self.schedule is not None:
            self._steps.append(step)

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        if not self.chief:
            return
        with self.writer.as_default(step=logs["step"]):   # one context: one flush (module doc)
            for step in self._steps:   # the rate the update of each step used: the schedule's closed form
                tf.summary.scalar("learning_rate", self.schedule(step - 1), step=step)
            for key in SCALARS:
                if key in logs:
                    tf.summary.scalar(key, logs[key])
            for key, value in per_class_scalars(logs, self.class_names).items():
                tf.summary.scalar(key, value)
        self._steps = []
        if self.per_epoch:   # this epoch's file uploaded once, whole; the next epoch writes a new one
            self._writer.close()
            self._writer = None
        else:
            self._writer.flush()
