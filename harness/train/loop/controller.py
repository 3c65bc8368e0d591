"""The controller (orbit's `Controller`): epochs, steps per call, evaluation, the run's actions, backups and the
checks at each call's end, around a `harness.train.loop.trainer.Trainer`. Built by
`harness.train.loop.factory.build_run` only.

Steps per loop (K): an int, a function of the global step (orbit's `steps_per_loop: Union[int, Callable[[int],
int]]`), or None for auto (`choose_steps_per_loop` after a few timed one-step calls). A call never crosses an epoch
end (validation, backup) nor the edges of an action's step window (inside the profiler's trace window each call is
one step whose batch the host draws, so that the trace's input-pipeline analyzer finds the steps); a user callback
that must run before every step (`on_train_batch_begin`) makes every call one step (said once).

Actions (orbit's `train_actions`): one ordered sequence of objects, each with any of these methods, called in the
sequence's order at these points:
  - `before_step(step)`, `after_step(step)`: around each step of a call, outside its timed span (1-based global
    step); an action with `first` and `last` steps (a trace window) gets calls of one step from `first` to `last`;
  - `after_call(step)`: after each call's checks, with the step the call ended at; a truthy return asks for a
    backup at that step (a preemption): the controller writes it, then calls every `after_backup`;
  - `before_epoch_end(epoch)`: before the epoch's evaluation (the watchdog disarms);
  - `on_epoch_end(epoch, logs)`: after the evaluation and before the epoch's backup (whose state it may change:
    early stopping's record);
  - `after_backup(step)`: after each backup the controller writes (at an epoch end, or asked by `after_call`);
  - `after_epoch_end(epoch, logs)`: after the backup and the user's callbacks (a stop decision, the watchdog
    re-arms).
When backups happen is decided here only: at every epoch end, and at the step an `after_call` asks for one.

After each call, on the host: the steps are recorded in the timer, their batch-end hooks run (actions, then the
user's Keras callbacks once per step, with the step's index and loss), then the checks: a non-finite loss,
`model.stop_training` set by a callback, and updates skipped by loss scaling while the loss scale sits at its floor.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable, Sequence, Union


from harness.errors import LossScaleError, NonFiniteLossError
from harness.profile.timing import StepTimer
from harness.train.report.progress import DEFAULT_INTERVAL_S, Progress
from harness.train.loop.trainer import in_graph

log = logging.getLogger(__name__)

AUTO_TARGET_S = 0.25      # auto: one call lasts about this long (seconds), within orbit's usual 0.1-1 s
AUTO_MEASURED_CALLS = 3   # auto: calls of one step timed after warm-up before K is chosen
AUTO_MAX_STEPS = 1000
SKIPPED_AT_FLOOR_LIMIT = 10  # consecutive skipped updates, the scale at its floor, before the run is stopped

StepsPerLoop = Union[int, Callable[[int], int], None]
PHASES = ("before_step", "after_step", "after_call", "before_epoch_end", "on_epoch_end", "after_backup",
          "after_epoch_end")   # what an action may define (module doc)


class StopTraining(Exception):
    """Ends `Controller.fit` before its last epoch (early stopping, a callback's `model.stop_training`); `history`
    holds the logs of the epochs run."""

    def __init__(self, history: list, message: str):
        super().__init__(message)
        self.history = history


class EpochEnd:
    """An action of one function `fn(epoch, logs)` run at each epoch end, before the backup."""

    def __init__(self, fn: Callable[[int, dict], None]):
        self.on_epoch_end = fn


def choose_steps_per_loop(step_s: float, target_s: float = AUTO_TARGET_S, max_steps: int = AUTO_MAX_STEPS) -> int:
    """K for `steps_per_loop: auto`: the steps that fill about `target_s` seconds at `step_s` seconds per one-step
    call (which includes the per-call overhead, so K errs low), between 1 and `max_steps`."""
    if step_s <= 0:
        return max_steps
    return int(min(max_steps, max(1, round(target_s / step_s))))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How long to train.

    Attributes:
      epochs: epochs to run in all (a resumed run continues up to this number).
      steps_per_epoch: optimizer steps per epoch, the same on every worker (see `harness.distribute.batch`).
      steps_per_loop: K (int >= 1), `fn(global_step) -> K` (the step the call starts after), or None (auto).
      warmup_steps: first steps excluded from timing summaries (tracing, cache fill).
    """

    epochs: int
    steps_per_epoch: int
    steps_per_loop: StepsPerLoop = None
    warmup_steps: int = 2

    def __post_init__(self):
        k = self.steps_per_loop
        if isinstance(k, int) and k < 1:
            raise ValueError(f"steps_per_loop must be >= 1, a function of the step, or None (auto), got {k}")


class Controller:
    """Runs `trainer` for `schedule`, evaluating with `evaluator` at each epoch end.

    Args:
      trainer: `harness.train.loop.trainer.Trainer`.
      schedule: `Schedule`.
      context: the `WorkerContext`.
      evaluator: `harness.train.loop.evaluator.Evaluator`, or None.
      actions: the run's actions, in order (module doc): reporting (epoch lines, TensorBoard, the profiler's trace
        window) and the run's protections (`harness.train.lifecycle.guard.Guard.actions`).
      backup: a `harness.train.lifecycle.backup.Backup` written at every epoch end and where an action asks for
        one, or None.
      callbacks: `harness.train.loop.keras_callbacks.KerasCallbacks` (the user's tf_keras callbacks), or None.
      timer: the `StepTimer` to record steps in (default: a new one with `schedule.warmup_steps`).
      progress_s: seconds between the chief's progress lines where its output is not a terminal (0: none; a
        terminal gets a bar); `harness.train.report.progress`.
    Attributes:
      step: the global step of the last call completed (what a fault's message names).
    """

    def __init__(self, trainer, schedule: Schedule, *, context, evaluator=None, actions: Sequence = (), backup=None,
                 callbacks=None, timer: StepTimer | None = None, progress_s: float | None = DEFAULT_INTERVAL_S):
        self.step, self.progress_s = 0, progress_s
        self.trainer, self.schedule, self.context, self.evaluator = trainer, schedule, context, evaluator
        self.actions, self.backup, self.callbacks = tuple(actions), backup, callbacks
        self._at = {phase: tuple(getattr(a, phase) for a in self.actions if hasattr(a, phase)) for phase in PHASES}
        self._windows = tuple((a.first, a.last) for a in self.actions
                              if getattr(a, "first", None) is not None and getattr(a, "last", None) is not None)
        self.timer = timer or StepTimer(schedule.warmup_steps)
        k = schedule.steps_per_loop
        self.steps_per_loop = k if isinstance(k, int) else None   # the last K used (auto: None until measured)
        self._k_fn = k if callable(k) else None
        if callbacks is not None and callbacks.every_step:
            log.warning("callback %s runs before every step (on_train_batch_begin): one step per call",
                        callbacks.every_step)
            self._k_fn, self.steps_per_loop = (lambda step: 1), 1
        self._skipped_run = 0   # consecutive skipped updates, across calls
        self.steps_run = self.updates_skipped = 0   # steps run by this controller, and of them updates skipped

    # --- the run ----------------------------------------------------------------------------------------------
    def fit(self, train_iterator, *, validation: Callable[[], object] | None = None,
            initial_step: int = 0) -> list[dict]:
        """Train from global step `initial_step` to epochs × steps_per_epoch (a step inside an epoch, as a
        preemption's backup holds, continues that epoch: `train_iterator` then starts at its next batch).

        Args:
          train_iterator: iterator over distributed `(inputs, labels)` batches; never exhausted (the dataset
            repeats), so an epoch ends by step count on every worker alike.
          validation: returns the validation dataset (scored whole, `Evaluator.evaluate`), or None.
        Returns:
          one logs dict per epoch run: loss, the evaluation's val_* (with val_records, val_pixels),
          examples_per_s, input_stall_share, steps, and under loss scaling skipped_updates and loss_scale.
        Raises:
          NonFiniteLossError: when the loss of a step is NaN or infinite and no callback stopped the run (all
            workers see the same reduced loss, so all stop at the same step). The check runs once per call: the
            error names the call's first non-finite step, and the call's later steps have run.
          LossScaleError: at least `SKIPPED_AT_FLOOR_LIMIT` consecutive updates skipped and the loss scale halved
            down to its floor (`trainer.loss_scale_floor`, `harness.keras_kinds.LOSS_SCALE_FLOOR`: tf-keras's
            1, below which it cannot go; float16's smallest normal for Keras 3: a lower scale cannot help).
          StopTraining: raised by an action (early stopping) or for a callback's `model.stop_training` (carries
            the epochs run).
          what an action raises (a preemption's `PreemptedError`, a Ctrl-C's `InterruptedError`).
        """
        s, history = self.schedule, []
        step = self.step = initial_step
        if self.callbacks is not None:
            self.callbacks.on_train_begin()
        for epoch in range(initial_step // s.steps_per_epoch, s.epochs):
            if self.callbacks is not None:
                self.callbacks.on_epoch_begin(epoch + 1)
            first_timed = len(self.timer.steps)
            shown = Progress(is_chief=self.context.is_chief, epoch=epoch + 1, epochs=s.epochs,
                             steps=s.steps_per_epoch, interval_s=self.progress_s)
            loss_sum, skipped, epoch_start, end = 0.0, 0, step, (epoch + 1) * s.steps_per_epoch
            stopped = False
            while step < end:
                k, host_fed = self._steps_this_call(step, end, train_iterator)
                losses, skips = self._run_call(train_iterator, step, k, host_fed)
                stopped = self._after_call(step, epoch, epoch_start, losses, skips)
                step += k
                self.step = step
                loss_sum += float(sum(losses))
                skipped += int(sum(skips)) if skips else 0
                shown.update(step - epoch * s.steps_per_epoch, k, losses[-1],
                             lambda: self.timer.summary(self.timer.steps[first_timed:]))
                if any([ask(step) for ask in self._at["after_call"]]):   # every action runs, then the backup
                    self._save(step)
                if stopped:
                    break
            shown.close()
            for action in self._at["before_epoch_end"]:
                action(epoch + 1)
            logs = {"epoch": epoch + 1, "step": step, "loss": loss_sum / max(step - epoch_start, 1)}
            if stopped and step < end:  # stopped inside the epoch: no evaluation, no epoch-end backup
                history.append({**logs, **self.timer.summary(self.timer.steps[first_timed:])})
                self._stop(history, step, epoch)
            if self.trainer.loss_scaling:
                logs.update(skipped_updates=skipped, loss_scale=self.trainer.loss_scale())
            if validation is not None and self.evaluator is not None:
                if self.callbacks is not None:
                    self.callbacks.on_test_begin()
                scores = self.evaluator.evaluate(validation())
                if self.callbacks is not None:
                    self.callbacks.on_test_end(scores)
                logs.update(scores)
            logs.update(self.timer.summary(self.timer.steps[first_timed:]))
            history.append(logs)
            try:
                for action in self._at["on_epoch_end"]:
                    action(epoch + 1, logs)
                self._save(step)
                if self.callbacks is not None:
                    self.callbacks.on_epoch_end(epoch + 1, logs)
                for action in self._at["after_epoch_end"]:
                    action(epoch + 1, logs)
            except StopTraining as stop:
                stop.history = history
                raise
            if stopped or (self.callbacks is not None and self.callbacks.stop_requested()):
                self._stop(history, step, epoch)
        return history

    def _save(self, step: int) -> None:
        """The backup at global step `step` (every worker), then the actions' `after_backup`."""
        if self.backup is None:
            return
        self.backup.save(step)
        for action in self._at["after_backup"]:
            action(step)

    @staticmethod
    def _stop(history: list, step: int, epoch: int):
        raise StopTraining(history, f"stopped at step {step} (epoch {epoch + 1}): a callback set "
                                    "model.stop_training")

    def end(self) -> None:
        """After the run, stopped early or not: the callbacks' `on_train_end`."""
        if self.callbacks is not None:
            self.callbacks.on_train_end()

    def _after_call(self, step: int, epoch: int, epoch_start: int, losses, skips) -> bool:
        """The checks after the call of steps `step + 1 ..`: the user's batch-end hooks, a non-finite loss, the
        skipped updates at the loss-scale floor. Returns whether a callback asked to stop."""
        if self.callbacks is not None:
            for i, loss in enumerate(losses):
                self.callbacks.on_train_batch_end(step + i - epoch_start, {"loss": loss}, step + i + 1)
            if self.callbacks.stop_requested():
                return True
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                raise NonFiniteLossError(
                    f"loss is {loss} at step {step + i + 1} (epoch {epoch + 1}); lower the learning rate "
                    "or check the input for NaN/inf values")
        self.steps_run += len(losses)
        if self.trainer.loss_scaling:
            self.updates_skipped += int(sum(skips))
            for skip in skips:
                self._skipped_run = self._skipped_run + 1 if skip else 0
            scale = self.trainer.loss_scale() if self._skipped_run >= SKIPPED_AT_FLOOR_LIMIT else None
            if scale is not None and scale <= self.trainer.loss_scale_floor:
                raise LossScaleError(
                    f"the last {self._skipped_run} updates were skipped (gradients not finite) with the loss scale "
                    f"at its floor {scale:g}, at step {step + len(losses)} (epoch {epoch + 1}): "
                    f"{self.steps_run - self.updates_skipped} of {self.steps_run} steps run applied an update; the "
                    "gradients overflow at the lowest scale that can help: check the loss and its inputs, lower the learning rate, or "
                    "train with --precision float32")
        return False

    def _run_call(self, iterator, step: int, k: int, host_fed: bool) -> tuple[list[float], list[float]]:
        """Steps `step + 1 .. step + k` in one call of the trainer; records them in the timer and returns their
        losses (averaged over ranks) and skipped flags (1: skipped; empty without loss scaling), after the one wait
        for the device. `host_fed`: one step
        whose batch is drawn on the host and passed to `train_step` (a Python iterator; the profiler's trace
        window, whose input-pipeline analyzer finds steps by the host's `next(iterator)`)."""
        for s in range(step + 1, step + k + 1):
            for before_step in self._at["before_step"]:
                before_step(s)
        if self.callbacks is not None and self.callbacks.every_step:
            self.callbacks.on_train_batch_begin(step % self.schedule.steps_per_epoch)
        batch = self.trainer.global_batch_size
        mark = self.timer.begin()
        if not host_fed:
            rows = self.trainer.run_loop(iterator, k).tolist()   # the one wait for the device
            losses, waits, durations = rows[:3]
            skips = rows[3] if len(rows) > 3 else ()   # () without loss scaling: no update is ever skipped
            self.timer.end_call(mark, step + 1, waits, durations, batch)
        else:
            batch_in = next(iterator)
            self.timer.got_input(mark)
            loss, skip = self.trainer.train_step(batch_in).numpy().tolist()
            losses, skips = [loss], [skip]
            self.timer.end(mark, step + 1, batch)
        for s in range(step + 1, step + k + 1):
            for after_step in self._at["after_step"]:
                after_step(s)
        return losses, skips

    def _steps_this_call(self, step: int, epoch_end: int, iterator=None) -> tuple[int, bool]:
        """`(K, host_fed)` for the call that starts after global step `step`: the configured, scheduled or auto K,
        never past the epoch's end, ending before an action's window (`first`..`last`) opens; inside the window one
        host-fed step per call (as for a Python iterator)."""
        if self._k_fn is not None:
            k = int(self._k_fn(step))
            if k < 1:
                raise ValueError(f"steps_per_loop({step}) returned {k}: K must be >= 1")
            self.steps_per_loop = k
        else:
            k = self.steps_per_loop if self.steps_per_loop is not None else self._auto_steps()
        host_fed = not in_graph(iterator)
        for first, last in self._windows:
            if first <= step + 1 <= last:
                host_fed = True
            elif step + 1 < first:
                k = min(k, first - step - 1)
        return (1, True) if host_fed else (max(1, min(k, epoch_end - step)), False)

    def _auto_steps(self) -> int:
        """Auto K: 1 through warm-up and `AUTO_MEASURED_CALLS` timed one-step calls, then `choose_steps_per_loop`
        from their median wall time (input wait included), the same on every worker."""
        measured = [s.step_s for s in self.timer.steps if not s.warmup]
        if len(measured) < AUTO_MEASURED_CALLS:
            return 1
        step_s = self.trainer.backend.mean_over_workers(sorted(measured)[len(measured) // 2])
        self.steps_per_loop = choose_steps_per_loop(step_s)
        log.info("steps per loop: %d (auto, %.2f ms per one-step call)", self.steps_per_loop, 1e3 * step_s)
        return self.steps_per_loop
