"""Training control: `--monitor METRIC` keeps the best epoch's model (`OUTPUT/best/model.keras`) and
`--early-stopping PATIENCE [--min-delta D]` stops when the metric has not improved by more than D for PATIENCE
epochs (as tf_keras.callbacks.EarlyStopping).

The decision is taken from the epoch's logs, whose loss and validation metrics are already reduced over every
replica, worker and rank (`harness.train.evaluator.Evaluator.evaluate`), so every worker decides the same at the same
epoch and none waits in a collective that another has left. It decides before the epoch's backup is written (the
backup holds its state) and raises `StopTraining` (carrying the epochs run) after.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Optional

from harness import choices
from harness.errors import ConfigError


class StopTraining(Exception):
    """Raised by `EarlyStopping.on_epoch_end` to end `Trainer.fit`; `history` holds the epochs' logs run."""

    def __init__(self, history: list, message: str):
        super().__init__(message)
        self.history = history


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

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        """`record` then `stop_if_done`."""
        self.record(epoch, logs)
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


# --- Keras callbacks through the Python API ------------------------------------------------------------------------
REPLACED = {"ModelCheckpoint": "--monitor METRIC (keeps OUTPUT/best/model.keras; the final model is OUTPUT/model.keras)",
            "BackupAndRestore": "the harness's own backup (OUTPUT/backup/, resumed by the same command)",
            "EarlyStopping": "--early-stopping PATIENCE --monitor METRIC (decided on metrics reduced over all workers)",
            # the harness's learning rate is a schedule of the optimizer's step (restored with the backup), which
            # these callbacks cannot set (`model.optimizer.lr` is not a variable)
            "LearningRateScheduler": "--schedule constant|cosine|step|exponential with --learning-rate and "
                                     "--warmup-steps/--warmup-epochs (a function of the step, continued on resume)",
            "ReduceLROnPlateau": "--schedule cosine|step|exponential (a function of the step; decided before the "
                                 "run, the same on every worker)"}
WRITERS = ("CSVLogger", "TensorBoard")  # tf_keras callbacks that only write files: the chief's alone


def _overrides(cb, *names: str) -> bool:
    """Whether `cb`'s class defines one of the tf_keras `Callback` hooks `names` itself."""
    import tf_keras as keras

    return any(getattr(type(cb), n, None) is not getattr(keras.callbacks.Callback, n) for n in names)


class KerasCallbacks:
    """tf_keras callbacks (`harness.train.job.run(options, callbacks=[...])`) driven by the harness's controller
    (`harness.train.controller.Controller`) as Keras' `fit` drives them:
      - `set_model` on construction; `model.optimizer` is the harness's optimizer while training (the model is not
        compiled: Keras' `compile` would build its own train function);
      - `on_train_begin` before the first step, `on_train_end` after the last (also after an early stop);
      - `on_epoch_begin(epoch − 1)` and `on_epoch_end(epoch − 1, logs)` every epoch (Keras counts epochs from 0;
        logs: the epoch's numbers, reduced over every worker);
      - `on_train_batch_end(batch, {"loss": loss})` once per step, `batch` its index in the epoch from 0, `loss`
        that step's loss (reduced over every replica and rank), with `model._train_counter` at the step's global
        number (so `TensorBoard(update_freq=N)` writes `batch_loss` every N steps). Under K steps per call they
        run after the call, in step order; a callback that sets `model.stop_training` stops the run after that
        call (its later steps have run);
      - `on_train_batch_begin(batch)` before each step, when a callback implements it: then every call is one step
        (`every_step` names that callback);
      - `on_test_begin()` and `on_test_end(logs)` around each epoch's evaluation (logs: its `val_*` numbers without
        the prefix, as Keras' evaluate gives them). The evaluation is one call over the whole validation set, so
        `on_test_batch_begin`/`on_test_batch_end` are not called: a callback that implements them is named once.

    Callbacks that write files (tf_keras `CSVLogger`, `TensorBoard`, or any with `harness_writes = True`) run on
    the chief only; the rest on every worker, so that a callback that changes training state does so everywhere.

    Raises (on construction):
      UserCodeError: a Keras 3 callback, an object that is not a tf_keras Callback, or a tf_keras callback the
        harness does itself (`REPLACED`, naming the flag to use).
    """

    def __init__(self, callbacks, model, context, optimizer=None):
        check_callbacks(callbacks)
        chosen = []
        for cb in callbacks:
            name = type(cb).__name__
            writes = getattr(cb, "harness_writes", name in WRITERS and type(cb).__module__.startswith("tf_keras"))
            if writes and not context.is_chief:
                continue
            chosen.append(cb)
        self.callbacks, self.model, self.optimizer = chosen, model, optimizer
        before = [type(cb).__name__ for cb in chosen if _overrides(cb, "on_train_batch_begin", "on_batch_begin")
                  and not type(cb).__module__.startswith("tf_keras")]
        self.every_step = before[0] if before else None
        self.batch_hooks = any(_overrides(cb, "on_train_batch_end", "on_batch_end") or
                               (name_of(cb) == "TensorBoard" and getattr(cb, "update_freq", "epoch") != "epoch")
                               for cb in chosen)
        test_batch = [type(cb).__name__ for cb in chosen if _overrides(cb, "on_test_batch_begin", "on_test_batch_end")
                      and not type(cb).__module__.startswith("tf_keras")]
        if test_batch:
            import logging
            logging.getLogger(__name__).warning(
                "callback %s: on_test_batch_begin/on_test_batch_end are not called (the evaluation is one call over "
                "the whole validation set); on_test_begin/on_test_end are", test_batch[0])
        if chosen and optimizer is not None and getattr(model, "optimizer", None) is None:
            model.optimizer = optimizer   # what callbacks read (`self.model.optimizer.iterations`, `.lr`)
        for cb in chosen:
            cb.set_model(model)

    def stop_requested(self) -> bool:
        """A callback set `model.stop_training` (Keras' way to stop `fit`)."""
        return bool(self.callbacks) and bool(getattr(self.model, "stop_training", False))

    def on_train_begin(self) -> None:
        self.model.stop_training = False
        for cb in self.callbacks:
            cb.on_train_begin({})

    def on_epoch_begin(self, epoch: int) -> None:
        for cb in self.callbacks:
            cb.on_epoch_begin(epoch - 1, {})

    def on_train_batch_begin(self, batch: int) -> None:
        for cb in self.callbacks:
            cb.on_train_batch_begin(batch, {})

    def on_train_batch_end(self, batch: int, logs: dict, global_step: int) -> None:
        """After step `global_step` (1-based), `batch` its index in the epoch (0-based)."""
        if not self.batch_hooks:
            return
        self.model._train_counter.assign(global_step)
        for cb in self.callbacks:
            cb.on_train_batch_end(batch, dict(logs))

    def on_test_begin(self) -> None:
        for cb in self.callbacks:
            cb.on_test_begin({})

    def on_test_end(self, logs: dict) -> None:
        numbers = {k[4:]: v for k, v in logs.items() if k.startswith("val_") and isinstance(v, (int, float))}
        for cb in self.callbacks:
            cb.on_test_end(dict(numbers))

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        numbers = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and k not in ("epoch", "step")}
        for cb in self.callbacks:
            cb.on_epoch_end(epoch - 1, dict(numbers))

    def on_train_end(self) -> None:
        for cb in self.callbacks:
            cb.on_train_end({})
        if self.optimizer is not None and getattr(self.model, "optimizer", None) is self.optimizer:
            self.model.optimizer = None   # the saved model holds no optimizer state, as before


def name_of(cb) -> str:
    return type(cb).__name__


def check_callbacks(callbacks) -> None:
    """Refuse what `KerasCallbacks` cannot run, before any data is read.

    Raises:
      UserCodeError: a Keras 3 callback (`check_flavour`), not a tf_keras Callback, or one of `REPLACED`.
    """
    import tf_keras as keras

    from harness.errors import UserCodeError
    from harness.train.user_model import check_flavour

    for cb in callbacks:
        name = type(cb).__name__
        check_flavour(cb, what=f"callback {name}")
        if not isinstance(cb, keras.callbacks.Callback):
            raise UserCodeError(f"callback {name}: not a tf_keras.callbacks.Callback")
        if name in REPLACED and type(cb).__module__.startswith("tf_keras"):
            raise UserCodeError(f"callback {name}: the harness does this itself under distribution; use "
                                f"{REPLACED[name]}")
