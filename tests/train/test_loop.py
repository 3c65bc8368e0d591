"""The training loop under 2 MirroredStrategy replicas on CPU: learning, timing, non-finite loss, backup."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.distribute.context import WorkerContext
from harness.errors import NonFiniteLossError
from harness.train import checkpoint, models
from harness.train.loop import LoopConfig, Trainer, format_epoch


def _table_dataset(n=512, bands=3, seed=0):
    """Class = which band is largest: learnable by a small MLP."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, bands)).astype(np.float32)
    y = x.argmax(1).astype(np.int32)
    return x, y


def _trainer(strategy, steps, epochs=2, batch=32, lr=1e-2, hidden=(16,)):
    context = WorkerContext.single(replicas_per_worker=strategy.num_replicas_in_sync)
    with strategy.scope():
        model = models.pixel_classifier(3, 3, hidden=hidden)
        opt = keras.optimizers.Adam(lr)
    cfg = LoopConfig(epochs=epochs, steps_per_epoch=steps, global_batch_size=batch, loss_divisor=batch,
                     validation_steps=4)
    return Trainer(model=model, optimizer=opt, strategy=strategy, context=context, config=cfg), model, opt


def _dist(strategy, x, y, batch, repeat=True):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = (ds.repeat() if repeat else ds).batch(batch, drop_remainder=True)
    return strategy.experimental_distribute_dataset(ds)


def test_fit_learns_and_reports(capsys, cpu_mirrored):
    strategy = cpu_mirrored
    x, y = _table_dataset()
    trainer, model, opt = _trainer(strategy, steps=16, epochs=3)
    history = trainer.fit(iter(_dist(strategy, x, y, 32)), validation=lambda: iter(_dist(strategy, x, y, 32, False)))
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


def test_non_finite_loss_stops_with_step(cpu_mirrored):
    strategy = cpu_mirrored
    x, y = _table_dataset(64)
    x[40:] = np.inf                                    # in the batch of step 2 (records 32..63) and later
    # No hidden ReLU (which may map NaN to 0): logits are sums of +-inf, so the loss is NaN or inf.
    trainer, _, _ = _trainer(strategy, steps=4, epochs=1, hidden=())
    with pytest.raises(NonFiniteLossError, match="at step 2 "):
        trainer.fit(iter(_dist(strategy, x, y, 32)))


def test_backup_resume_continues_at_next_epoch(tmp_path):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _table_dataset()
    trainer, model, opt = _trainer(strategy, steps=5, epochs=2)
    ctx = trainer.context
    with strategy.scope():
        backup = checkpoint.Backup(str(tmp_path), ctx, model=model, optimizer=opt)
    assert backup.restore() == 0
    trainer.fit(iter(_dist(strategy, x, y, 32)), on_epoch_end=[backup.on_epoch_end])
    weights = [w.numpy() for w in model.weights]

    trainer2, model2, opt2 = _trainer(strategy, steps=5, epochs=3)
    with strategy.scope():
        backup2 = checkpoint.Backup(str(tmp_path), ctx, model=model2, optimizer=opt2)
    assert backup2.restore() == 10
    for a, b in zip(weights, model2.weights):
        np.testing.assert_array_equal(a, b.numpy())
    history = trainer2.fit(iter(_dist(strategy, x, y, 32)), initial_step=10, on_epoch_end=[backup2.on_epoch_end])
    assert [h["epoch"] for h in history] == [3] and history[0]["step"] == 15
    assert int(opt2.iterations.numpy()) == 15


def test_format_epoch():
    line = format_epoch({"epoch": 2, "step": 40, "loss": 0.5, "val_loss": 0.25, "val_accuracy": 0.875,
                         "examples_per_s": 812.0, "input_stall_share": 0.031}, 5)
    assert line == ("epoch 2/5 step 40: loss 0.5000 val_loss 0.2500 val_accuracy 0.8750 | 812.0 examples/s, "
                    "input stall 3.1%")
