"""The run's parts, built in one place from its options (as Model Garden's `official/core/base_task.py` `Task`:
build_model, create_optimizer, build_losses, build_metrics from one config): the precision policy, the model (the
user's function or the built-in U-Net / pixel classifier), the learning-rate schedule, the optimizer (wrapped for
loss scaling where the policy needs it), the loss and the validation metrics.

`harness train` (its run and its input-cost probe), `harness bench train`, `harness evaluate` and every script in
`benchmarks/` take them from here: a benchmark times the parts users train (`tests/test_layout.py` holds that no
other module calls the builders of `optim`, `losses`, `precision`, `builtin` and `user`).

    parts = RunParts(options, task="classification")   # before any data is read: the model function, the loss
    policy = parts.apply_policy()
    with backend.scope():
        built = parts.build(inputs, say)                # model, its Keras kind, schedule, optimizer
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from harness import keras_kinds as kinds
from harness.train.model import builtin, loadable, losses, metrics, optim, precision, user


@dataclasses.dataclass(frozen=True)
class Built:
    """A run's model and optimizer, built under the strategy's scope (`RunParts.build`).

    Attributes:
      model: the Keras model (Keras 3 or tf-keras) of float32 logits.
      kind: its Keras kind (`harness.keras_kinds`): the schedule and optimizer are of the same.
      schedule: the learning-rate schedule (`optim.make_schedule`: a function of `optimizer.iterations` only).
      optimizer: the optimizer over `schedule`, wrapped for loss scaling where the policy needs it.
    """

    model: object
    kind: str
    schedule: object
    optimizer: object


def builtin_model(kind: str, input_shape, num_classes: int, *, mean=None, variance=None,
                  keras_kind: str = kinds.TF_KERAS, batch_norm: bool = True):
    """The built-in model of a data kind (`builtin.builtin_model`: the U-Net for image patches `[height, width,
    bands]`, the pixel classifier for table rows `[bands]`), in the Keras `keras_kind`; `batch_norm` False: the
    U-Net without BatchNormalization (benchmarks). Logits float32 `[batch, height, width, classes]` or
    `[batch, classes]`."""
    keras = kinds.module(keras_kind)
    if kind == "image" and not batch_norm:
        return builtin.unet(*input_shape, num_classes, mean=mean, variance=variance, keras=keras, batch_norm=False)
    return builtin.builtin_model(kind, input_shape, num_classes, mean=mean, variance=variance, keras=keras)


def default_loss() -> Callable:
    """The loop's loss when none is given: the sparse softmax cross-entropy (`losses.make_loss()`)."""
    return losses.make_loss()


class RunParts:
    """The parts of one run, from its `TrainOptions` (`options`: model, model_args, init_from, loss, focal_gamma,
    class_weights, precision, optimizer and its fields, learning_rate and the schedule's fields).

    Constructed before any data is read, so that a user's model or loss that does not import, or a loss of the
    other task, fails there.

    Args:
      options: the run's `TrainOptions`.
      task: "classification" or "regression": the loss's and the metrics' task.
      ignore: leave nodata labels out of the loss (an `ignore_label` declared).
      model_fn: a user's model function (`harness.train.job.run(model_fn=...)`), else `options.model`, else the
        built-in model (`user.resolve`).
    Attributes:
      loss: the per-example loss `fn(labels, logits, class_weights) -> [batch]` float32 (`losses.resolve`).
      policy: the Keras precision policy once `apply_policy` ran, else None (no loss scaling).
    Raises:
      ConfigError, UserCodeError: from `user.resolve` and `losses.resolve`.
    """

    def __init__(self, options, *, task: str = "classification", ignore: bool = False,
                 model_fn: Optional[Callable] = None):
        self.options, self.task = options, task
        self.builder = user.resolve(options, model_fn)
        self.loss = losses.resolve(options, task, ignore=ignore)
        self.policy: Optional[str] = None

    @classmethod
    def for_data(cls, options, declared: dict, model_fn: Optional[Callable] = None) -> "RunParts":
        """The parts of a run whose spec declares `declared` (`DataSpec.to_config()` or a `data:` section): the
        task and the nodata label as declared, not inferred."""
        return cls(options, task=declared.get("task") or "classification",
                   ignore=declared.get("ignore_label") is not None, model_fn=model_fn)

    def apply_policy(self) -> str:
        """Set the global Keras precision policy of `options.precision` (`precision.apply_policy`: `auto`
        resolved); returns its name. Call before the model is built."""
        self.policy = precision.apply_policy(self.options.precision)
        return self.policy

    def check_loss(self, label_shape: tuple, num_classes: int, task: str) -> None:
        """Call the loss once on a zero batch of these shapes (`losses.probe`): a user's loss of a wrong shape is
        refused by name before the first step."""
        losses.probe(self.loss, label_shape, num_classes, task)

    def loss_for(self, model):
        """The loss of `model`'s outputs: `loss`, which takes logits; where the model's last layer applies softmax
        (`kinds.softmax_output`) and the loss is a built-in one of classification, the same loss of its
        probabilities (`losses.of_probabilities`, Keras' `from_logits=False`). A user's loss gets the outputs as
        they are."""
        if self.task != "classification" or hasattr(self.loss, "origin") or kinds.softmax_output(model) is None:
            return self.loss
        return losses.of_probabilities(self.loss)

    def loss_name(self, task: Optional[str] = None) -> str:
        """The loss's name (`options.loss`, else the task's default)."""
        return losses.loss_name(self.options, task or self.task)

    def build_model(self, inputs, say: Callable[..., None] = lambda *a, **k: None):
        """The run's model for its `Inputs` under the policy applied (`user.ModelBuilder.build`: the user's
        function or the built-in model, checked, then `--init-from`, whose line `say` prints). Call under the
        strategy's scope."""
        return self.builder.build(inputs, self.policy or "float32", say)

    @property
    def code(self):
        """The model's code (`harness.model_code.ModelCode`, recorded in every `.keras` the run saves), or None: the
        built-in model, a function of a script's `__main__`."""
        return self.builder.code

    def check_loadable(self, model, inputs) -> Optional[float]:
        """Save the run's built `model` and load it again as the commands that read a run do (`loadable.check`),
        before the first step; nothing for the built-in model (Keras' own layers). Call on every worker, outside
        the strategy's scope. Returns the seconds it took, or None.

        Raises:
          ModelError, UserCodeError: from `loadable.check`, one line naming the class and the fix.
        """
        if self.builder.is_builtin:
            return None
        described = user.ModelInputs.from_inputs(inputs, self.policy or "float32")
        return loadable.check(model, described, origin=self.builder.origin, code=self.builder.code)

    def build_builtin(self, kind: str, input_shape, num_classes: int, *, mean=None, variance=None,
                      keras_kind: str = kinds.TF_KERAS, batch_norm: bool = True):
        """The built-in model for shapes without a run's `Inputs` (synthetic batches, benchmarks): `builtin_model`.
        Call under the strategy's scope."""
        return builtin_model(kind, input_shape, num_classes, mean=mean, variance=variance, keras_kind=keras_kind,
                             batch_norm=batch_norm)

    def build_schedule(self, plan, kind: str = kinds.TF_KERAS):
        """The learning-rate schedule of the Keras `kind` for the epoch plan (`optim.schedule_config`: warm-up,
        decay, the peak scaled with the global batch).

        Raises:
          ConfigError: from `optim.schedule_config`.
        """
        return optim.make_schedule(optim.schedule_config(self.options, plan), kind)

    def create_optimizer(self, learning_rate=None, kind: str = kinds.TF_KERAS, *, wrap: bool = True):
        """`options.optimizer` of the Keras `kind` (`optim.make_optimizer`) over `learning_rate` (a schedule, or
        a float; None: `options.learning_rate`, constant), wrapped for loss scaling where the policy applied needs
        it (`precision.wrap_optimizer`; `wrap` False: never, as Keras `compile` wraps its own). Call under the
        strategy's scope."""
        rate = self.options.learning_rate if learning_rate is None else learning_rate
        optimizer = optim.make_optimizer(self.options, rate, kind)
        return precision.wrap_optimizer(optimizer, self.policy) if wrap and self.policy else optimizer

    def build_metrics(self, num_classes: int, task: Optional[str] = None):
        """The validation metrics of the task (`metrics.for_task`)."""
        return metrics.for_task(task or self.task, num_classes)

    def build(self, inputs, say: Callable[..., None] = lambda *a, **k: None, *, schedule=None) -> Built:
        """The run's model, schedule and optimizer for its `Inputs` (call under the strategy's scope): the model
        first (its Keras kind decides the others'), the loss's kind checked against it, then the schedule of the
        epoch plan (`schedule` given: that one, e.g. the run's for a fresh copy of its model) and the optimizer.

        Raises:
          UserCodeError, ModelError: from the model function and its checks; a loss of the other Keras kind.
        """
        model = self.build_model(inputs, say)
        kind = kinds.of_model(model)
        softmax = kinds.softmax_output(model) if self.task == "classification" else None
        if softmax is not None:
            takes = (f"--loss {self.loss.origin} gets them as they are (not logits)" if hasattr(self.loss, "origin")
                     else "the loss takes them as Keras' from_logits=False does")
            say(f"model {self.builder.origin}: its last layer {softmax!r} applies softmax: its outputs are "
                f"probabilities; {takes}, and predict, evaluate and export do not apply softmax again")
        kinds.check_same(kind, getattr(self.loss, "keras_object", None), f"--loss {self.options.loss}")
        schedule = schedule if schedule is not None else self.build_schedule(inputs.plan, kind)
        return Built(model, kind, schedule, self.create_optimizer(schedule, kind))
