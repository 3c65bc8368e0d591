"""Optimizer and schedule (`harness.train.model.optim`): closed forms, learning-rate scaling, refusals, resume without
restarting warm-up, and gradient clipping after the cross-replica reduction."""
import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.distribute.context import WorkerContext
from harness.errors import ConfigError, UserCodeError
from harness.train.lifecycle import backup as backups
from harness.train.model import optim
from loop_support import build
from harness.train.model.optim import ScheduleConfig
from harness.train.options import TrainOptions
from harness.choices import SCHEDULES


@pytest.mark.parametrize("cfg, expected", [
    # warm-up 4 steps to 0.1, then constant
    (ScheduleConfig(peak=0.1, total_steps=20, warmup_steps=4), {0: 0.025, 1: 0.05, 3: 0.1, 4: 0.1, 19: 0.1}),
    # cosine over 16 steps after 4 of warm-up: half-way (t = 8) is peak / 2; the end is 0
    (ScheduleConfig(peak=0.1, total_steps=20, warmup_steps=4, kind="cosine"),
     {2: 0.075, 4: 0.1, 8: 0.1 * 0.5 * (1 + math.cos(math.pi * 4 / 16)), 12: 0.05, 20: 0.0, 25: 0.0}),
    # step: x0.1 every 5 steps
    (ScheduleConfig(peak=0.2, total_steps=30, kind="step", decay_steps=5, decay_rate=0.1),
     {0: 0.2, 4: 0.2, 5: 0.2 * 0.1, 14: 0.2 * 0.1 ** 2, 15: 0.2 * 0.1 ** 3}),
    # exponential: x0.5 per 10 steps, continuous
    (ScheduleConfig(peak=0.2, total_steps=30, kind="exponential", decay_steps=10, decay_rate=0.5, warmup_steps=2),
     {0: 0.1, 2: 0.2, 7: 0.2 * 0.5 ** 0.5, 12: 0.1, 22: 0.05}),
])
def test_schedule_equals_the_closed_form_exactly(cfg, expected):
    schedule = optim.make_schedule(cfg)
    for step, value in expected.items():
        assert cfg.at(step) == pytest.approx(value, rel=1e-12, abs=1e-15), step
        got = schedule(tf.constant(step, tf.int64)).numpy()
        assert got.dtype == np.float32 and got == np.float32(cfg.at(step)), (step, got, cfg.at(step))


@pytest.mark.parametrize("kind", SCHEDULES)
def test_the_report_shows_the_schedule_fields_its_rate_depends_on(kind):
    """optim.used_fields keeps a field exactly where changing it changes the rate of some step (ScheduleConfig.at):
    a constant rate is shown without the decay settings it ignores (issue 68)."""
    import dataclasses

    base = ScheduleConfig(peak=0.1, total_steps=40, warmup_steps=4, kind=kind, decay_steps=5, decay_rate=0.5)
    changed = {"peak": 0.2, "total_steps": 30, "warmup_steps": 6, "decay_steps": 7, "decay_rate": 0.3}
    depends = {name for name, value in changed.items()
               if any(base.at(s) != dataclasses.replace(base, **{name: value}).at(s) for s in range(45))}
    assert set(optim.used_fields(dataclasses.asdict(base))) == depends | {"kind"}
    no_warmup = dataclasses.asdict(dataclasses.replace(base, warmup_steps=0))
    assert "warmup_steps" not in optim.used_fields(no_warmup)


def test_peak_learning_rate_scaling():
    assert optim.peak_learning_rate(0.1, "none", 256, None) == 0.1
    assert optim.peak_learning_rate(0.1, "linear", 256, 64) == pytest.approx(0.4, rel=1e-15)
    assert optim.peak_learning_rate(0.1, "sqrt", 256, 64) == pytest.approx(0.2, rel=1e-15)
    assert optim.describe_peak(0.1, "linear", 256, 64) == (
        "learning rate: peak 0.4 = 0.1 x (256/64) (linear scaling with the global batch, Goyal et al. 2017)")
    with pytest.raises(ConfigError, match="--scale-lr linear scales against --base-batch-size: give it"):
        TrainOptions(data=("x",), scale_lr="linear")


def test_schedule_config_from_options_and_plan():
    plan = SimpleNamespace(steps_per_epoch=10, global_batch_size=128)
    cfg = optim.schedule_config(TrainOptions(data=("x",), epochs=3, learning_rate=0.01, schedule="cosine",
                                             warmup_epochs=0.5, scale_lr="linear", base_batch_size=32), plan)
    assert cfg == ScheduleConfig(peak=0.04, total_steps=30, warmup_steps=5, kind="cosine", decay_steps=10,
                                 decay_rate=0.1)
    cfg = optim.schedule_config(TrainOptions(data=("x",), epochs=3, schedule="step", decay_epochs=2), plan)
    assert (cfg.decay_steps, cfg.decay_rate, cfg.peak) == (20, 0.1, 1e-3)  # nothing scaled unless asked
    with pytest.raises(ConfigError, match="give --warmup-steps or --warmup-epochs, not both"):
        optim.schedule_config(TrainOptions(data=("x",), warmup_steps=2, warmup_epochs=1), plan)
    with pytest.raises(ConfigError, match="warm-up of 50 steps must be >= 0 and shorter than the run \\(50 steps\\)"):
        optim.schedule_config(TrainOptions(data=("x",), warmup_steps=50), plan)


def test_prebuilt_optimizer_and_bad_values_are_refused():
    with pytest.raises(UserCodeError) as e:
        TrainOptions(data=("x",), optimizer=keras.optimizers.Adam(1e-3))
    assert str(e.value).startswith("optimizer: got a built Adam object; give its name instead")
    assert "inside the strategy's scope" in str(e.value)
    with pytest.raises(UserCodeError, match="schedule: got a built CosineDecay object"):
        TrainOptions(data=("x",), schedule=keras.optimizers.schedules.CosineDecay(0.1, 10))
    with pytest.raises(ConfigError, match="optimizer must be one of \\('adam', 'adamw', 'sgd'\\), got 'rmsprop'"):
        TrainOptions(data=("x",), optimizer="rmsprop")
    with pytest.raises(ConfigError, match="momentum must be >= 0, got -0.5"):
        TrainOptions(data=("x",), optimizer="sgd", momentum=-0.5)
    # On construction, before any data is read (the CLI and the Python API build TrainOptions first).
    with pytest.raises(ConfigError, match="--momentum and --nesterov are SGD's; --optimizer is adam"):
        TrainOptions(data=("x",), momentum=0.9)
    with pytest.raises(ConfigError, match="--momentum and --nesterov are SGD's; --optimizer is adamw"):
        TrainOptions(data=("x",), optimizer="adamw", nesterov=True)


def test_make_optimizer_kinds():
    sgd = optim.make_optimizer(TrainOptions(data=("x",), optimizer="sgd", momentum=0.9, nesterov=True,
                                            weight_decay=1e-4), 0.1)
    assert isinstance(sgd, keras.optimizers.SGD) and sgd.momentum == 0.9 and sgd.nesterov
    assert sgd.weight_decay == pytest.approx(1e-4)
    adamw = optim.make_optimizer(TrainOptions(data=("x",), optimizer="adamw"), 0.1)
    assert isinstance(adamw, keras.optimizers.AdamW) and adamw.weight_decay == pytest.approx(0.004)
    assert type(optim.make_optimizer(TrainOptions(data=("x",)), 0.1)) is keras.optimizers.Adam


# --- the loop ---------------------------------------------------------------------------------------------------
def _linear(strategy, lr, bias=True):
    """Dense(1) from 3 inputs, kernel 0: logits [batch, 1]... two classes need 2 outputs: Dense(2), zeros."""
    with strategy.scope():
        x = inputs = keras.Input((3,))
        model = keras.Model(inputs, keras.layers.Dense(2, kernel_initializer="zeros", use_bias=bias)(x))
        opt = keras.optimizers.SGD(lr)
    return model, opt


def _run(strategy, x, y, *, steps, lr=1.0, clip_norm=None, initial_step=0, model_opt=None, backup=None):
    model, opt = model_opt or _linear(strategy, lr)
    batch = len(x) // steps
    trainer = build(strategy, model, opt, global_batch_size=batch, epochs=steps, steps_per_epoch=1,
                    clip_norm=clip_norm)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).skip(initial_step).repeat()
    trainer.fit(iter(strategy.experimental_distribute_dataset(ds)), initial_step=initial_step,
                backup=backup)
    return model, opt


def test_clip_norm_applies_to_the_reduced_gradient(cpu_mirrored):
    """One SGD step, lr 1, clip 0.1: the two replicas' halves have gradients of other norms than the batch's; the
    clipped update is the full-batch gradient scaled to norm 0.1, the same on 1 device and on 2 replicas."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=(8, 3)) * 4, rng.normal(size=(8, 3)) * 0.2]).astype(np.float32)
    y = np.array([0, 1] * 8, np.int32)
    model0, _ = _linear(tf.distribute.OneDeviceStrategy("/cpu:0"), 1.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model0(x)))
    grads = tape.gradient(loss, model0.trainable_variables)
    norm = float(tf.linalg.global_norm(grads))
    assert norm > 0.1  # the clip is active
    expected = [-(g.numpy() * 0.1 / norm) for g in grads]
    one, _ = _run(tf.distribute.OneDeviceStrategy("/cpu:0"), x, y, steps=1, clip_norm=0.1)
    two, _ = _run(cpu_mirrored, x, y, steps=1, clip_norm=0.1)
    for e, a, b in zip(expected, one.get_weights(), two.get_weights()):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(b, e, rtol=1e-5, atol=1e-7)
    assert float(tf.linalg.global_norm([tf.constant(w) for w in two.get_weights()])) == pytest.approx(0.1, rel=1e-5)


def test_resume_continues_the_schedule(tmp_path):
    """Warm-up over 8 steps: 5 steps, a backup, a restore and a 6th step give the weights of 6 uninterrupted steps
    (a restarted warm-up would take the 6th step at 1/8 of the peak, not 6/8)."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(48, 3)).astype(np.float32), rng.integers(0, 2, 48).astype(np.int32)
    cfg = ScheduleConfig(peak=0.5, total_steps=6, warmup_steps=8)  # still warming up at step 6

    def built():
        return _linear(strategy, optim.make_schedule(cfg))
    straight, _ = _run(strategy, x, y, steps=6, model_opt=built())
    model, opt = built()
    backup = backups.Backup(str(tmp_path), WorkerContext.single(), model=model, optimizer=opt)
    _run(strategy, x[:40], y[:40], steps=5, model_opt=(model, opt), backup=backup)
    model2, opt2 = built()
    backup2 = backups.Backup(str(tmp_path), WorkerContext.single(), model=model2, optimizer=opt2)
    assert backup2.restore() == 5
    _run(strategy, x, y, steps=6, initial_step=5, model_opt=(model2, opt2))
    assert int(opt2.iterations.numpy()) == 6
    for a, b in zip(straight.get_weights(), model2.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_plan_prints_the_peak_learning_rate(tmp_path):
    from harness.data.export import synth
    synth.write_table_export(str(tmp_path), shards=2, records=256, seed=1)
    r = subprocess.run([sys.executable, "-m", "harness.cli", "plan", str(tmp_path), "--workers", "2",
                        "--global-batch-size", "64", "--learning-rate", "0.01", "--scale-lr", "sqrt",
                        "--base-batch-size", "16"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "learning rate: peak 0.02 = 0.01 x sqrt(64/16) (sqrt scaling with the global batch" in r.stdout
