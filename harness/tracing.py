"""How the harness's functions become graphs: traced as written; AutoGraph rewrites the user's code only.

AutoGraph (tensorflow.org/guide/autograph) parses, transforms and reloads the source of a function and of every
function it calls before the trace, once per process. None of the harness's own graph code branches or loops on a
tensor in Python (its `if`s test the spec, the plan or static shapes, Python values; its loops are `tf.while_loop`
or tf.data), so the rewrite changes nothing in its graphs and only costs time: a small `harness train` (1024 table
rows, 2 epochs) spent 1.0 CPU-s converting the input pipeline's functions and 0.59 CPU-s converting the training
step (the step, its loop and the loss: 10 functions), out of ~6 (TF 2.18, 2 cores; the conversions timed with a
wrapper around `autograph.impl.api._convert_actual`).

- `graph_fn`: every function the harness hands to tf.data (map, filter, flat_map, interleave). A function that
  needs AutoGraph (a Python `if` on a tensor) fails at the trace ("using a tf.Tensor as a Python bool is not
  allowed"): write it with `tf.cond`/`tf.where`.
- `graph_function`: every `tf.function` of the harness (the training step, the validation pass, predict's step,
  the collectives), traced with AutoGraph off (`autograph=False`).
- `user_code`: how that step calls the user's model and loss, so that they are converted exactly as under Keras'
  `fit` (whose train function is converted): tf_keras converts a subclassed layer's `call` itself where the
  status AutoGraph leaves is not "disabled" (`tf.__internal__.autograph.tf_convert(self.call,
  control_status_ctx())` in tf_keras' `Layer.__call__` and `Loss.__call__`); `user_code` runs the wrapped
  harness function with the status a function outside any `tf.function` sees, and `converted` converts a user's
  plain loss function. This is the pattern `tf_convert`'s own docstring gives for "high order functions internal
  to TF" that call user functions from `tf.function(autograph=False)` code (tensorflow/python/autograph/impl/
  api.py).
"""
from __future__ import annotations

from typing import Callable

import tensorflow as tf

graph_fn = tf.autograph.experimental.do_not_convert

# The status of code outside any tf.function ("unspecified": Keras decides, and converts user layers), captured
# once at import, outside any trace.
_OUTSIDE = tf.__internal__.autograph.control_status_ctx()


def graph_function(fn: Callable, **options) -> Callable:
    """`tf.function(fn, autograph=False, **options)`: the harness's graph code, traced as written."""
    return tf.function(fn, autograph=False, **options)


def user_code(fn: Callable) -> Callable:
    """`fn` (harness code that calls the user's model or loss), run unconverted but with AutoGraph's status as
    outside a `tf.function`, so that Keras converts the user's layers (and `converted` functions are converted)
    inside a `graph_function` trace."""
    return tf.__internal__.autograph.tf_convert(fn, _OUTSIDE, convert_by_default=False)


def converted(fn: Callable) -> Callable:
    """A user's plain function (a loss), converted by AutoGraph where it is called inside a trace, as Keras
    converts a loss function (`LossFunctionWrapper`); Keras' own callables are left as they are."""
    return tf.__internal__.autograph.tf_convert(fn, _OUTSIDE)
