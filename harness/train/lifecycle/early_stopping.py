"""Training control: `--monitor METRIC` keeps the best epoch's model (`OUTPUT/best/model.keras`) and
`--early-stopping PATIENCE [--min-delta D]` stops when the metric has not improved by more than D for PATIENCE
epochs (as tf_keras.callbacks.EarlyStopping).

The decision is taken from the epoch's logs, whose loss and validation metrics are already reduced over every
replica, worker and rank (`harness.train.loop.evaluator.Evaluator.evaluate`), so every worker decides the same at the
same epoch and none waits in a collective that another has left. It decides before the epoch's backup is written (the
backup holds its state) and raises `StopTraining` (carrying the epochs run) after.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Optional

from harness import choices
from harness.errors import ConfigError
from harness.train.loop.controller import StopTraining


def mode_of(monitor: str) -> str:
    """"min" for losses and errors (names with loss, rmse or mae), "max" for accuracy, IoU, F1 and the rest."""
    return "min" if any(word in monitor for word in ("loss", "rmse", "mae")) else "max"


class EarlyStopping:
    """Track `monitor`, keep the best epoch's model, stop after `patience` epochs without improvement.

    Two epoch-end callbacks, around the backup: `record(epoch, logs)` before it (decides, saves the best model),
    `stop_if_done(epoch, logs)` after it (raises `StopTraining`), so the backup of an epoch holds that epoch's
    decision and a stop happens only once the epoch is backed up. `on_epoch_end` does both (no backup between).

    The state (best value, best epoch, epochs without improvement) lives in `state`, a `tf.Module` of variables
    that the job's backup saves and restores (and broadcasts under Horovod), so a resumed run stops at the epoch an
    uninterrupted one would and keeps the same best model: the wait is not reset by a restart.

    Args:
      monitor: a key of the epoch's logs (`loss`, `val_loss`, `val_accuracy`, `val_mean_iou`, `val_rmse`, ...).
      patience: epochs without improvement before stopping; None: never stop (only keep the best model).
      min_delta: the least change that counts as an improvement (in the metric's units).
      save_best: called on every worker when an epoch improves on the best (saves the model on the chief).
    """

    def __init__(self, *, monitor: str, patience: Optional[int] = None, min_delta: float = 0.0,
                 save_best: Callable[[int], None] = lambda epoch: None):
        import tensorflow as tf

        self.monitor, self.patience, self.min_delta, self.save_best = monitor, patience, min_delta, save_best
        self.mode = mode_of(monitor)
        self.history = []
        self.state = tf.Module(name="early_stopping")
        self.state.best = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="best")
        self.state.best_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="best_epoch")  # 0: none yet
        self.state.wait = tf.Variable(0, dtype=tf.int64, trainable=False, name="wait")

    @property
    def best_epoch(self) -> Optional[int]:
        return int(self.state.best_epoch.numpy()) or None

    @property
    def best(self) -> Optional[float]:
        return float(self.state.best.numpy()) if self.best_epoch else None

    @property
    def wait(self) -> int:
        return int(self.state.wait.numpy())

    def improved(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta

    def record(self, epoch: int, logs: dict) -> None:
        """Raises:
          ConfigError: the monitored key is not in the logs (naming those that are).
        """
        self.history.append(dict(logs))
        if self.monitor not in logs:
            raise ConfigError(f"--monitor {self.monitor}: not in the epoch's logs; choose one of "
                              f"{sorted(k for k, v in logs.items() if isinstance(v, (int, float)))}")
        value = float(logs[self.monitor])
        if self.improved(value):
            self.state.best.assign(value)
            self.state.best_epoch.assign(epoch)
            self.state.wait.assign(0)
            self.save_best(epoch)
        else:
            self.state.wait.assign_add(1)

    def stop_if_done(self, epoch: int, logs: dict) -> None:
        """Raises:
          StopTraining: after `patience` epochs without improvement.
        """
        if self.patience is not None and self.wait >= self.patience:
            raise StopTraining(self.history, f"early stopping at epoch {epoch}: {self.monitor} has not improved "
                                             f"by more than {self.min_delta} for {self.wait} epochs (best "
                                             f"{self.best:.4f} at epoch {self.best_epoch})")

    # The controller's action (`harness.train.loop.controller`): record before the epoch's backup, which then
    # holds the state; stop after it.
    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        self.record(epoch, logs)

    def after_epoch_end(self, epoch: int, logs: dict) -> None:
        self.stop_if_done(epoch, logs)

    def summary(self, best_path: Optional[str]) -> dict:
        return {"monitor": self.monitor, "mode": self.mode, "value": self.best, "epoch": self.best_epoch,
                "model": best_path}


# What `--monitor` can name, per task: the training loss and, with validation data, the validation metrics.
MONITORS = choices.MONITORS


def check(options, task: str = "classification") -> None:
    """Refuse a `--monitor` / `--early-stopping` / `--min-delta` combination that cannot work, before any data is
    read: a metric the task's epoch logs will not hold (`val_rmse` on classification, `val_mean_iou` on
    regression, a typo), a validation metric without validation data, or `--min-delta` without `--monitor` or
    `--early-stopping` (it would be ignored).

    Raises:
      ConfigError: naming the flag, the value and the metrics there are.
    """
    if options.min_delta and not options.monitor and options.early_stopping is None:
        raise ConfigError(f"--min-delta {options.min_delta} given without --early-stopping or --monitor: it would "
                          "be ignored")
    if options.min_delta < 0:
        raise ConfigError(f"--min-delta must be >= 0 (the least improvement that counts), got {options.min_delta}")
    if not options.monitor:
        return
    known = MONITORS.get(task, ("loss",))
    if options.monitor not in known:
        other = [t for t, names in MONITORS.items() if t != task and options.monitor in names]
        why = f" (a {other[0]} metric)" if other else ""
        raise ConfigError(f"--monitor {options.monitor}: not a metric of task {task}{why}; choose one of "
                          f"{list(known)}")
    if options.monitor.startswith("val_") and not options.validation_data:
        raise ConfigError(f"--monitor {options.monitor} is a validation metric: give --validation-data")


def make(options, model, context, save_model: Callable) -> Optional[EarlyStopping]:
    """The run's `EarlyStopping` from `TrainOptions` (`monitor`, `early_stopping`, `min_delta`), or None.

    `--early-stopping` alone monitors `val_loss` with validation data, else `loss`. The best model goes to
    `OUTPUT/best/model.keras` (`save_model(model, folder, context)`, every worker calls it).

    Raises:
      ConfigError: a validation metric without validation data.
    """
    if not options.monitor and options.early_stopping is None:
        return None
    monitor = options.monitor or ("val_loss" if options.validation_data else "loss")
    if monitor.startswith("val_") and not options.validation_data:
        raise ConfigError(f"--monitor {monitor} is a validation metric: give --validation-data")
    folder = os.path.join(options.output, "best")

    def save_best(epoch: int) -> None:
        if context.is_chief:
            import tensorflow as tf

            tf.io.gfile.makedirs(folder)   # the output may be on gs://
        save_model(model, folder, context)
    return EarlyStopping(monitor=monitor, patience=options.early_stopping, min_delta=options.min_delta,
                         save_best=save_best)
