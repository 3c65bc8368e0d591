"""A per-pixel 1-D temporal model over band groups: each pixel's groups (`before`, `during`, ...) are its time
steps, convolved over time, then classified.

    harness train --config examples/aces_points.yaml --model examples/temporal_pixel.py:build ...

Input: `ModelInputs.input_shape` `(time, bands)` (`group_delivery: time`) or `{group: (bands,)}` (`dict`), table
exports (one pixel per record). Output logits `[batch, classes]` float32.
"""
from collections.abc import Mapping

from tensorflow import keras  # tf_keras once `harness` is imported (TF_USE_LEGACY_KERAS=1)
from tensorflow.keras import layers


def build(inputs, filters: int = 32, hidden: int = 64, dropout: float = 0.2) -> keras.Model:
    """`inputs`: the harness's `ModelInputs`."""
    shape = inputs.input_shape
    if isinstance(shape, Mapping):  # one named input per group, each normalized by its own statistics, stacked
        named = {g: keras.Input(s, name=g) for g, s in shape.items()}
        steps = []
        for g, s in shape.items():
            x = named[g]
            if g in inputs.mean:
                x = layers.Normalization(mean=list(inputs.mean[g]), variance=list(inputs.variance[g]),
                                         name=f"{g}_normalize")(x)
            steps.append(layers.Reshape((1, s[-1]), name=f"{g}_step")(x))
        x = layers.Concatenate(axis=1, name="stack_time")(steps)
        model_inputs = named
    else:
        if len(shape) != 2:
            raise ValueError(f"temporal_pixel: expected per-pixel inputs (time, bands), got {shape}: use a table "
                             "export with band_groups and group_delivery: time")
        x = model_inputs = keras.Input(shape, name="series")
        if len(inputs.mean) == shape[-1]:  # statistics per band, shared over time steps
            x = layers.Normalization(mean=list(inputs.mean), variance=list(inputs.variance), name="normalize")(x)
    x = layers.Conv1D(filters, 2, padding="same", activation="relu", name="temporal_conv")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(hidden, activation="relu", name="hidden")(x)
    x = layers.Dropout(dropout, name="dropout")(x)
    logits = layers.Dense(inputs.num_classes, dtype="float32", name="logits")(x)
    return keras.Model(model_inputs, logits, name="temporal_pixel")
