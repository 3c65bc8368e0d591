"""A per-pixel classifier in Keras 3: trained on points, it maps an image export pixel by pixel."""
import keras


def build(inputs):                      # inputs: harness.train.model.user.ModelInputs
    x = keras.Input(inputs.input_shape)   # (bands,): one row of band values
    h = keras.layers.Normalization(mean=inputs.mean, variance=inputs.variance)(x)
    h = keras.layers.Dense(64, activation="relu")(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    return keras.Model(x, keras.layers.Dense(inputs.num_classes, dtype="float32")(h))
