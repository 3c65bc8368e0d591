"""The training loop under 2 MirroredStrategy replicas on CPU: learning, timing, non-finite loss, backup."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.distribute.context import WorkerContext
from harness.errors import NonFiniteLossError
from harness.train.lifecycle import backup as backups
from harness.train.model import builtin
from harness.train.loop.controller import choose_steps_per_loop
from harness.train.report.console import format_epoch
from loop_support import build


def _table_dataset(n=512, bands=3, seed=0):
    """Class = which band is largest: learnable by a small MLP."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, bands)).astype(np.float32)
    y = x.argmax(1).astype(np.int32)
    return x, y


def _trainer(strategy, steps, epochs=2, batch=32, lr=1e-2, hidden=(16,), steps_per_loop=None, hooks=()):
    context = WorkerContext.single(replicas_per_worker=strategy.num_replicas_in_sync)
    with strategy.scope():
        model = builtin.pixel_classifier(3, 3, hidden=hidden)
        opt = keras.optimizers.Adam(lr)
    return (build(strategy, model, opt, global_batch_size=batch, epochs=epochs, steps_per_epoch=steps,
                  steps_per_loop=steps_per_loop, actions=hooks, context=context), model, opt)


def _dist(strategy, x, y, batch, repeat=True):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = (ds.repeat() if repeat else ds).batch(batch, drop_remainder=True)
    return strategy.experimental_distribute_dataset(ds)


def test_fit_learns_and_reports(capsys, cpu_mirrored):
    strategy = cpu_mirrored
    x, y = _table_dataset()
    trainer, model, opt = _trainer(strategy, steps=16, epochs=3)
    history = trainer.fit(iter(_dist(strategy, x, y, 32)), validation=lambda: _dist(strategy, x, y, 32, False))
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert [h["step"] for h in history] == [16, 32, 48]
    assert int(opt.iterations.numpy()) == 48
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["val_accuracy"] > 0.8          # majority class is ~1/3
    assert 0.0 <= history[-1]["input_stall_share"] < 1.0 and history[-1]["examples_per_s"] > 0
    out = capsys.readouterr().out
    assert "epoch 3/3 step 48: loss" in out and "val_accuracy" in out and "examples/s" in out
    summary = trainer.timer.summary()
    assert summary["steps"] == 48 - 2 and summary["warmup_steps"] == 2


@pytest.mark.parametrize("steps_per_loop", [1, 3])
def test_non_finite_loss_stops_with_step(cpu_mirrored, steps_per_loop):
    strategy = cpu_mirrored
    x, y = _table_dataset(64)
    x[40:] = np.inf                                    # in the batch of step 2 (records 32..63) and later
    # No hidden ReLU (which may map NaN to 0): logits are sums of +-inf, so the loss is NaN or inf.
    trainer, _, _ = _trainer(strategy, steps=4, epochs=1, hidden=(), steps_per_loop=steps_per_loop)
    with pytest.raises(NonFiniteLossError, match="at step 2 "):
        trainer.fit(iter(_dist(strategy, x, y, 32)))


@pytest.mark.parametrize("steps_per_loop", [None, 1, 3])
def test_backup_resume_continues_at_next_epoch(tmp_path, steps_per_loop):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _table_dataset()
    trainer, model, opt = _trainer(strategy, steps=5, epochs=2, steps_per_loop=steps_per_loop)
    ctx = trainer.context
    with strategy.scope():
        backup = backups.Backup(str(tmp_path), ctx, model=model, optimizer=opt)
    assert backup.restore() == 0
    trainer.fit(iter(_dist(strategy, x, y, 32)), backup=backup)
    weights = [w.numpy() for w in model.weights]

    trainer2, model2, opt2 = _trainer(strategy, steps=5, epochs=3, steps_per_loop=steps_per_loop)
    with strategy.scope():
        backup2 = backups.Backup(str(tmp_path), ctx, model=model2, optimizer=opt2)
    assert backup2.restore() == 10
    for a, b in zip(weights, model2.weights):
        np.testing.assert_array_equal(a, b.numpy())
    history = trainer2.fit(iter(_dist(strategy, x, y, 32)), initial_step=10, backup=backup2)
    assert [h["epoch"] for h in history] == [3] and history[0]["step"] == 15
    assert int(opt2.iterations.numpy()) == 15


def test_format_epoch():
    line = format_epoch({"epoch": 2, "step": 40, "loss": 0.5, "val_loss": 0.25, "val_accuracy": 0.875,
                         "val_records": 120, "examples_per_s": 812.0, "input_stall_share": 0.031}, 5)
    assert line == ("epoch 2/5 step 40: loss 0.5000 val_loss 0.2500 val_accuracy 0.8750 (120 records) | 812.0 "
                    "examples/s, input stall 3.1%")
    scaled = format_epoch({"epoch": 1, "step": 8, "loss": 0.5, "examples_per_s": 10.0, "input_stall_share": 0.0,
                           "skipped_updates": 3, "loss_scale": 16384.0}, 1)
    assert scaled.endswith("input stall 0.0%, 3 updates skipped, loss scale 16384")


class _Calls:
    """A step hook that records each call's steps (all `before_step`s of a call come before its `after_step`s);
    with `first`/`last` it is a window, as the profiler's trace."""

    def __init__(self, first=None, last=None):
        self.first, self.last, self.calls, self._open = first, last, [], []

    def before_step(self, step):
        self._open.append(step)

    def after_step(self, step):
        if self._open:
            self.calls.append(self._open)
            self._open = []


def test_steps_per_loop_trains_the_same_steps_as_one_step_calls(cpu_mirrored):
    """K = 5 over 16 steps per epoch (5 does not divide 16): the same losses, updates and weights as K = 1."""
    strategy = cpu_mirrored
    x, y = _table_dataset()
    runs, start = {}, None
    for k in (1, 5):
        calls = _Calls()
        trainer, model, opt = _trainer(strategy, steps=16, epochs=2, steps_per_loop=k, hooks=[calls])
        if start is None:
            start = model.get_weights()
        model.set_weights(start)
        history = trainer.fit(iter(_dist(strategy, x, y, 32)), validation=lambda: _dist(strategy, x, y, 32, False))
        runs[k] = history, model.get_weights(), int(opt.iterations.numpy()), [c[0] for c in calls.calls]
    assert runs[1][3] == list(range(1, 33))
    assert runs[5][3] == [1, 6, 11, 16, 17, 22, 27, 32]     # 5, 5, 5, 1 per epoch: never across step 16
    assert runs[5][2] == runs[1][2] == 32 and [h["step"] for h in runs[5][0]] == [16, 32]
    for a, b in zip(runs[1][0], runs[5][0]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
    for a, b in zip(runs[1][1], runs[5][1]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_a_call_ends_before_a_window_and_runs_one_step_inside_it():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _table_dataset()
    window = _Calls(first=7, last=8)
    trainer, _, _ = _trainer(strategy, steps=16, epochs=2, steps_per_loop=5, hooks=[window])
    trainer.fit(iter(_dist(strategy, x, y, 32)))
    assert [c[0] for c in window.calls] == [1, 6, 7, 8, 9, 14, 17, 22, 27, 32]
    assert [len(c) for c in window.calls] == [5, 1, 1, 1, 5, 3, 5, 5, 5, 1]
    # every step is in the timer once, in order
    assert [s.step for s in trainer.timer.steps] == list(range(1, 33))


def test_auto_measures_one_step_calls_then_fills_about_a_quarter_second():
    assert choose_steps_per_loop(0.001) == 250 and choose_steps_per_loop(0.01) == 25
    assert choose_steps_per_loop(2.0) == 1 and choose_steps_per_loop(0.0) == 1000
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _table_dataset()
    calls = _Calls()
    trainer, _, opt = _trainer(strategy, steps=40, epochs=1, hooks=[calls])
    trainer.fit(iter(_dist(strategy, x, y, 32)))
    sizes = [len(c) for c in calls.calls]
    # warm-up (2) and 3 measured calls of one step, then K (>1 for a step of a few ms), capped by the epoch
    assert sizes[:5] == [1] * 5 and trainer.steps_per_loop > 1
    assert sizes[5] == min(trainer.steps_per_loop, 35) and sum(sizes) == 40
    assert int(opt.iterations.numpy()) == 40
