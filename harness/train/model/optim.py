"""The optimizer and its learning-rate schedule, built by the harness inside the strategy's scope.

- `--optimizer adam|adamw|sgd` (SGD with `--momentum`, `--nesterov`; `--weight-decay` decoupled, Loshchilov &
  Hutter 2019, as Keras' optimizers apply it).
- `--scale-lr none|linear|sqrt` against `--base-batch-size`: the peak learning rate is `learning_rate × (global
  batch / base batch)` (linear scaling rule, Goyal et al. 2017, arXiv:1706.02677 §2.1) or × its square root
  (Krizhevsky 2014, arXiv:1404.5997). Nothing is scaled unless asked.
- `--schedule constant|cosine|step|exponential` after `--warmup-steps` / `--warmup-epochs` of linear warm-up
  (Goyal et al. §2.2, gradual warm-up): see `WarmupSchedule`.
The schedule is a function of the optimizer's step counter only (`optimizer.iterations`, restored with the
backup), so a resumed run continues the schedule where it stopped: warm-up is not restarted.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from harness.choices import LR_SCALINGS as SCALINGS, OPTIMIZERS, SCHEDULES
from harness.errors import ConfigError, UserCodeError
from harness import keras_kinds as kinds

ADAMW_WEIGHT_DECAY = 0.004   # adamw's decoupled weight decay when --weight-decay is not given (Keras' AdamW default)

DEFAULT_DECAY_RATE = {"step": 0.1, "exponential": 0.5}


def refuse_built(value, field: str = "optimizer") -> None:
    """A pre-built optimizer or schedule (an object, not a name) is refused: the harness builds its own inside
    the strategy's scope, so its variables are mirrored and its step counter is the one the backup restores.

    Raises:
      UserCodeError: naming the object's class.
    """
    if value is not None and not isinstance(value, str):
        raise UserCodeError(
            f"{field}: got a built {type(value).__name__} object; give its name instead (optimizer: one of "
            f"{OPTIMIZERS}, with learning_rate, momentum, nesterov, weight_decay; schedule: one of {SCHEDULES}): the "
            "harness builds the optimizer and schedule inside the strategy's scope, where its variables are "
            "mirrored and its step counter is the one a resumed run restores")


def peak_learning_rate(learning_rate: float, scale_lr: str, global_batch_size: int,
                       base_batch_size: Optional[int]) -> float:
    """The learning rate after warm-up: `learning_rate` scaled by global/base batch (`linear`), its square root
    (`sqrt`) or not at all (`none`).

    Raises:
      ConfigError: an unknown scaling, or scaling without `base_batch_size`.
    """
    if scale_lr not in SCALINGS:
        raise ConfigError(f"scale_lr must be one of {SCALINGS}, got {scale_lr!r}")
    if scale_lr == "none":
        return float(learning_rate)
    if not base_batch_size:
        raise ConfigError(f"--scale-lr {scale_lr} scales against --base-batch-size: give it (the batch the learning "
                          "rate was tuned for)")
    ratio = global_batch_size / base_batch_size
    return float(learning_rate) * (ratio if scale_lr == "linear" else math.sqrt(ratio))


def describe_peak(learning_rate: float, scale_lr: str, global_batch_size: int, base_batch_size: Optional[int]) -> str:
    """One line: the peak learning rate and how it was derived (printed by `harness plan` and `harness train`)."""
    peak = peak_learning_rate(learning_rate, scale_lr, global_batch_size, base_batch_size)
    if scale_lr == "none":
        return f"learning rate: peak {peak:g} (not scaled; --scale-lr linear|sqrt --base-batch-size B to scale)"
    factor = "" if scale_lr == "linear" else "sqrt"
    return (f"learning rate: peak {peak:g} = {learning_rate:g} x {factor}({global_batch_size}/{base_batch_size}) "
            f"({scale_lr} scaling with the global batch, Goyal et al. 2017)")


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """A schedule in steps (optimizer updates).

    Attributes:
      peak: learning rate after warm-up.
      total_steps: steps of the whole run (epochs × steps per epoch).
      warmup_steps: linear warm-up steps (0: none).
      kind: one of SCHEDULES.
      decay_steps: steps per decay period (`step`, `exponential`).
      decay_rate: factor per decay period (`step`, `exponential`).
    """

    peak: float
    total_steps: int
    warmup_steps: int = 0
    kind: str = "constant"
    decay_steps: int = 1
    decay_rate: float = 0.1

    def at(self, step: int) -> float:
        """The closed form, in Python floats: the learning rate of the update made at 0-based `step` (the value
        of `optimizer.iterations` before it).

        warm-up (step < W): peak × (step + 1) / W; then, with t = step − W and T = total − W:
        constant peak; cosine peak × ½(1 + cos(π·min(t, T)/T)) (Loshchilov & Hutter 2017, no restarts);
        step peak × rate^⌊t / decay_steps⌋; exponential peak × rate^(t / decay_steps).
        """
        w = self.warmup_steps
        if step < w:
            return self.peak * (step + 1) / w
        t, span = step - w, max(self.total_steps - w, 1)
        if self.kind == "cosine":
            return self.peak * 0.5 * (1.0 + math.cos(math.pi * min(t, span) / span))
        if self.kind == "step":
            return self.peak * self.decay_rate ** (t // self.decay_steps)
        if self.kind == "exponential":
            return self.peak * self.decay_rate ** (t / self.decay_steps)
        return self.peak


# The fields of a schedule's config that shape its rate, by kind (ScheduleConfig.at): the rest are unused.
_USED = {"constant": ("kind", "peak"), "cosine": ("kind", "peak", "total_steps"),
         "step": ("kind", "peak", "decay_steps", "decay_rate"),
         "exponential": ("kind", "peak", "decay_steps", "decay_rate")}


def used_fields(config: dict) -> dict:
    """The entries of a `ScheduleConfig` as a dict (`summary.json`'s "learning_rate") that `ScheduleConfig.at`
    reads for its kind: a constant schedule has no decay period or rate and no length, and warm-up is left out where
    it is 0 steps (what a report shows; an unknown kind keeps every entry)."""
    used = _USED.get(config.get("kind"))
    if used is None:
        return dict(config)
    return {k: v for k, v in config.items() if k in used or (k == "warmup_steps" and v)}


def make_schedule(config: ScheduleConfig, kind: str = kinds.TF_KERAS):
    """A `LearningRateSchedule` of the Keras `kind` (`harness.keras_kinds`) computing `config.at(step)` in
    float64, returned as float32."""
    import tensorflow as tf

    keras = kinds.module(kind)

    class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
        """`ScheduleConfig.at` in TensorFlow: the optimizer calls it with its step counter."""

        def __init__(self, cfg: ScheduleConfig):
            self.cfg = cfg

        def __call__(self, step):
            c = self.cfg
            s = tf.cast(step, tf.float64)
            peak = tf.constant(c.peak, tf.float64)
            w = float(c.warmup_steps)
            t, span = s - w, float(max(c.total_steps - c.warmup_steps, 1))
            if c.kind == "cosine":
                after = peak * 0.5 * (1.0 + tf.cos(math.pi * tf.minimum(t, span) / span))
            elif c.kind == "step":
                after = peak * tf.pow(tf.constant(c.decay_rate, tf.float64), tf.floor(t / c.decay_steps))
            elif c.kind == "exponential":
                after = peak * tf.pow(tf.constant(c.decay_rate, tf.float64), t / c.decay_steps)
            else:
                after = peak
            lr = tf.where(s < w, peak * (s + 1.0) / max(w, 1.0), after) if c.warmup_steps else after
            return tf.cast(lr, tf.float32)

        def get_config(self):
            return dataclasses.asdict(self.cfg)

    return WarmupSchedule(config)


def schedule_config(options, plan) -> ScheduleConfig:
    """The run's `ScheduleConfig` from `TrainOptions` and the epoch plan (steps per epoch, global batch).

    Raises:
      ConfigError: both warm-up flags, warm-up as long as the run, a bad decay rate or period.
    """
    steps = plan.steps_per_epoch
    total = options.epochs * steps
    if options.warmup_steps is not None and options.warmup_epochs is not None:
        raise ConfigError("give --warmup-steps or --warmup-epochs, not both")
    warmup = options.warmup_steps if options.warmup_steps is not None else \
        round((options.warmup_epochs or 0) * steps)
    if warmup < 0 or (warmup and warmup >= total):
        raise ConfigError(f"warm-up of {warmup} steps must be >= 0 and shorter than the run ({total} steps)")
    rate = options.decay_rate if options.decay_rate is not None else DEFAULT_DECAY_RATE.get(options.schedule, 0.1)
    if not 0 < rate <= 1:
        raise ConfigError(f"decay_rate must be in (0, 1], got {rate}")
    decay_steps = max(1, round((options.decay_epochs or 1) * steps))
    peak = peak_learning_rate(options.learning_rate, options.scale_lr, plan.global_batch_size,
                              options.base_batch_size)
    return ScheduleConfig(peak=peak, total_steps=total, warmup_steps=warmup, kind=options.schedule,
                          decay_steps=decay_steps, decay_rate=rate)


def make_optimizer(options, schedule, kind: str = kinds.TF_KERAS):
    """The optimizer of the Keras `kind` named by `options.optimizer` with `schedule` (of the same kind) as its
    learning rate (call inside the strategy's scope).

    `options` is a `TrainOptions`, checked on construction (`check_options`): momentum or nesterov with an
    optimizer other than sgd was refused there, before any data was read.
    """
    keras = kinds.module(kind)
    name, decay = options.optimizer, options.weight_decay
    if name == "sgd":
        return keras.optimizers.SGD(schedule, momentum=options.momentum or 0.0, nesterov=bool(options.nesterov),
                                    weight_decay=decay or None)
    if name == "adamw":
        return keras.optimizers.AdamW(schedule, weight_decay=ADAMW_WEIGHT_DECAY if decay is None else decay)
    return keras.optimizers.Adam(schedule, weight_decay=decay or None)


def check_options(options) -> None:
    """The optimizer fields of `TrainOptions`, checked on construction.

    Raises:
      UserCodeError: a built optimizer or schedule object (`refuse_built`).
      ConfigError: an unknown name, a negative value, scaling without a base batch, momentum or nesterov with an
        optimizer other than sgd.
    """
    refuse_built(options.optimizer, "optimizer")
    refuse_built(options.schedule, "schedule")
    for field, choices in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES), ("scale_lr", SCALINGS)):
        if getattr(options, field) not in choices:
            raise ConfigError(f"{field} must be one of {choices}, got {getattr(options, field)!r}")
    for field in ("momentum", "weight_decay", "warmup_steps", "warmup_epochs", "clip_norm", "decay_epochs"):
        value = getattr(options, field)
        if value is not None and value < 0:
            raise ConfigError(f"{field} must be >= 0, got {value}")
    if options.optimizer != "sgd" and (options.momentum or options.nesterov):
        raise ConfigError(f"--momentum and --nesterov are SGD's; --optimizer is {options.optimizer}")
    if options.clip_norm is not None and options.clip_norm == 0:
        raise ConfigError("clip_norm must be > 0 (omit it for no clipping)")
    if options.scale_lr != "none" and not options.base_batch_size:
        raise ConfigError(f"--scale-lr {options.scale_lr} scales against --base-batch-size: give it (the batch the "
                          "learning rate was tuned for)")
