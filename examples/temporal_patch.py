"""A per-pixel model over a time axis of image patches: each step's bands convolved in space (the same weights at
every step), then each pixel's steps folded in time, then classified.

    harness train --data series --label landcover --config examples/series_time.yaml \
        --model examples/temporal_patch.py:build

Input: `ModelInputs.input_shape` `(time, height, width, bands)` (`group_delivery: time` over array bands of one
depth). Output logits `[batch, height, width, classes]` float32.
"""
import keras


def build(inputs, filters: int = 16) -> keras.Model:
    """`inputs`: the harness's `ModelInputs`."""
    steps, height, width, bands = inputs.input_shape
    x = keras.Input(inputs.input_shape, name="series")
    h = x
    if len(inputs.mean) == bands:   # statistics per band, shared over the time steps
        h = keras.layers.Normalization(mean=list(inputs.mean), variance=list(inputs.variance), name="normalize")(h)
    h = keras.layers.TimeDistributed(keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
                                     name="space")(h)
    h = keras.layers.Conv3D(filters, (steps, 1, 1), activation="relu", name="time")(h)   # [batch, 1, H, W, F]
    h = keras.layers.Reshape((height, width, filters), name="fold")(h)
    h = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name="context")(h)
    return keras.Model(x, keras.layers.Conv2D(inputs.num_classes, 1, dtype="float32", name="logits")(h))
