"""A per-pixel classifier with a layer of your own, in Keras 3: normalized differences of band pairs (NDVI of the
near-infrared and red bands by default) beside the standardized bands. The layer is registered and returns its
constructor's arguments from get_config, so the trained model loads again in `harness predict`, `evaluate`, `export`
and `--init-from`, which import this file's copy recorded in the run (docs/model.md, "What a model may hold")."""
import keras


@keras.saving.register_keras_serializable(package="examples")
class NormalizedDifferences(keras.layers.Layer):
    """(a - b) / (a + b) of each pair of band positions (a, b): `[batch, bands]` -> `[batch, pairs]`."""

    def __init__(self, pairs, **kwargs):
        super().__init__(**kwargs)
        self.pairs = [tuple(pair) for pair in pairs]

    def call(self, x):
        a = keras.ops.stack([x[..., i] for i, _ in self.pairs], axis=-1)
        b = keras.ops.stack([x[..., j] for _, j in self.pairs], axis=-1)
        return (a - b) / (keras.ops.abs(a + b) + 1e-6)

    def get_config(self):
        return {**super().get_config(), "pairs": [list(pair) for pair in self.pairs]}


def build(inputs, pairs=(("B8", "B4"),)):   # inputs: harness.train.model.user.ModelInputs
    x = keras.Input(inputs.input_shape)      # (bands,): one row of band values
    bands = keras.layers.Normalization(mean=inputs.mean, variance=inputs.variance)(x)
    ratios = NormalizedDifferences([(inputs.bands.index(a), inputs.bands.index(b)) for a, b in pairs])(x)
    h = keras.layers.Dense(32, activation="relu")(keras.layers.Concatenate()([bands, ratios]))
    return keras.Model(x, keras.layers.Dense(inputs.num_classes, dtype="float32")(h))
