"""A deeper U-Net whose encoder is one named block, as a pretrained encoder would be (`--init-from` a run whose
model has the same `encoder` layers loads it; the decoder and head start fresh).

    harness train --data EXPORT --model examples/deep_unet.py:build --model-args '{"depth": 4}' ...

Input `[batch, H, W, bands]` float32 (H and W divisible by 2**(depth-1)); output logits `[batch, H, W, classes]`
float32 (the last layer is float32 under a mixed policy: Keras mixed precision guide).
"""
from tensorflow import keras  # tf_keras once `harness` is imported (TF_USE_LEGACY_KERAS=1)
from tensorflow.keras import layers


def _residual(x, filters: int, name: str):
    """Two 3x3 convolutions with batch normalization and a projected shortcut (He et al. 2016)."""
    shortcut = layers.Conv2D(filters, 1, use_bias=False, name=f"{name}_proj")(x)
    for i in range(2):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv{i}")(x)
        x = layers.BatchNormalization(name=f"{name}_bn{i}")(x)
        if i == 0:
            x = layers.ReLU(name=f"{name}_relu{i}")(x)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([x, shortcut]))


def encoder(shape, depth: int, base_filters: int) -> keras.Model:
    """The encoder block: `depth` residual stages, each halving the side after the first; returns every stage's
    features (the skips), deepest last."""
    x = inputs = keras.Input(shape, name="encoder_in")
    skips = []
    for level in range(depth):
        if level:
            x = layers.MaxPool2D(name=f"enc{level}_pool")(x)
        x = _residual(x, base_filters * 2 ** level, f"enc{level}")
        skips.append(x)
    return keras.Model(inputs, skips, name="encoder")


def build(inputs, depth: int = 4, base_filters: int = 16, dropout: float = 0.1) -> keras.Model:
    """`inputs`: the harness's `ModelInputs` (input_shape `(H, W, bands)`, num_classes, mean, variance)."""
    h, w, bands = inputs.input_shape
    if h % 2 ** (depth - 1) or w % 2 ** (depth - 1):
        raise ValueError(f"deep_unet: patch {h}x{w} is not divisible by 2**(depth-1) = {2 ** (depth - 1)}")
    x = image = keras.Input((h, w, bands), name="image")
    x = layers.Normalization(mean=list(inputs.mean), variance=list(inputs.variance), name="normalize")(x)
    skips = encoder((h, w, bands), depth, base_filters)(x)
    x = layers.Dropout(dropout, name="bottleneck_dropout")(skips[-1])
    for level in reversed(range(depth - 1)):
        filters = base_filters * 2 ** level
        x = layers.Conv2DTranspose(filters, 2, strides=2, name=f"dec{level}_up")(x)
        x = layers.Concatenate(name=f"dec{level}_skip")([x, skips[level]])
        x = _residual(x, filters, f"dec{level}")
    logits = layers.Conv2D(inputs.num_classes, 1, dtype="float32", name="logits")(x)
    return keras.Model(image, logits, name="deep_unet")
