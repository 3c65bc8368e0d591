"""Build the tf.distribute strategy for this process, together with its `WorkerContext`.

Strategies (https://www.tensorflow.org/guide/distributed_training):
  - `single`: `tf.distribute.OneDeviceStrategy` on GPU 0, else the CPU.
  - `mirrored`: `tf.distribute.MirroredStrategy` over the local GPUs, or over `num_cpu_replicas` logical CPU
    devices when there is no GPU (for tests: one host, several replicas).
  - `multi_worker`: `tf.distribute.MultiWorkerMirroredStrategy` over the cluster in TF_CONFIG
    (https://www.tensorflow.org/api_docs/python/tf/distribute/MultiWorkerMirroredStrategy), all-reduce by RING
    on CPU and NCCL on GPU. The cluster is handed over as parsed by `harness.distribute.environment`, so the
    strategy and the context cannot disagree about it.
  - `auto`: multi_worker if TF_CONFIG has more than one worker task, mirrored if there is more than one local
    GPU (or `num_cpu_replicas > 1`), else single.

Call `make_strategy` before any other TensorFlow op: logical CPU devices and MultiWorkerMirrored's collective ops
can only be configured before TensorFlow initializes its runtime.
"""
from __future__ import annotations

import logging
from typing import Mapping, Optional, Union

import tensorflow as tf

from harness.distribute import environment
from harness.distribute.context import Backend, WorkerContext
from harness.errors import ClusterConfigError

log = logging.getLogger(__name__)

AUTO = "auto"
_COMMUNICATION = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def make_strategy(kind: Union[str, Backend] = AUTO, *, num_cpu_replicas: Optional[int] = None,
                  communication: Optional[str] = None, environ: Optional[Mapping[str, str]] = None,
                  ) -> tuple[tf.distribute.Strategy, WorkerContext]:
    """Build the strategy and resolve the worker context, checking that they agree.

    Args:
      kind: `"auto"`, `"single"`, `"mirrored"`, `"multi_worker"`, or a `Backend` (not `HOROVOD`).
      num_cpu_replicas: logical CPU devices for `mirrored` when the host has no GPU (default 1).
      communication: all-reduce for `multi_worker`: `"auto"`, `"ring"` or `"nccl"`; default RING without GPUs,
        NCCL with.
      environ: variables to read instead of `os.environ` (tests).

    Returns:
      `(strategy, context)`, with `strategy.num_replicas_in_sync == context.replicas_in_sync`.

    Raises:
      ClusterConfigError: if TF_CONFIG or launcher variables are malformed; if the CPU cannot be split because
        TensorFlow already initialized its devices; if MultiWorkerMirroredStrategy is built after TensorFlow
        initialized its runtime; if the replicas in sync are not workers x local devices.
      ValueError: for an unknown `kind` or `communication`, `HOROVOD`, or `num_cpu_replicas > 1` with a kind
        that cannot use it.
    """
    gpus = len(tf.config.list_physical_devices("GPU"))  # does not initialize the runtime
    config = environment.read_tf_config(environ)
    backend = _resolve_kind(kind, config, gpus, num_cpu_replicas or 1)
    if (num_cpu_replicas or 1) > 1 and (backend is not Backend.MIRRORED or gpus):
        raise ValueError(f"num_cpu_replicas={num_cpu_replicas} applies to mirrored without GPUs only "
                         f"(kind {backend.value}, {gpus} GPUs)")
    if backend is Backend.SINGLE:
        strategy = tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
        context = WorkerContext.single()
    elif backend is Backend.MIRRORED:
        devices = [f"/gpu:{i}" for i in range(gpus)] if gpus else _logical_cpus(num_cpu_replicas or 1)
        # Logical CPUs of one host: reduce on one device. (Collective all-reduce over logical CPUs also works, but
        # several MirroredStrategy objects in one process then collide on collective instance keys.)
        cross_device_ops = None if gpus else tf.distribute.ReductionToOneDevice()
        strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
        context = WorkerContext(0, 1, 0, len(devices), environment.WORKER, 0, Backend.MIRRORED)
    else:
        strategy, context = _multi_worker(config, gpus, communication)
    if strategy.num_replicas_in_sync != context.replicas_in_sync:
        raise ClusterConfigError(
            f"{type(strategy).__name__} has {strategy.num_replicas_in_sync} replicas in sync, expected "
            f"{context.num_workers} workers x {context.replicas_per_worker} local devices = "
            f"{context.replicas_in_sync}. TF_CONFIG set after TensorFlow initialized its runtime is the classic "
            f"cause: set it before the process starts")
    log.info("%s: %s", type(strategy).__name__, context)
    return strategy, context


def _resolve_kind(kind: Union[str, Backend], config: Optional[environment.TFConfig], gpus: int,
                  cpu_replicas: int) -> Backend:
    if kind == AUTO:
        if config is not None and len(config.tasks()) > 1:
            return Backend.MULTI_WORKER
        return Backend.MIRRORED if gpus > 1 or (not gpus and cpu_replicas > 1) else Backend.SINGLE
    try:
        backend = Backend(kind)
    except ValueError:
        raise ValueError(f"unknown strategy kind {kind!r}: one of auto, single, mirrored, multi_worker") from None
    if backend is Backend.HOROVOD:
        raise ValueError("Horovod builds no tf.distribute strategy: use WorkerContext.from_horovod(hvd)")
    return backend


def _logical_cpus(n: int) -> list[str]:
    """Split the CPU into `n` logical devices (before TensorFlow initializes them); their names."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError:
        pass  # already initialized: fine if it already has n devices (a second make_strategy in one process)
    names = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(names) != n:
        raise ClusterConfigError(f"cannot split the CPU into {n} logical devices: TensorFlow already initialized "
                                 f"{len(names)}; call make_strategy before any other TensorFlow op")
    return names


def _multi_worker(config: Optional[environment.TFConfig], gpus: int, communication: Optional[str],
                  ) -> tuple[tf.distribute.Strategy, WorkerContext]:
    local_devices = max(gpus, 1)  # MultiWorkerMirrored drives every local GPU, or one CPU
    name = communication or ("nccl" if gpus else "ring")
    if name not in _COMMUNICATION:
        raise ValueError(f"unknown communication {name!r}: one of {sorted(_COMMUNICATION)}")
    options = tf.distribute.experimental.CommunicationOptions(implementation=_COMMUNICATION[name])
    if config is None:  # one worker, no cluster
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({}), num_accelerators={"GPU": gpus})
        context = WorkerContext(0, 1, 0, local_devices, environment.WORKER, 0, Backend.MULTI_WORKER)
    else:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({t: list(a) for t, a in config.cluster.items()}), task_type=config.task_type,
            task_id=config.task_index, num_accelerators={"GPU": gpus}, rpc_layer="grpc")
        context = WorkerContext.from_tf_config(config, replicas_per_worker=local_devices)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                            communication_options=options)
    except RuntimeError as e:
        raise ClusterConfigError(f"MultiWorkerMirroredStrategy failed: {e}. TF_CONFIG must be set and the "
                                 f"strategy built before any other TensorFlow op initializes the runtime") from e
    return strategy, context
