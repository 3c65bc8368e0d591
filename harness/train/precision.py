"""Mixed-precision policy: choose it, apply it, and wrap the optimizer for loss scaling.

Sources: Keras mixed precision guide (tensorflow.org/guide/mixed_precision): float16 pays off on NVIDIA GPUs of
compute capability >= 7.0 (Tensor Cores) and needs loss scaling; bfloat16 needs none and runs on TPUs and on CPUs
with AVX512_BF16/AMX; outputs should be float32 for numeric stability.
"""
from __future__ import annotations

import logging

import tensorflow as tf
import tf_keras as keras
from harness.errors import ConfigError

log = logging.getLogger(__name__)

CHOICES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


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
    """Resolve and set the global Keras policy; log what was chosen and why. Returns the policy name."""
    policy, why = resolve_precision(name)
    keras.mixed_precision.set_global_policy(policy)
    log.info("precision: %s (%s)", policy, why)
    return policy


def needs_loss_scaling(policy: str) -> bool:
    """float16 gradients underflow without loss scaling; bfloat16 has float32's exponent range and needs none."""
    return policy == "mixed_float16"


def wrap_optimizer(optimizer, policy: str, *, initial_scale: float | None = None, dynamic: bool = True):
    """Wrap `optimizer` in a LossScaleOptimizer when `policy` needs loss scaling, else return it unchanged.

    The training loop scales the loss once (`get_scaled_loss`) and unscales the gradients once
    (`get_unscaled_gradients`) before they are all-reduced by `apply_gradients`. With `dynamic=True` the scale starts
    at `initial_scale` (default 2**15) and halves on non-finite gradients (that step is skipped), doubling after
    2000 finite steps (Micikevicius et al., "Mixed Precision Training", ICLR 2018).
    """
    if not needs_loss_scaling(policy):
        return optimizer
    kwargs = {"dynamic": dynamic}
    if initial_scale is not None:
        kwargs["initial_scale"] = initial_scale
    return keras.mixed_precision.LossScaleOptimizer(optimizer, **kwargs)
