"""A custom per-example loss for `--loss examples/losses.py:smoothed_crossentropy`.

`labels` int32 `[batch]` (or `[batch, H, W]`), `logits` float32 `[batch, classes]` (or `[batch, H, W, classes]`);
returns one loss per example (or pixel): the harness sums them and divides by the global batch.
"""
import tensorflow as tf

SMOOTHING = 0.1


def smoothed_crossentropy(labels, logits):
    """Cross-entropy against label-smoothed targets (Szegedy et al. 2016, arXiv:1512.00567 §7): the true class
    gets 1 − ε + ε/K, every other class ε/K."""
    classes = tf.shape(logits)[-1]
    targets = tf.one_hot(labels, classes) * (1.0 - SMOOTHING) + SMOOTHING / tf.cast(classes, tf.float32)
    return tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)
