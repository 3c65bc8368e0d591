"""A 1x1 convolution per pixel of `[batch, H, W, bands]` float32 to `[batch, H, W, classes]` float32 logits, for
tests/train/measure/test_tune.py (`--model tests/train/measure/scripts/one_conv.py:build`): `--tune` traces the
run's step three times (its two probes on synthetic batches and the run itself), ~2 CPU-s each for the built-in
U-Net on 16x16 patches, ~0.3 for this.
"""
import tf_keras as keras


def build(inputs):
    x = image = keras.Input(inputs.input_shape)
    x = keras.layers.Conv2D(inputs.num_classes, 1)(x)
    return keras.Model(image, keras.layers.Activation("linear", dtype="float32")(x))
