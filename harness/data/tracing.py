"""How the input pipeline's functions become graphs.

Every function the harness hands to tf.data (map, filter, flat_map, interleave) is wrapped in `graph_fn`: traced
as written, not rewritten by AutoGraph first. None of them branches or loops on a tensor in Python (their `if`s
test the spec and the plan, Python values), so AutoGraph's rewrite changes nothing in the graph; it parses,
transforms and reloads the source of each function and of every function it calls, each time a pipeline is built:
~1.5 of the ~10 CPU-seconds a small `harness train` run spends on 2 cores (TF 2.21, measured with a wrapper around
`autograph.impl.api._convert_actual`). A function that needs AutoGraph (a Python `if` on a tensor) fails at the
trace under `graph_fn` ("using a tf.Tensor as a Python bool is not allowed"): write it with `tf.cond`/`tf.where`.

The training step is not wrapped: it calls the user's model and loss, which may rely on AutoGraph as in Keras.
"""
import tensorflow as tf

graph_fn = tf.autograph.experimental.do_not_convert
