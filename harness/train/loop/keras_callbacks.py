"""The user's Keras callbacks (`harness.train.job.run(options, callbacks=[...])`), of the model's kind (Keras 3 or
tf-keras: `harness.keras_kinds`), driven by the controller as Keras' `fit` drives them; those the harness does
itself under distribution are refused with the flag that does it.
"""
from __future__ import annotations

REPLACED = {"ModelCheckpoint": "--monitor METRIC (keeps OUTPUT/best/model.keras; the final model is OUTPUT/model.keras)",
            "BackupAndRestore": "the harness's own backup (OUTPUT/backup/, resumed by the same command)",
            "EarlyStopping": "--early-stopping PATIENCE --monitor METRIC (decided on metrics reduced over all workers)",
            # the harness's learning rate is a schedule of the optimizer's step (restored with the backup), which
            # these callbacks cannot set (`model.optimizer.lr` is not a variable)
            "LearningRateScheduler": "--schedule constant|cosine|step|exponential with --learning-rate and "
                                     "--warmup-steps/--warmup-epochs (a function of the step, continued on resume)",
            "ReduceLROnPlateau": "--schedule cosine|step|exponential (a function of the step; decided before the "
                                 "run, the same on every worker)"}
WRITERS = ("CSVLogger", "TensorBoard")  # Keras callbacks that only write files: the chief's alone


def _keras_own(cb) -> bool:
    """Whether `cb`'s class is one of Keras' own (tf-keras or Keras 3), not the user's."""
    return type(cb).__module__.split(".")[0] in ("tf_keras", "keras")


def _overrides(cb, *names: str) -> bool:
    """Whether `cb`'s class defines one of the Keras `Callback` hooks `names` itself (against its own kind's base)."""
    from harness import keras_kinds as kinds

    base = kinds.module(kinds.of(cb) or kinds.TF_KERAS).callbacks.Callback
    return any(getattr(type(cb), n, None) is not getattr(base, n) for n in names)


class KerasCallbacks:
    """Keras callbacks of the model's kind (`harness.train.job.run(options, callbacks=[...])`) driven by the harness's controller
    (`harness.train.loop.controller.Controller`) as Keras' `fit` drives them:
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

    Callbacks that write files (Keras' `CSVLogger`, `TensorBoard`, or any with `harness_writes = True`) run on
    the chief only; the rest on every worker, so that a callback that changes training state does so everywhere.

    Raises (on construction):
      UserCodeError: an object that is not a Keras Callback, a callback of the other Keras than the model's
        (`harness.keras_kinds.check_same`), or a Keras callback the harness does itself (`REPLACED`, naming
        the flag to use).
    """

    def __init__(self, callbacks, model, context, optimizer=None):
        from harness import keras_kinds as kinds

        check_callbacks(callbacks)
        kind = kinds.of_model(model)
        chosen = []
        for cb in callbacks:
            name = type(cb).__name__
            kinds.check_same(kind, cb, f"callback {name}")
            writes = getattr(cb, "harness_writes", name in WRITERS and _keras_own(cb))
            if writes and not context.is_chief:
                continue
            chosen.append(cb)
        self.callbacks, self.model, self.optimizer = chosen, model, optimizer
        before = [type(cb).__name__ for cb in chosen if _overrides(cb, "on_train_batch_begin", "on_batch_begin")
                  and not _keras_own(cb)]
        self.every_step = before[0] if before else None
        self.batch_hooks = any(_overrides(cb, "on_train_batch_end", "on_batch_end") or
                               (name_of(cb) == "TensorBoard" and getattr(cb, "update_freq", "epoch") != "epoch")
                               for cb in chosen)
        test_batch = [type(cb).__name__ for cb in chosen if _overrides(cb, "on_test_batch_begin", "on_test_batch_end")
                      and not _keras_own(cb)]
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
        if hasattr(self.model, "_train_counter"):   # tf-keras's step for its callbacks; Keras 3's read the
            self.model._train_counter.assign(global_step)   # optimizer's step counter
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
      UserCodeError: not a Keras Callback (of either kind), or one of `REPLACED`.
    """
    from harness.errors import UserCodeError
    from harness import keras_kinds as kinds

    for cb in callbacks:
        name, kind = type(cb).__name__, kinds.of(cb)
        if kind is None or not isinstance(cb, kinds.module(kind).callbacks.Callback):
            raise UserCodeError(f"callback {name}: not a Keras callback (keras.callbacks.Callback of Keras 3 or "
                                "tf_keras)")
        if name in REPLACED and _keras_own(cb):
            raise UserCodeError(f"callback {name}: the harness does this itself under distribution; use "
                                f"{REPLACED[name]}")
