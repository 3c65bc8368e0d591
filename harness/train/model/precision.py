"""Mixed-precision policy: choose it, apply it, and wrap the optimizer for loss scaling.

Sources: Keras mixed precision guide (tensorflow.org/guide/mixed_precision): float16 pays off on NVIDIA GPUs of
compute capability >= 7.0 (Tensor Cores) and needs loss scaling; bfloat16 needs none and runs on TPUs and on CPUs
with AVX512_BF16/AMX; outputs should be float32 for numeric stability. On a CPU without those instructions
TensorFlow emulates bfloat16 through float32 conversions: a mixed_bfloat16 run measured 7x slower than float32
there (issue 11), so `apply_policy` warns, naming the flags it looked for.
"""
from __future__ import annotations

import logging
import sys

import tensorflow as tf
import tf_keras as keras
from harness.choices import PRECISIONS as CHOICES
from harness.errors import ConfigError

log = logging.getLogger(__name__)


CPUINFO = "/proc/cpuinfo"
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # Linux names of the AVX512_BF16 and AMX-BF16 instruction sets


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of the first processor listed in /proc/cpuinfo (Linux `flags` line); empty where the
    file cannot be read (not Linux)."""
    try:
        with open(CPUINFO) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def _cpu_has_bf16() -> bool:
    return any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)


def resolve_precision(name: str) -> tuple[str, str]:
    """Turn `--precision` into a Keras policy name, with the reason.

    `auto`: mixed_float16 when every visible GPU has compute capability >= 7.0; float32 on older GPUs;
    mixed_bfloat16 on TPUs and on CPUs with bfloat16 instructions (avx512_bf16 or amx_bf16); float32 otherwise.

    Returns:
      (policy name, human-readable reason).
    Raises:
      ConfigError: if `name` is not one of CHOICES.
    """
    if name not in CHOICES:
        raise ConfigError(f"--precision must be one of {CHOICES}, got {name!r}")
    if name != "auto":
        return name, "requested"
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        caps = [tf.config.experimental.get_device_details(g).get("compute_capability", (0, 0)) for g in gpus]
        if all(c >= (7, 0) for c in caps):
            return "mixed_float16", f"GPU compute capability {min(caps)} >= 7.0"
        return "float32", f"GPU compute capability {min(caps)} < 7.0 (no float16 Tensor Cores)"
    if tf.config.list_logical_devices("TPU"):
        return "mixed_bfloat16", "TPU"
    if _cpu_has_bf16():
        return "mixed_bfloat16", "CPU with avx512_bf16/amx_bf16"
    return "float32", "no GPU and no bfloat16 CPU instructions"


def apply_policy(name: str) -> str:
    """Resolve and set the global Keras policy, tf-keras's and, where the user's code imported it, Keras 3's (the
    model is built after, in either); log what was chosen and why, and warn when bfloat16 will run on a CPU without
    bfloat16 instructions (`bf16_cpu_warning`). Returns the policy name."""
    policy, why = resolve_precision(name)
    keras.mixed_precision.set_global_policy(policy)
    if "keras" in sys.modules:
        sys.modules["keras"].mixed_precision.set_global_policy(policy)
    log.info("precision: %s (%s)", policy, why)
    warning = bf16_cpu_warning(policy)
    if warning:
        log.warning("%s", warning)
    return policy


def bf16_cpu_warning(policy: str) -> str:
    """Why `policy` will be slow here, or "" when it will not: mixed_bfloat16 with no GPU or TPU visible, on a CPU
    whose /proc/cpuinfo flags hold none of BF16_CPU_FLAGS (the flags `auto` reads)."""
    if policy != "mixed_bfloat16" or tf.config.list_physical_devices("GPU") or \
            tf.config.list_logical_devices("TPU"):
        return ""
    flags = cpu_flags()
    if any(flag in flags for flag in BF16_CPU_FLAGS):
        return ""
    found = (f"the CPU flags in {CPUINFO} include neither {' nor '.join(BF16_CPU_FLAGS)}" if flags
             else f"{CPUINFO} could not be read, so neither {' nor '.join(BF16_CPU_FLAGS)} was found")
    return (f"precision mixed_bfloat16 on a CPU without bfloat16 instructions: {found}; TensorFlow emulates "
            f"bfloat16 there and a step runs several times slower than float32 (7x measured in issue 11). Use "
            f"--precision float32, or --precision auto, which picks float32 on this CPU.")


def needs_loss_scaling(policy: str) -> bool:
    """float16 gradients underflow without loss scaling; bfloat16 has float32's exponent range and needs none."""
    return policy == "mixed_float16"


def wrap_optimizer(optimizer, policy: str, *, initial_scale: float | None = None, dynamic: bool = True):
    """Wrap `optimizer` in its Keras kind's LossScaleOptimizer when `policy` needs loss scaling, else return it
    unchanged.

    The training loop scales the loss once and unscales the gradients once (`harness.train.loop.trainer`). With
    `dynamic=True` the scale starts at `initial_scale` (default 2**15) and halves on non-finite gradients (that step
    is skipped), doubling after 2000 finite steps (Micikevicius et al., "Mixed Precision Training", ICLR 2018).

    Raises:
      ConfigError: `dynamic=False` for a Keras 3 optimizer (Keras 3's LossScaleOptimizer is dynamic only).
    """
    from harness import keras_kinds as kinds

    if not needs_loss_scaling(policy):
        return optimizer
    if kinds.of(optimizer) == kinds.KERAS3:
        if not dynamic:
            raise ConfigError("a fixed loss scale: Keras 3's LossScaleOptimizer is dynamic only")
        return kinds.module(kinds.KERAS3).optimizers.LossScaleOptimizer(
            optimizer, **({"initial_scale": initial_scale} if initial_scale is not None else {}))
    kwargs = {"dynamic": dynamic}
    if initial_scale is not None:
        kwargs["initial_scale"] = initial_scale
    return keras.mixed_precision.LossScaleOptimizer(optimizer, **kwargs)
