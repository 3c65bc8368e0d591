"""Built-in models: a per-pixel classifier for table exports and a small U-Net for image patches.

Both end in a float32 layer, so under a mixed policy the logits and the loss stay float32 (Keras mixed precision
guide). Each is built in the Keras it is given (`keras`: the `tf_keras` or `keras` module, `harness.keras_kinds`),
tf-keras unless told. Users pass their own Keras model through the Python API instead.
"""
from __future__ import annotations

from collections.abc import Mapping

import tf_keras

from harness.errors import BatchSizeError, ConfigError


def pixel_classifier(num_bands: int, num_classes: int, *, hidden: tuple[int, ...] = (64, 64), mean=None,
                     variance=None, keras=tf_keras):
    """MLP over one pixel's bands.

    Input `[batch, bands]` float32; output logits `[batch, num_classes]` float32. `mean` and `variance` (`[bands]`,
    from `band_moments`) standardize the input inside the model, so serving needs no separate preprocessing.
    """
    layers = keras.layers
    x = inputs = keras.Input((num_bands,), name="bands")
    x = layers.Normalization(mean=mean, variance=variance, name="normalize")(x)
    for i, width in enumerate(hidden):
        x = layers.Dense(width, activation="relu", name=f"dense_{i}")(x)
    outputs = layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="pixel_classifier")


def _block(layers, x, filters: int, name: str, batch_norm: bool = True):
    for i in range(2):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=not batch_norm, name=f"{name}_conv{i}")(x)
        if batch_norm:
            x = layers.BatchNormalization(name=f"{name}_bn{i}")(x)
        x = layers.ReLU(name=f"{name}_relu{i}")(x)
    return x


def unet(height: int, width: int, num_bands: int, num_classes: int, *, filters: tuple[int, ...] = (16, 32, 64),
         mean=None, variance=None, keras=tf_keras, batch_norm: bool = True):
    """Small U-Net (Ronneberger et al., 2015) for per-pixel classification of image patches.

    Input `[batch, height, width, bands]` float32; output logits `[batch, height, width, num_classes]` float32.
    `height` and `width` must be divisible by 2 ** (len(filters) - 1). `mean`, `variance`: `[bands]`, as in
    `pixel_classifier`. `batch_norm=False`: convolutions with a bias and no BatchNormalization (benchmarks: Keras 3's
    BatchNormalization is not fused on TensorFlow, tf-keras's is).

    Raises:
      ConfigError: if the patch size is not divisible by the total downsampling factor.
    """
    factor = 2 ** (len(filters) - 1)
    if height % factor or width % factor:
        raise ConfigError(f"U-Net with {len(filters)} levels needs height and width divisible by {factor}, "
                         f"got {height}x{width}")
    layers = keras.layers
    x = inputs = keras.Input((height, width, num_bands), name="image")
    x = layers.Normalization(mean=mean, variance=variance, name="normalize")(x)
    skips = []
    for level, f in enumerate(filters[:-1]):
        x = _block(layers, x, f, f"down{level}", batch_norm)
        skips.append(x)
        x = layers.MaxPool2D(name=f"pool{level}")(x)
    x = _block(layers, x, filters[-1], "bottom", batch_norm)
    for level in reversed(range(len(filters) - 1)):
        x = layers.Conv2DTranspose(filters[level], 2, strides=2, name=f"up{level}")(x)
        x = layers.Concatenate(name=f"skip{level}")([x, skips[level]])
        x = _block(layers, x, filters[level], f"dec{level}", batch_norm)
    outputs = layers.Conv2D(num_classes, 1, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="unet")


def band_moments(dataset, *, batches: int = 8, nodata=None, labels_out: list | None = None):
    """Per-band mean and variance (float64 numpy) over the first `batches` batches of an `(inputs, labels)` dataset
    whose inputs are float32 `[..., bands]`, each band's over every other axis (examples, pixels, time steps);
    feeds the models' Normalization layer.

    `nodata`: an input value left out (Earth Engine's defaultValue declared as `input_nodata`); a band with no
    other value gets mean 0 and variance 1. `labels_out`: a list each batch's labels are appended to (numpy), so
    that whoever needs the sample's labels too reads it once.

    Returns:
      `(mean, variance)`, each `[bands]`; with group_delivery "time" `[bands per group]` (a band position's over
      every time step); with group_delivery "dict" (inputs `{group: [..., bands of the group]}`) each a dict
      `{group: [bands of the group]}` in the groups' order, one Normalization per group input.
    Raises:
      BatchSizeError: if the dataset yields no batch.
    """
    import numpy as np
    sums: dict = {}  # group (None: one tensor) -> (sum, sum of squares, rows)
    for inputs, labels in dataset.take(batches):
        if labels_out is not None:
            labels_out.append(np.asarray(labels))
        for group, t in (inputs.items() if isinstance(inputs, Mapping) else [(None, inputs)]):
            x = np.asarray(t, dtype=np.float64).reshape(-1, t.shape[-1])
            valid = np.ones_like(x) if nodata is None else (x != np.float32(nodata)).astype(np.float64)
            x = x * valid
            total, total_sq, n = sums.get(group, (0.0, 0.0, 0.0))
            sums[group] = (total + x.sum(0), total_sq + (x * x).sum(0), n + valid.sum(0))
    if not sums:
        raise BatchSizeError("band_moments: the dataset yielded no batch")
    moments = {}
    for group, (total, total_sq, n) in sums.items():
        counted = np.maximum(n, 1)
        mean = total / counted
        variance = np.where(n > 0, np.maximum(total_sq / counted - mean * mean, 1e-12), 1.0)
        moments[group] = (mean, variance)
    if None in moments:
        return moments[None]
    return {g: m for g, (m, _) in moments.items()}, {g: v for g, (_, v) in moments.items()}


def builtin_model(kind: str, input_shape, num_classes: int, *, mean=None, variance=None, keras=tf_keras):
    """The built-in model for a data kind: the U-Net for image patches `[height, width, bands]`, the per-pixel
    classifier for table rows `[bands]`; logits float32 `[batch, height, width, classes]` or `[batch, classes]`.

    Raises:
      ConfigError: from `unet` (patch side not divisible by its downsampling).
    """
    if kind == "table":
        return pixel_classifier(input_shape[-1], num_classes, mean=mean, variance=variance, keras=keras)
    h, w, bands = input_shape
    return unet(h, w, bands, num_classes, mean=mean, variance=variance, keras=keras)
