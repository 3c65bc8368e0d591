"""The user's Keras callbacks (tf-keras, and Keras 3 with a Keras 3 model) under K steps per call run as Keras' fit runs them (issue 19, item 7): epoch hooks
every epoch, batch-end hooks once per step with its index and loss, `model.optimizer` the harness's optimizer,
`model.stop_training` honoured, TensorBoard(update_freq=N) writing batch summaries; callbacks that set the learning
rate refused by name; a callback that must run before every step makes every call one step."""
import contextlib
import io

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.distribute.context import WorkerContext
from harness.errors import UserCodeError
from harness.train.loop.controller import StopTraining
from harness.train.loop.keras_callbacks import KerasCallbacks
from loop_support import build

STEPS, EPOCHS, K, BATCH = 8, 2, 3, 8   # 3 does not divide 8: calls of 3, 3, 2 per epoch


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def on_train_begin(self, logs=None):
        self.events.append(("train_begin", self.model.optimizer.iterations.numpy()))

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch_begin", epoch))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("batch_end", batch, logs["loss"], int(self.model.optimizer.iterations.numpy())))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch))


class BeforeEachStep(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = []

    def on_train_batch_begin(self, batch, logs=None):
        self.batches.append((batch, int(self.model.optimizer.iterations.numpy())))


def _run(callbacks, x=None, steps_per_loop=K, keras=keras):
    """The run with `callbacks`, its model and optimizer of the Keras module `keras` (tf-keras unless told)."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        opt = keras.optimizers.SGD(0.1)
    context = WorkerContext.single()
    users = KerasCallbacks(callbacks, model, context, opt)
    run = build(strategy, model, opt, global_batch_size=BATCH, epochs=EPOCHS, steps_per_epoch=STEPS,
                steps_per_loop=steps_per_loop, callbacks=users)
    if x is None:
        x = np.random.default_rng(0).normal(size=(BATCH * STEPS, 3)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, (x[:, 0] > 0).astype(np.int32))).batch(BATCH).repeat()
    return run, model, opt, iter(strategy.experimental_distribute_dataset(ds))


def test_epoch_and_batch_hooks_run_every_step_under_k_steps_per_call():
    rec = Recorder()
    run, model, opt, batches = _run([rec])
    with contextlib.redirect_stdout(io.StringIO()):
        history = run.fit(batches)
    run.controller.end()
    assert run.steps_per_loop == K
    kinds = [e[0] for e in rec.events]
    per_epoch = ["epoch_begin"] + ["batch_end"] * STEPS + ["epoch_end"]
    assert kinds == ["train_begin"] + per_epoch * EPOCHS
    ends = [e for e in rec.events if e[0] == "batch_end"]
    assert [e[1] for e in ends] == list(range(STEPS)) * EPOCHS          # the step's index in its epoch
    # the optimizer is the harness's: after a call of 3 its iterations are at the call's end
    assert [e[3] for e in ends[:STEPS]] == [3, 3, 3, 6, 6, 6, 8, 8]
    # each step's own loss: their mean is the epoch's loss
    for epoch in range(EPOCHS):
        losses = [e[2] for e in ends[epoch * STEPS:(epoch + 1) * STEPS]]
        assert np.mean(losses) == pytest.approx(history[epoch]["loss"], rel=1e-6)
    assert model.optimizer is None   # not kept in the saved model


def test_keras3_callbacks_run_with_a_keras3_model_and_tf_keras_ones_are_refused_by_name():
    import keras as keras3

    class Recorder3(keras3.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.events = []

        def on_epoch_end(self, epoch, logs=None):
            self.events.append(("epoch_end", epoch, round(logs["loss"], 6)))

        def on_train_batch_end(self, batch, logs=None):
            self.events.append(("batch_end", batch, int(self.model.optimizer.iterations.numpy())))

    x = np.random.default_rng(0).normal(size=(BATCH * STEPS, 3)).astype(np.float32)
    x[BATCH * 4:] = np.inf   # step 5 on: the loss is not finite
    rec = Recorder3()
    run, model, _, batches = _run([rec, keras3.callbacks.TerminateOnNaN()], x=x, keras=keras3)
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(StopTraining) as stop:
        run.fit(batches)
    assert "model.stop_training" in str(stop.value) and "step 6" in str(stop.value)   # after the call of 4..6
    assert [e[1:] for e in rec.events if e[0] == "batch_end"][:3] == [(0, 3), (1, 3), (2, 3)]
    with pytest.raises(UserCodeError, match=r"callback Recorder is tf-keras .*; the model is Keras 3"):
        KerasCallbacks([Recorder()], model, WorkerContext.single())


def test_a_callback_before_every_step_makes_every_call_one_step():
    before = BeforeEachStep()
    run, _, _, batches = _run([before])
    with contextlib.redirect_stdout(io.StringIO()):
        run.fit(batches)
    assert run.steps_per_loop == 1
    assert before.batches == [(b, e * STEPS + b) for e in range(EPOCHS) for b in range(STEPS)]


def test_terminate_on_nan_stops_the_run():
    x = np.random.default_rng(0).normal(size=(BATCH * STEPS, 3)).astype(np.float32)
    x[BATCH * 4:] = np.inf   # step 5 on: the loss is not finite
    run, _, _, batches = _run([keras.callbacks.TerminateOnNaN()], x=x)
    with contextlib.redirect_stdout(io.StringIO()) as printed, pytest.raises(StopTraining) as stop:
        run.fit(batches)
    assert "model.stop_training" in str(stop.value) and "step 6" in str(stop.value)   # after the call of 4..6
    assert len(stop.value.history) == 1 and "Invalid loss" in printed.getvalue()


def test_tensorboard_update_freq_writes_batch_loss_every_n_steps(tmp_path):
    board = keras.callbacks.TensorBoard(str(tmp_path), update_freq=4)
    run, _, _, batches = _run([board])
    with contextlib.redirect_stdout(io.StringIO()):
        run.fit(batches)
    run.controller.end()
    steps = []
    for path in (tmp_path / "train").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            steps += [event.step for v in event.summary.value if v.tag == "batch_loss"]
    assert sorted(steps) == [4, 8, 12, 16]


@pytest.mark.parametrize("callback, flag", [
    (keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5), "--schedule"),
    (keras.callbacks.ReduceLROnPlateau(), "--schedule")])
def test_callbacks_that_set_the_learning_rate_are_refused_by_name(callback, flag):
    with pytest.raises(UserCodeError, match=f"{type(callback).__name__}.*{flag}"):
        KerasCallbacks([callback], keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]),
                       WorkerContext.single())


class EvaluationHooks(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def on_test_begin(self, logs=None):
        self.events.append(("test_begin",))

    def on_test_end(self, logs=None):
        self.events.append(("test_end", logs["loss"], logs["records"], logs["accuracy"]))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch, logs["val_loss"]))


def test_evaluation_hooks_run_around_every_evaluation():
    hooks = EvaluationHooks()
    run, _, _, batches = _run([hooks])
    strategy = run.trainer.strategy
    x = np.random.default_rng(3).normal(size=(20, 3)).astype(np.float32)
    val = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, (x[:, 0] > 0).astype(np.int32))).batch(BATCH))
    with contextlib.redirect_stdout(io.StringIO()):
        history = run.fit(batches, validation=lambda: val)
    assert [e[0] for e in hooks.events] == ["test_begin", "test_end", "epoch_end"] * EPOCHS
    for epoch in range(EPOCHS):
        _, loss, records, accuracy = hooks.events[3 * epoch + 1]
        assert (loss, records, accuracy) == (history[epoch]["val_loss"], 20, history[epoch]["val_accuracy"])
        assert hooks.events[3 * epoch + 2] == ("epoch_end", epoch, history[epoch]["val_loss"])
