"""A user's model file in tf-keras (`import tf_keras as keras`), one function per model a user writes: those that load
again (a registered custom layer, a registered subclassed model with get_config) and those that do not (an
unregistered layer, a subclassed model without get_config, a Lambda, a get_config that leaves out an argument), and
those the harness trains otherwise or refuses: a softmax output, an input of 3 bands hard-coded, a model compiled in
the function, a subclass's own train_step. Read by tests/train/model/test_loadable.py, test_user.py, test_losses.py
and tests/predict/test_user_models.py; keras3_models.py is its Keras 3 twin."""
import tf_keras as keras

PACKAGE = "harness_tests_tf_keras"


@keras.saving.register_keras_serializable(package=PACKAGE)
class Scale(keras.layers.Layer):
    """x * factor: a constructor argument, returned by get_config."""

    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


@keras.saving.register_keras_serializable(package=PACKAGE)
class Classifier(keras.Model):
    """A subclassed model with get_config: Dense (named "hidden"), Scale, Dense logits (named "logits")."""

    def __init__(self, num_classes, width=16, factor=0.5, **kwargs):
        super().__init__(**kwargs)
        self.num_classes, self.width, self.factor = num_classes, width, factor
        self.hidden = keras.layers.Dense(width, activation="relu", name="hidden")
        self.scale = Scale(factor, name="scale")
        self.head = keras.layers.Dense(num_classes, dtype="float32", name="logits")

    def call(self, x):
        return self.head(self.scale(self.hidden(x)))

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "width": self.width, "factor": self.factor}


class Doubled(keras.layers.Layer):
    """Not registered."""

    def call(self, x):
        return x * 2.0


@keras.saving.register_keras_serializable(package=PACKAGE)
class WithoutConfig(keras.Model):
    """Registered, but built from the ModelInputs (not serializable) with no get_config."""

    def __init__(self, inputs, **kwargs):
        super().__init__(**kwargs)
        self.head = keras.layers.Dense(inputs.num_classes, dtype="float32")

    def call(self, x):
        return self.head(x)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Forgetful(Scale):
    """Registered, with a get_config that leaves out its factor: loaded again, it multiplies by 1."""

    def get_config(self):
        config = super().get_config()
        config.pop("factor")
        return config


def _functional(inputs, layer):
    x = keras.Input(inputs.input_shape)
    h = layer(keras.layers.Dense(16, activation="relu", name="hidden")(x))
    return keras.Model(x, keras.layers.Dense(inputs.num_classes, dtype="float32", name="logits")(h))


def registered_layer(inputs):
    return _functional(inputs, Scale(0.5, name="scale"))


def subclassed(inputs):
    return Classifier(inputs.num_classes)


def unregistered_layer(inputs):
    return _functional(inputs, Doubled(name="doubled"))


def subclassed_without_config(inputs):
    return WithoutConfig(inputs)


def lambda_layer(inputs):
    return _functional(inputs, keras.layers.Lambda(lambda t: t * 0.5, name="halve"))


def forgotten_argument(inputs):
    return _functional(inputs, Forgetful(3.0, name="forgetful"))


def softmax_output(inputs):
    """Probabilities, as Keras users write a classifier: a Softmax layer last."""
    x = keras.Input(inputs.input_shape)
    h = keras.layers.Dense(16, activation="relu", name="hidden")(x)
    out = keras.layers.Softmax(dtype="float32", name="probabilities")(keras.layers.Dense(inputs.num_classes)(h))
    return keras.Model(x, out)


def three_bands(inputs):
    """An input of 3 bands, hard-coded."""
    x = keras.Input((3,))
    return keras.Model(x, keras.layers.Dense(inputs.num_classes, name="logits")(x))


def compiled(inputs):
    """Compiled in the function with an optimizer of its own."""
    model = registered_layer(inputs)
    model.compile(optimizer=keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)),
                  loss="sparse_categorical_crossentropy")
    return model


@keras.saving.register_keras_serializable(package=PACKAGE)
class OwnStep(Classifier):
    """A subclassed model with a train_step of its own."""

    def train_step(self, data):
        return super().train_step(data)


def own_train_step(inputs):
    return OwnStep(inputs.num_classes)
