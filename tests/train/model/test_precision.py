"""Loss scaling is applied exactly once, under one replica and under 2 MirroredStrategy replicas; mixed_bfloat16 on
a CPU without bfloat16 instructions warns, naming the flags looked for."""
import logging
import pathlib

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from harness.train.model import precision
from loop_support import build
from harness.errors import ConfigError



@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _one_step(strategy, scale):
    """Logits = x @ kernel with kernel [[0, 0]], x = 1, label 0, SGD lr 1.

    d(cross-entropy)/d(kernel) = x * (softmax - onehot) = [[-0.5, +0.5]], so one step gives [[0.5, -0.5]]
    whatever the scale; a scale applied twice or never unscaled would give [[0.5 * scale, ...]] or
    [[0.5 / scale, ...]]."""
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)),
                                  keras.layers.Dense(2, use_bias=False, kernel_initializer="zeros"),
                                  keras.layers.Activation("linear", dtype="float32")])
        opt = precision.wrap_optimizer(keras.optimizers.SGD(1.0), "mixed_float16", initial_scale=scale,
                                       dynamic=False)
    assert isinstance(opt, keras.mixed_precision.LossScaleOptimizer)
    trainer = build(strategy, model, opt, global_batch_size=replicas)
    ds = tf.data.Dataset.from_tensors((tf.ones([1]), tf.zeros([], tf.int32))).repeat().batch(replicas)
    dist = strategy.experimental_distribute_dataset(ds)
    loss = trainer.train_step(next(iter(dist)))
    return loss, model.layers[0].kernel.numpy()


@pytest.mark.parametrize("scale", [8.0, 1024.0])
def test_loss_scale_applied_once_one_replica(mixed_float16, scale):
    loss, kernel = _one_step(tf.distribute.OneDeviceStrategy("/cpu:0"), scale)
    assert loss == pytest.approx(np.log(2.0), rel=1e-3)
    np.testing.assert_allclose(kernel, [[0.5, -0.5]], rtol=1e-3)


def test_loss_scale_applied_once_two_replicas(mixed_float16, cpu_mirrored):
    strategy = cpu_mirrored
    assert strategy.num_replicas_in_sync == 2
    loss, kernel = _one_step(strategy, 64.0)
    assert loss == pytest.approx(np.log(2.0), rel=1e-3)
    np.testing.assert_allclose(kernel, [[0.5, -0.5]], rtol=1e-3)


def test_bfloat16_and_float32_need_no_scaling():
    opt = keras.optimizers.SGD(1.0)
    assert precision.wrap_optimizer(opt, "mixed_bfloat16") is opt
    assert precision.wrap_optimizer(opt, "float32") is opt


def test_resolve_precision_requested_and_invalid():
    assert precision.resolve_precision("float32") == ("float32", "requested")
    policy, why = precision.resolve_precision("auto")   # no GPU here
    assert policy in ("float32", "mixed_bfloat16") and why
    with pytest.raises(ConfigError, match="--precision must be one of"):
        precision.resolve_precision("fp8")


@pytest.fixture
def cpu_only(monkeypatch):
    """No GPU or TPU visible (as on this machine), and the float32 policy restored afterwards."""
    monkeypatch.setattr(precision.tf.config, "list_physical_devices", lambda kind=None: [])
    monkeypatch.setattr(precision.tf.config, "list_logical_devices", lambda kind=None: [])
    yield
    keras.mixed_precision.set_global_policy("float32")


def _cpuinfo_without_bf16(tmp_path):
    """This machine's /proc/cpuinfo with the bfloat16 flags struck out: a CPU without bfloat16 instructions."""
    text = pathlib.Path("/proc/cpuinfo").read_text()
    for flag in precision.BF16_CPU_FLAGS:
        text = text.replace(f" {flag}", "")
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


@pytest.mark.skipif(not pathlib.Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo (not Linux)")
def test_bf16_on_cpu_without_bf16_flags_warns_naming_them(cpu_only, monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(precision, "CPUINFO", str(_cpuinfo_without_bf16(tmp_path)))
    assert "sse2" in precision.cpu_flags() and not precision._cpu_has_bf16()
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        assert precision.apply_policy("mixed_bfloat16") == "mixed_bfloat16"
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "neither avx512_bf16 nor amx_bf16" in record.getMessage()
    assert "7x" in record.getMessage() and "--precision float32" in record.getMessage()
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    assert precision.resolve_precision("auto") == ("float32", "no GPU and no bfloat16 CPU instructions")


@pytest.mark.parametrize("flags", [{"avx2", "avx512_bf16"}, {"avx2", "amx_bf16"}])
def test_bf16_on_cpu_with_bf16_flags_does_not_warn(cpu_only, monkeypatch, caplog, flags):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        assert precision.apply_policy("mixed_bfloat16") == "mixed_bfloat16"
        assert precision.apply_policy("float32") == "float32"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert precision.resolve_precision("auto") == ("mixed_bfloat16", "CPU with avx512_bf16/amx_bf16")


def test_no_bf16_warning_for_other_policies(cpu_only, monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))
    assert precision.bf16_cpu_warning("float32") == ""
    assert precision.bf16_cpu_warning("mixed_float16") == ""
    assert "could not be read" not in precision.bf16_cpu_warning("mixed_bfloat16")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset())
    assert "/proc/cpuinfo could not be read" in precision.bf16_cpu_warning("mixed_bfloat16")
