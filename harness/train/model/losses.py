"""The training loss: `--loss crossentropy|focal|dice|crossentropy+dice|mse|mae|MODULE:FUNCTION` (`train.loss`;
default crossentropy for task classification, mse for regression).

Every loss is per example: `fn(labels, logits, class_weights) -> [batch]` float32, the seam of
`harness.train.loop.factory.build_run(loss_fn=...)`. The trainer sums it and divides by the global batch
(tf.distribute; under Horovod by the rank's batch before the tape averages), so the loss and its gradients do not depend
on how the batch is split over replicas and ranks
(tensorflow.org/tutorials/distribute/custom_training#define_the_loss_function). A per-pixel loss `[batch, H, W]` is
averaged over each patch's pixels first. Logits reach every loss as float32, also under a mixed policy.

Nodata (`ignore_label`, delivered as `harness.data.spec.labels.IGNORED` or NaN): an ignored pixel weighs 0 and the
divisor stays the number of pixels in the global batch, as a Keras `sample_weight` of 0 does (tf_keras
`losses_utils.compute_weighted_loss` with `SUM_OVER_BATCH_SIZE`: "sum divided by the number of elements", weights
not counted). The loss is then the sum over valid pixels / (global batch × pixels per example): no count travels
between replicas, so 1 device and N replicas still give the same loss and gradients, and a batch whose pixels are
half nodata gives half the loss of its valid half alone (PyTorch's `ignore_index` with `reduction="mean"` divides by
the valid count instead; under distribution that needs an all-reduce of the count before every loss). Dice is a
ratio over each example's valid pixels. Ignored pixels feed no gradient whatever their logits.

A user's loss `MODULE:FUNCTION` (or `path/to/file.py:FUNCTION`) is `fn(labels, logits) -> [batch]` or
`[batch, H, W]`: labels int32 `[batch]` / `[batch, H, W]` (float32 for regression), logits float32 `[batch,
classes]` / `[batch, H, W, classes]` (regression: the predictions, of the labels' shape). With `ignore_label` the
labels it gets hold 0 at ignored pixels and its per-pixel values are weighed as above; a loss that returns one value
per image example cannot leave pixels out and is refused. A stock tf_keras `Loss` object is accepted whatever its
reduction: its unreduced `call` is used. A loss that returns a scalar is refused: a scalar is already a mean over
one replica's share of the batch, which the harness cannot turn back into the global per-example mean.
"""
from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from harness.choices import CLASSIFICATION_LOSSES, LOSSES as BUILTIN, REGRESSION_LOSSES, TASK_LOSSES
from harness.data.spec.labels import valid
from harness.errors import ConfigError, UserCodeError
from harness.tracing import converted
from harness import keras_kinds as kinds

DICE_SMOOTH = 1.0  # added to the numerator and denominator of each class's Dice ratio (empty classes score 1)


def _crossentropy(labels, logits):
    """Sparse softmax cross-entropy per example (per pixel for masks)."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def focal(labels, logits, gamma: float = 2.0):
    """Focal loss per example/pixel (Lin et al. 2017, arXiv:1708.02002, eq. 4 without alpha):
    `-(1 - p_t)^gamma log p_t`, p_t the softmax probability of the true class; gamma 0 is cross-entropy."""
    ce = _crossentropy(labels, logits)
    return tf.pow(1.0 - tf.exp(-ce), gamma) * ce


def dice(labels, logits, weights=None):
    """Soft Dice loss per example (Milletari et al. 2016, arXiv:1606.04797), `[batch]`: 1 − the mean over
    classes of (2·Σ p·y + s) / (Σ p + Σ y + s) over the example's pixels (s = DICE_SMOOTH), p the softmax
    probabilities, y the one-hot labels; `weights` (the labels' shape, 0 or 1) leave pixels out of the sums."""
    probs = tf.nn.softmax(logits)
    onehot = tf.one_hot(labels, tf.shape(logits)[-1], dtype=probs.dtype)
    if weights is not None:
        probs, onehot = probs * weights[..., None], onehot * weights[..., None]
    axes = list(range(1, logits.shape.rank - 1))  # pixel axes; none for tables
    inter = tf.reduce_sum(probs * onehot, axis=axes) if axes else probs * onehot
    total = tf.reduce_sum(probs + onehot, axis=axes) if axes else probs + onehot
    return 1.0 - tf.reduce_mean((2.0 * inter + DICE_SMOOTH) / (total + DICE_SMOOTH), axis=-1)


def per_example(losses):
    """`[batch]` from `[batch]` or `[batch, ...]` (the mean over each example's pixels)."""
    if losses.shape.rank > 1:
        return tf.reduce_mean(tf.reshape(losses, [tf.shape(losses)[0], -1]), axis=1)
    return losses


def _targets(labels, ignore: bool):
    """`(labels with 0 at ignored pixels, float32 weights 1/0)`, or `(labels, None)` when nothing is ignored."""
    if not ignore:
        return labels, None
    mask = valid(labels)
    return tf.where(mask, labels, tf.zeros_like(labels)), tf.cast(mask, tf.float32)


def _weighed(pixel, weights):
    return pixel if weights is None else pixel * weights


def predictions(labels, logits):
    """Regression outputs in the labels' shape: a trailing channel of 1 (`[batch, H, W, 1]`) dropped."""
    if logits.shape.rank == labels.shape.rank + 1 and logits.shape[-1] == 1:
        return logits[..., 0]
    return logits


def make_loss(name: str = "crossentropy", *, focal_gamma: float = 2.0, user_fn: Optional[Callable] = None,
              task: str = "classification", ignore: bool = False) -> Callable:
    """The loop's loss `fn(labels, logits, class_weights) -> [batch]` float32.

    Class weights (`[classes]`, or None) multiply each pixel's cross-entropy or focal term; Dice is a ratio over
    the example and takes none. `mse` and `mae` are the squared and absolute error of the regression output
    (`predictions`). `ignore`: leave nodata labels out (see the module doc for the reduction).

    Raises:
      ConfigError: an unknown name, or a loss of the other task.
    """
    if user_fn is not None:
        original, user_fn = user_fn, converted(user_fn)  # AutoGraph converts it, as Keras does a loss function (harness.tracing)

        def user(labels, logits, class_weights):
            labels, weights = _targets(labels, ignore)
            logits = tf.cast(logits, tf.float32)
            out = checked_user_loss(user_fn(labels, predictions(labels, logits) if task == "regression" else logits),
                                    labels, name)
            if weights is not None and out.shape.rank != labels.shape.rank:
                raise UserCodeError(f"--loss {name} returns one value per example {out.shape} for labels "
                                    f"{labels.shape}: with ignore_label return the loss of every pixel (the labels' "
                                    "shape), so that the harness can leave the nodata pixels out")
            return per_example(_weighed(out, weights))
        user.origin = name
        user.keras_object = original   # its Keras kind is checked against the model's (`kinds.check_same`)
        return user
    if name not in TASK_LOSSES.get(task, ()):
        raise ConfigError(f"--loss must be one of {TASK_LOSSES.get(task, BUILTIN)} for task {task} or "
                          f"MODULE:FUNCTION, got {name!r}")

    def loss(labels, logits, class_weights):
        labels, weights = _targets(labels, ignore)
        logits = tf.cast(logits, tf.float32)
        if task == "regression":
            error = predictions(labels, logits) - labels
            return per_example(_weighed(tf.square(error) if name == "mse" else tf.abs(error), weights))
        total = 0.0
        if name in ("crossentropy", "focal", "crossentropy+dice"):
            pixel = focal(labels, logits, focal_gamma) if name == "focal" else _crossentropy(labels, logits)
            if class_weights is not None:
                pixel *= tf.gather(class_weights, labels)
            total = per_example(_weighed(pixel, weights))
        if name in ("dice", "crossentropy+dice"):
            total += dice(labels, logits, weights)
        return total
    return loss


EPSILON = 1e-7   # Keras' `backend.epsilon()`: probabilities are clipped to [EPSILON, 1 - EPSILON] before their log


def logits_of(probabilities):
    """Logits whose softmax gives `probabilities` back, as Keras' crossentropy with `from_logits=False` takes a
    softmax output (tf-keras `backend.sparse_categorical_crossentropy`, Keras 3 `_get_logits`): in a traced step
    whose output is the softmax op's, that op's input (the logits themselves); else the log of the probabilities
    clipped to [EPSILON, 1 - EPSILON]."""
    if not tf.executing_eagerly() and getattr(getattr(probabilities, "op", None), "type", "") == "Softmax":
        return tf.cast(probabilities.op.inputs[0], tf.float32)
    return tf.math.log(tf.clip_by_value(tf.cast(probabilities, tf.float32), EPSILON, 1.0 - EPSILON))


def of_probabilities(loss: Callable) -> Callable:
    """A built-in loss `fn(labels, logits, class_weights)` for a model whose outputs are softmax probabilities (its
    last layer applies softmax: `harness.keras_kinds.softmax_output`): the same loss of `logits_of` them, so that
    crossentropy is Keras' `from_logits=False` (it goes to 0 as the true class's probability goes to 1, where
    softmax applied again could not go below -log(e / (e + classes - 1)): 0.744 for 4 classes); focal and Dice
    take softmax of those logits, the probabilities themselves."""
    def on_probabilities(labels, probabilities, class_weights):
        return loss(labels, logits_of(probabilities), class_weights)
    on_probabilities.probabilities = True
    return on_probabilities


def checked_user_loss(losses, labels, origin: str):
    """A user's loss value, checked when it is traced: `[batch]` or the labels' shape, float.

    Raises:
      UserCodeError: a scalar (with why per-example values are needed), or a shape that is neither.
    """
    losses = tf.convert_to_tensor(losses)
    if losses.shape.rank == 0:
        raise UserCodeError(
            f"--loss {origin} returns a scalar; return the loss of every example, shape [batch] (or of every pixel, "
            "[batch, H, W]). Under distribution each replica sees a share of the global batch: the harness sums the "
            "per-example losses and divides by the global batch, so the loss and its gradients are those of the "
            "whole batch; a mean taken inside your function is over one replica's share and would be "
            "averaged again (for a tf_keras loss, pass the Loss object: its unreduced call is used)")
    if losses.shape.rank not in (1, labels.shape.rank):
        raise UserCodeError(f"--loss {origin} returns shape {losses.shape} for labels {labels.shape}: expected "
                            "[batch] or the labels' shape")
    return tf.cast(losses, tf.float32)


def load_user_loss(text: str) -> Callable:
    """`MODULE:FUNCTION` as a `fn(labels, logits)`: a function, or a Keras `Loss` object of either kind (its unreduced
    `call`, whatever its reduction). Its Keras kind, where it has one, is checked against the model's once the model
    is built (`harness.keras_kinds.check_same`).

    Raises:
      UserCodeError: from `harness.train.model.user.load_function` (import failure); a class given.
    """
    from harness.train.model.user import load_function

    fn = load_function(text, flag="--loss")
    if isinstance(fn, type):
        raise UserCodeError(f"--loss {text}: {fn.__name__} is a class; give an instance (e.g. `loss = "
                            f"{fn.__name__}(from_logits=True)` in your module) or a function")
    kind = kinds.of(fn)
    if kind is not None and isinstance(fn, kinds.module(kind).losses.Loss):
        fn = fn.call
    return fn


def loss_name(options, task: str = "classification") -> str:
    """The run's loss name: `options.loss`, else the task's default (crossentropy, or mse for regression)."""
    return options.loss or TASK_LOSSES.get(task, CLASSIFICATION_LOSSES)[0]


def resolve(options, task: str = "classification", ignore: bool = False) -> Callable:
    """The run's loss from `TrainOptions` (`loss`, `focal_gamma`, `class_weights`) and the spec's task and nodata
    declaration, resolved before any data is read. `options.loss` None: crossentropy (classification) or mse
    (regression).

    Raises:
      ConfigError: an unknown built-in name or one of the other task; class weights with a user's loss or with
        regression.
      UserCodeError: from `load_user_loss`.
    """
    name = loss_name(options, task)
    if task == "regression" and options.class_weights != "none":
        raise ConfigError(f"--class-weights {options.class_weights} weighs classes; task regression has none")
    if name in BUILTIN:
        return make_loss(name, focal_gamma=options.focal_gamma, task=task, ignore=ignore)
    if ":" not in name:
        raise ConfigError(f"--loss must be one of {TASK_LOSSES.get(task, BUILTIN)} for task {task} or "
                          f"MODULE:FUNCTION, got {name!r}")
    if options.class_weights != "none":
        raise ConfigError(f"--class-weights {options.class_weights} weighs the built-in losses; weigh the classes "
                          f"inside your loss {name}")
    return make_loss(name, user_fn=load_user_loss(name), task=task, ignore=ignore)


def probe(loss_fn: Callable, label_shape: tuple, num_classes: int, task: str = "classification") -> None:
    """Call `loss_fn` once on a zero batch of 2 (labels `[2, *label_shape]` int32, or float32 for regression,
    logits `[2, *label_shape, classes]`) before the first step, so a user's loss that returns a scalar or a wrong
    shape is refused by name there and not inside the traced step.

    Raises:
      UserCodeError: from `checked_user_loss`, or the user's function failing on these shapes (with its error).
    """
    labels = tf.zeros([2, *label_shape], tf.float32 if task == "regression" else tf.int32)
    logits = tf.zeros([2, *label_shape, num_classes], tf.float32)
    try:
        with tf.GradientTape() as tape:
            tape.watch(logits)
            out = loss_fn(labels, logits, None)
        gradient = tape.gradient(out, logits) if out.dtype.is_floating else None
    except UserCodeError:
        raise
    except Exception as e:  # the user's code may raise anything
        raise UserCodeError(f"the loss failed on labels {labels.shape} {labels.dtype.name} and logits "
                            f"{logits.shape} float32: {type(e).__name__}: {e}") from e
    if out.shape.rank != 1:
        raise UserCodeError(f"the loss returned shape {out.shape}, expected [batch]")
    if gradient is None:
        raise UserCodeError(f"--loss {getattr(loss_fn, 'origin', 'the loss')} does not depend on the logits (no "
                            "gradient reaches them: a constant, or an argmax / cast to int on the way): the model "
                            "could not learn from it")
