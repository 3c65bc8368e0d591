"""The training step and the validation pass are traced as written; AutoGraph converts the user's model and loss
only (`harness.tracing`): a subclassed model and a loss that branch on a tensor in Python train and score as under
Keras, and no harness function is converted."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from tensorflow.python.autograph.impl import api as autograph_api

from harness.train.model import losses, metrics
from loop_support import build


class Branchy(keras.Model):
    """A Python `if` and a `for` over tensors: needs AutoGraph inside a tf.function."""

    def __init__(self):
        super().__init__()
        self.up, self.down = keras.layers.Dense(3, name="up"), keras.layers.Dense(3, name="down")

    def call(self, x):
        if tf.reduce_mean(x) > 0:
            out = self.up(x)
        else:
            out = self.down(x)
        for _ in tf.range(2):
            out = out * 0.5
        return out


def branchy_loss(labels, logits):
    """Cross-entropy per example, doubled when the batch's mean label is above 1 (a Python `if` on a tensor)."""
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    if tf.reduce_mean(tf.cast(labels, tf.float32)) > 1.0:
        ce = ce * 2.0
    return ce


@pytest.fixture
def converted_modules(monkeypatch):
    seen = []
    original = autograph_api._convert_actual

    def recording(entity, program_ctx):
        seen.append(getattr(entity, "__module__", "?") + "." + getattr(entity, "__qualname__", "?"))
        return original(entity, program_ctx)
    monkeypatch.setattr(autograph_api, "_convert_actual", recording)
    return seen


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_user_model_and_loss_that_branch_on_tensors_train_as_written(converted_modules, sign):
    rng = np.random.default_rng(0)
    x = (sign * np.abs(rng.normal(size=(8, 4)))).astype(np.float32)
    y = np.array([2, 2, 2, 2, 1, 2, 0, 2], np.int32)    # mean 1.625 > 1: the loss doubles
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = Branchy()
        model(x[:1])
        optimizer = keras.optimizers.SGD(0.1)

    def changed():
        return {layer.name for layer in (model.up, model.down)
                if any(not np.array_equal(w.numpy(), w0) for w, w0 in zip(layer.weights, start[layer.name]))}
    start = {layer.name: [w.numpy() for w in layer.weights] for layer in (model.up, model.down)}
    expected = float(tf.reduce_mean(branchy_loss(y, model(x))))   # eagerly: Python runs the branches itself
    run = build(strategy, model, optimizer, global_batch_size=8,
                loss_fn=losses.make_loss("branchy", user_fn=branchy_loss), metrics=metrics.Classification(3))
    assert run.train_step((x, y)) == pytest.approx(expected, rel=1e-6)
    taken = "up" if sign > 0 else "down"
    assert changed() == {taken}

    # the K-step loop: the same steps, the same branch
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    out = run.trainer.run_loop(iter(ds), 3)
    assert out.shape == (3, 3) and np.all(np.diff(out[0]) < 0)    # loss falls step after step
    assert changed() == {taken}
    # validation: the whole pass in one traced call, the user's model and loss converted there too
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(3))           # batches of 3, 3, 2
    got = run.evaluate(dataset)
    logits = model(x).numpy()
    expected_val = np.mean([float(tf.reduce_sum(branchy_loss(y[i:i + 3], logits[i:i + 3]))) for i in (0, 3, 6)]) * 3 / 8
    assert got["val_records"] == 8 and got["val_loss"] == pytest.approx(expected_val, rel=1e-5)
    assert got["val_accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y))
    # AutoGraph converted the user's code (the model's call and the loss), never the harness's
    assert converted_modules and all(not name.startswith("harness.") for name in converted_modules), converted_modules
    assert any(name.endswith("Branchy.call") for name in converted_modules)
    assert any(name.endswith("branchy_loss") for name in converted_modules)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_built_model_is_traced_once_per_step_function(optimizer):
    """The optimizer's slots are made before the first call, so the K-step loop and the one-step call are traced
    once each (a first call that creates variables traces twice)."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input([4]), keras.layers.Dense(3)])
        opt = keras.optimizers.SGD(0.1, momentum=0.9) if optimizer == "sgd" else keras.optimizers.Adam(0.01)
    run = build(strategy, model, opt, global_batch_size=8, metrics=metrics.Classification(3))
    x, y = np.ones([8, 4], np.float32), np.zeros([8], np.int32)
    ds = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    run.trainer.run_loop(ds, 2)
    run.trainer.run_loop(ds, 5)
    run.train_step((x, y))
    run.train_step((x, y))
    assert run.trainer.train_loop.experimental_get_tracing_count() == 1
    assert run.trainer.train_step.experimental_get_tracing_count() == 1
    slots = 1 if optimizer == "sgd" else 2   # momentum; Adam's two moments
    assert len(opt.variables) == 1 + 2 * slots   # the iteration count, then the slots of the kernel and the bias
