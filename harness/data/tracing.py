"""How the input pipeline's functions become graphs.

Every function the harness hands to tf.data (map, filter, flat_map, interleave) is wrapped in `graph_fn`: traced
as written, not rewritten by AutoGraph first. None of them branches or loops on a tensor in Python (their `if`s
test the spec and the plan, Python values), so AutoGraph's rewrite changes nothing in the graph; it parses,
transforms and reloads the source of each function and of every function it calls, each time a pipeline is built:
a small `harness train` (1024 table rows, 2 epochs) took 6.3 CPU-seconds with it and 5.3 without (TF 2.18, 2
cores, 3 runs each; the conversions timed with a wrapper around `autograph.impl.api._convert_actual`). A function that needs AutoGraph (a Python `if` on a tensor) fails at the
trace under `graph_fn` ("using a tf.Tensor as a Python bool is not allowed"): write it with `tf.cond`/`tf.where`.

The training step is not wrapped: it calls the user's model and loss, which may rely on AutoGraph as in Keras.
"""
import tensorflow as tf

graph_fn = tf.autograph.experimental.do_not_convert
