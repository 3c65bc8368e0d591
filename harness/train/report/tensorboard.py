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


class EpochSummaries:
    """`on_epoch_end(epoch, logs)` callback: one scalar per key of `SCALARS` present in `logs`, at the global step,
    and one per class of each per-class metric (`val_precision/<name>`, `val_recall/`, `val_f1/`, `val_iou/`;
    `class_names` name the classes, else their ids; `harness.train.model.metrics.per_class_scalars`).

    Only the chief creates a writer; on other workers the callback does nothing (the output folder is the
    chief's).

    Also a step hook (`Controller(step_hooks=...)`) when given the optimizer's `schedule`: `learning_rate` at every
    global step, the rate the update of that step used (`schedule(step - 1)`, the counter before the update)."""

    def __init__(self, output_dir: str, context, schedule=None, class_names: Sequence[str] = ()):
        self.writer = (tf.summary.create_file_writer(os.path.join(output_dir, "logs", "train"))
                       if context.is_chief else None)
        self.schedule = schedule
        self.class_names = tuple(class_names)

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        if self.writer is None or self.schedule is None:
            return
        with self.writer.as_default(step=step):
            tf.summary.scalar("learning_rate", self.schedule(step - 1))

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        if self.writer is None:
            return
        with self.writer.as_default(step=logs["step"]):
            for key in SCALARS:
                if key in logs:
                    tf.summary.scalar(key, logs[key])
            for key, value in per_class_scalars(logs, self.class_names).items():
                tf.summary.scalar(key, value)
        self.writer.flush()
