"""A small U-Net written in Keras 3 (`import keras`), as the keras.io guides write models today; the same model in
tf-keras is `harness.train.model.builtin.unet` (`import tf_keras as keras`). The harness trains either kind: the
run's optimizer, schedule and loss scale are made in the model's kind.

    harness train --data EXPORT --model examples/keras3_unet.py:build --model-args '{"filters": [16, 32]}' ...

Input `[batch, H, W, bands]` float32 (H and W divisible by 2**(len(filters) - 1)); output logits
`[batch, H, W, classes]` float32 (the last layer is float32 under a mixed policy: Keras mixed precision guide).
"""
import keras
from keras import layers


def _block(x, filters: int, name: str):
    for i in range(2):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv{i}")(x)
        x = layers.BatchNormalization(name=f"{name}_bn{i}")(x)
        x = layers.ReLU(name=f"{name}_relu{i}")(x)
    return x


def build(inputs, filters=(16, 32)) -> keras.Model:
    """`inputs`: the harness's `ModelInputs` (input_shape `(H, W, bands)`, num_classes, mean, variance)."""
    x = image = keras.Input(inputs.input_shape, name="image")
    x = layers.Normalization(mean=list(inputs.mean) or None, variance=list(inputs.variance) or None,
                             name="normalize")(x)
    skips = []
    for level, f in enumerate(filters[:-1]):
        x = _block(x, f, f"down{level}")
        skips.append(x)
        x = layers.MaxPooling2D(name=f"pool{level}")(x)
    x = _block(x, filters[-1], "bottom")
    for level in reversed(range(len(filters) - 1)):
        x = layers.Conv2DTranspose(filters[level], 2, strides=2, name=f"up{level}")(x)
        x = layers.Concatenate(name=f"skip{level}")([x, skips[level]])
        x = _block(x, filters[level], f"dec{level}")
    logits = layers.Conv2D(inputs.num_classes, 1, dtype="float32", name="logits")(x)
    return keras.Model(image, logits, name="keras3_unet")
