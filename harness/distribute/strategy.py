"""Build the tf.distribute strategy for this process, together with its `WorkerContext`.

Strategies (https://www.tensorflow.org/guide/distributed_training):
  - `single`: the default strategy (`tf.distribute.get_strategy()`, what Keras `fit` runs under without a
    scope): one replica, ops placed by TensorFlow's default placement (GPU 0 when there is one, else the CPU).
    `OneDeviceStrategy` would pin the same device but wraps every step in a distributed-values layer: on the ACES
    points it cost ~2x per step of a small model (benchmarks/step_loop.py, "harness auto, OneDeviceStrategy"),
    and its distributed iterator ~3x per batch drawn; the default strategy's datasets are plain `tf.data` ones.
    It has no `extended.worker_devices`: ask `replica_devices`.
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

A worker that never arrives: MultiWorkerMirroredStrategy's constructor waits for every peer with no time limit
(TF 2.18: the coordination service logs "Waiting for 1/2 tasks to connect" forever, whatever its
`cluster_register_timeout_in_ms`, and its SIGTERM handler keeps the process alive). So `wait_for_workers` runs
first, with a bound (`HARNESS_WORKER_WAIT_S`, default 120 s), and names the missing worker; before it, a worker
whose own port is taken fails at once (`ClusterConfigError` naming the port and its TF_CONFIG entry).

A peer's address that accepts connections is not proof that the peer is up (another process may hold its port),
and the constructor holds the GIL while it blocks: no Python thread or signal handler of this process runs until
it returns. So the constructor runs under a watchdog process (`_constructor_watchdog`) that, after another
`HARNESS_WORKER_WAIT_S`, prints a `PeerLostError` naming the worker waited for and SIGKILLs this worker (exit 137,
which Kubernetes' training-operator retries: a cluster fault, `harness.exit_codes`); it
also ends this worker when its process group gets SIGTERM or SIGINT (how `harness launch local`, a terminal or a
batch system stops it). Once the strategy is built, the SIGTERM handler TensorFlow installed is replaced by the one
this process had before (by default SIGTERM ends the process), so a stopped worker stops.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Mapping, Optional, Union

import tensorflow as tf

from harness.choices import STRATEGIES
from harness.distribute import environment, proxy
from harness.distribute.context import Backend, WorkerContext
from harness.errors import ClusterConfigError, PeerLostError

log = logging.getLogger(__name__)

AUTO = "auto"
_COMMUNICATION = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def make_strategy(kind: Union[str, Backend] = AUTO, *, num_cpu_replicas: Optional[int] = None,
                  communication: Optional[str] = None, environ: Optional[Mapping[str, str]] = None,
                  worker_wait_s: Optional[float] = None) -> tuple[tf.distribute.Strategy, WorkerContext]:
    """Build the strategy and resolve the worker context, checking that they agree.

    Args:
      kind: `"auto"`, `"single"`, `"mirrored"`, `"multi_worker"`, or a `Backend` (not `HOROVOD`).
      num_cpu_replicas: logical CPU devices for `mirrored` when the host has no GPU (default 1).
      communication: all-reduce for `multi_worker`: `"auto"`, `"ring"` or `"nccl"`; default RING without GPUs,
        NCCL with.
      environ: variables to read instead of `os.environ` (tests).
      worker_wait_s: `multi_worker` only: seconds to wait for every peer to accept connections
        (`wait_for_workers`), then again at most for the strategy constructor to connect them (its watchdog);
        default `HARNESS_WORKER_WAIT_S`, else 120.

    Returns:
      `(strategy, context)`, with `strategy.num_replicas_in_sync == context.replicas_in_sync`.

    Raises:
      ClusterConfigError: if TF_CONFIG or launcher variables are malformed; if this worker's own port (its
        TF_CONFIG entry) is taken by another process; if the CPU cannot be split because
        TensorFlow already initialized its devices; if MultiWorkerMirroredStrategy is built after TensorFlow
        initialized its runtime; if the replicas in sync are not workers x local devices.
      PeerLostError: if a peer of a multi-worker cluster is not reachable within `worker_wait_s` (retryable).
      ClusterConfigError: for an unknown `kind` or `communication`, `HOROVOD`, or `num_cpu_replicas > 1` with a kind
        that cannot use it.
    """
    gpus = len(tf.config.list_physical_devices("GPU"))  # does not initialize the runtime
    config = environment.read_tf_config(environ)
    backend = _resolve_kind(kind, config, gpus, num_cpu_replicas or 1)
    if (num_cpu_replicas or 1) > 1 and (backend is not Backend.MIRRORED or gpus):
        raise ClusterConfigError(f"num_cpu_replicas={num_cpu_replicas} applies to mirrored without GPUs only "
                         f"(kind {backend.value}, {gpus} GPUs)")
    if backend is Backend.SINGLE:
        strategy = tf.distribute.get_strategy()
        if strategy is not _default_strategy():
            raise ClusterConfigError(f"make_strategy('single') called inside the scope of {strategy_name(strategy)}: "
                                     "build the strategy outside any strategy scope")
        context = WorkerContext.single()
    elif backend is Backend.MIRRORED:
        devices = [f"/gpu:{i}" for i in range(gpus)] if gpus else _logical_cpus(num_cpu_replicas or 1)
        # Logical CPUs of one host: reduce on one device. (Collective all-reduce over logical CPUs also works, but
        # several MirroredStrategy objects in one process then collide on collective instance keys.)
        cross_device_ops = None if gpus else tf.distribute.ReductionToOneDevice()
        strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
        context = WorkerContext(0, 1, 0, len(devices), environment.WORKER, 0, Backend.MIRRORED)
    else:
        strategy, context = _multi_worker(config, gpus, communication,
                                          worker_wait_s or environment.read_worker_wait_s(environ))
    if strategy.num_replicas_in_sync != context.replicas_in_sync:
        raise ClusterConfigError(
            f"{strategy_name(strategy)} has {strategy.num_replicas_in_sync} replicas in sync, expected "
            f"{context.num_workers} workers x {context.replicas_per_worker} local devices = "
            f"{context.replicas_in_sync}. TF_CONFIG set after TensorFlow initialized its runtime is the classic "
            f"cause: set it before the process starts")
    log.info("%s: %s", strategy_name(strategy), context)
    return strategy, context


def _default_strategy() -> tf.distribute.Strategy:
    """TensorFlow's default strategy, also inside another strategy's scope (where `get_strategy()` answers that
    one); private in TF 2.18, as is its class."""
    from tensorflow.python.distribute import distribute_lib

    return distribute_lib._get_default_strategy()


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The strategy's public name (`MirroredStrategy`, `MultiWorkerMirroredStrategy`, ...: the `tf.distribute`
    export it is an instance of, whose class may be private), or `default strategy` for TensorFlow's default
    (single device, and every Horovod rank)."""
    if strategy is _default_strategy():
        return "default strategy"
    public = ("OneDeviceStrategy", "MirroredStrategy", "MultiWorkerMirroredStrategy")  # subclasses last
    names = [n for n in public if isinstance(strategy, getattr(tf.distribute, n))]
    return names[-1] if names else type(strategy).__name__


def replica_devices(strategy: tf.distribute.Strategy) -> tuple[str, ...]:
    """This worker's replicas' devices, in replica order (`strategy.extended.worker_devices`); for the default
    strategy, which has no such list, the one device TensorFlow's default placement picks: GPU 0 when the process
    sees a GPU, else the CPU."""
    if strategy is _default_strategy():
        return ("/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0",)
    return tuple(strategy.extended.worker_devices)


def _resolve_kind(kind: Union[str, Backend], config: Optional[environment.TFConfig], gpus: int,
                  cpu_replicas: int) -> Backend:
    if kind == AUTO:
        if config is not None and len(config.tasks()) > 1:
            return Backend.MULTI_WORKER
        return Backend.MIRRORED if gpus > 1 or (not gpus and cpu_replicas > 1) else Backend.SINGLE
    try:
        backend = Backend(kind)
    except ValueError:
        raise ClusterConfigError(f"unknown strategy kind {kind!r}: one of {', '.join(STRATEGIES)}") from None
    if backend is Backend.HOROVOD:
        raise ClusterConfigError("Horovod builds no tf.distribute strategy: use WorkerContext.from_horovod(hvd)")
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
                  worker_wait_s: float) -> tuple[tf.distribute.Strategy, WorkerContext]:
    local_devices = max(gpus, 1)  # MultiWorkerMirrored drives every local GPU, or one CPU
    name = communication or ("nccl" if gpus else "ring")
    if name not in _COMMUNICATION:
        raise ClusterConfigError(f"unknown communication {name!r}: one of {sorted(_COMMUNICATION)}")
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
        off_proxy = proxy.keep_peers_off_proxy(config) if len(config.tasks()) > 1 else None
        if off_proxy:   # before gRPC starts: a proxy for the internet would carry the workers' gRPC and hang them
            print(off_proxy, file=sys.stderr, flush=True)
        if _runtime_started():   # the strategy would fail at once: say so before waiting for the peers
            raise ClusterConfigError(_TOO_LATE.format("TensorFlow's runtime is already initialized"))
        if len(config.tasks()) > 1:
            wait_for_workers(config, timeout_s=worker_wait_s)
    guard = _constructor_watchdog(config, worker_wait_s) if config is not None and len(config.tasks()) > 1 \
        else None
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                            communication_options=options)
    except RuntimeError as e:
        raise ClusterConfigError(_TOO_LATE.format(e)) from e
    finally:
        if guard is not None:
            guard.stdin.close()  # EOF: the watchdog exits
            try:
                guard.wait(5)
            except subprocess.TimeoutExpired:
                guard.kill()
        # TensorFlow's preemption notifier took SIGTERM (it only records it): give it back, so SIGTERM stops us.
        if threading.current_thread() is threading.main_thread():  # signal.signal works there only
            signal.signal(signal.SIGTERM, sigterm if sigterm is not None else signal.SIG_DFL)
    if config is not None and len(config.tasks()) > 1:
        agree_devices(config, gpus, timeout_s=worker_wait_s)
    return strategy, context


DEVICES_KEY = "harness/gpus/{}/{}"   # the coordination service's key of a task's GPU count and host


def agree_devices(config: environment.TFConfig, gpus: int, *, timeout_s: float, publish=None, read=None) -> None:
    """Compare every worker's GPU count before the first collective, through the coordination service's key-value
    store (which MultiWorkerMirroredStrategy starts): this worker publishes `gpus` and its host, then reads each
    other task's, each read waiting at most `timeout_s` seconds.

    MultiWorkerMirroredStrategy runs one replica per local GPU (one per worker without a GPU) and assumes the same
    count on every worker: with 4 GPUs on one and 8 on another, the first collective failed on its group size
    ("Collective Op has group_size 8 ... that group has size 4", tensorflow/tensorflow#47203), after the data was
    read and the model built, and the counts of the plan (global batch, steps) differed between workers.

    Raises:
      ClusterConfigError: naming each worker's host and GPU count (permanent: a retry meets the same hosts).
      PeerLostError: a task's count did not arrive within `timeout_s` (it failed while starting).
    """
    from tensorflow.python.eager import context as eager_context   # the store's only Python API

    publish = publish or eager_context.context().set_config_key_value
    read = read or eager_context.context().get_config_key_value
    me = (config.task_type, config.task_index)
    publish(DEVICES_KEY.format(*me), f"{gpus} {socket.gethostname()}")
    counts = {}
    for task in config.tasks():
        if task == me:
            counts[task] = (gpus, socket.gethostname())
            continue
        try:
            value = read(DEVICES_KEY.format(*task), timeout_in_ms=int(timeout_s * 1000))
        except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
            raise PeerLostError(f"{task[0]} {task[1]} at {config.cluster[task[0]][task[1]]} did not say its GPU "
                                f"count within {timeout_s:g} s ({type(e).__name__}); {environment.WORKER_WAIT} "
                                "sets the wait") from None
        n, _, host = value.partition(" ")
        counts[task] = (int(n), host)
    if len({n for n, _ in counts.values()}) > 1:
        each = ", ".join(f"{t} {i} on {host} {n} GPU{'s' if n != 1 else ''}" for (t, i), (n, host) in counts.items())
        raise ClusterConfigError(
            f"the workers have different numbers of GPUs ({each}): MultiWorkerMirroredStrategy runs one replica "
            "per GPU and needs the same count on every worker (one without a GPU runs one CPU replica); give every "
            "worker the same GPUs (CUDA_VISIBLE_DEVICES, the pods' nvidia.com/gpu limit), or run one process per "
            "GPU with --backend horovod")


# The watchdog process (argv: worker pid, seconds, message). EOF on stdin: the constructor returned (or the worker
# died): exit. No EOF within the bound: print the message and SIGKILL the worker (SIGTERM is swallowed by
# TensorFlow's handler and Python's cannot run while the constructor holds the GIL). SIGTERM or SIGINT to the
# process group: SIGKILL the worker at once.
_WATCHDOG = """
import os, select, signal, sys
pid, bound, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
def stop(*_):
    os.kill(pid, signal.SIGKILL)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
ready, _, _ = select.select([sys.stdin], [], [], bound)
if not ready:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    stop()
"""


def _constructor_watchdog(config: environment.TFConfig, bound_s: float) -> subprocess.Popen:
    """Start the watchdog of the strategy constructor (see the module docstring): after `bound_s` seconds it
    prints a PeerLostError naming the task this one waits for, and SIGKILLs this worker (exit 137: retryable)."""
    tasks = config.tasks()
    me = (config.task_type, config.task_index)
    leader = tasks[0]  # MultiWorkerMirrored's coordination service runs in the first task (chief, else worker 0)
    if me == leader:
        others = ", ".join(f"{t} {i} at {config.cluster[t][i]}" for t, i in tasks if (t, i) != me)
        waiting = (f"{me[0]} {me[1]} (the cluster's leader) waited {bound_s:g} s in MultiWorkerMirroredStrategy "
                   f"for the other workers to register ({others}): one of them failed while starting")
    else:
        address = config.cluster[leader[0]][leader[1]]
        waiting = (f"{me[0]} {me[1]} could not join the cluster within {bound_s:g} s: MultiWorkerMirroredStrategy "
                   f"is still waiting for {leader[0]} {leader[1]} at {address} (the cluster's leader); something "
                   f"accepted connections at that address, but it is not that worker's server: another process "
                   f"holds its port, or the worker failed while starting")
    message = f"harness: {PeerLostError.__name__}: {waiting}; {environment.WORKER_WAIT} sets the wait"
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(bound_s), message],
                            stdin=subprocess.PIPE)


_TOO_LATE = ("MultiWorkerMirroredStrategy failed: {}. TF_CONFIG must be set and the strategy built before any "
             "other TensorFlow op initializes the runtime")


def _runtime_started() -> bool:
    """Whether TensorFlow's eager context exists already (the test `configure_collective_ops` makes)."""
    from tensorflow.python.eager import context as eager_context

    return eager_context.context()._context_handle is not None


WAIT_PROGRESS_S = 15.0   # seconds between the "waiting for worker 1 at host:port, 15 of 120 s" lines


def wait_for_workers(config: environment.TFConfig, *, timeout_s: float, poll_s: float = 0.25,
                     progress_s: float = WAIT_PROGRESS_S) -> None:
    """Return once every other task of `config` accepts TCP connections at its address; fail after `timeout_s`.
    Every `progress_s` seconds of waiting, one line on stderr names the tasks still awaited and the time waited
    (`harness: waiting for worker 1 at host:port, 15 of 120 s (HARNESS_WORKER_WAIT_S)`), so a pod log says why
    nothing happens.

    The peers' gRPC servers only start inside their strategy constructors, which is where they would block on
    us: so while waiting, this task listens on its own port (the kernel completes the peers' connections without
    an accept), and a peer counts as arrived when its address accepts a connection, from this listener or from
    its gRPC server. The listener is closed before the strategy binds the port.

    Raises:
      ClusterConfigError: if this task's own port is taken (naming the port and its TF_CONFIG entry).
      PeerLostError: naming the first task (e.g. "worker 1 at host:port") not reachable after `timeout_s`: a
        fault of the cluster (the peer's pod not scheduled, its image still pulling, its host down), so retryable
        (exit 138; `harness.exit_codes`).
    """
    me = (config.task_type, config.task_index)
    peers = {f"{t} {i}": config.cluster[t][i] for t, i in config.tasks() if (t, i) != me}
    listener = _listen(config)
    start = time.monotonic()
    deadline, report = start + timeout_s, start + progress_s
    try:
        while True:
            peers = {name: address for name, address in peers.items() if not _accepts(address)}
            if not peers:
                return
            if report <= time.monotonic() <= deadline:   # the line says the mark passed: 15, 30, ... s
                print(f"harness: waiting for {', '.join(f'{n} at {a}' for n, a in peers.items())}, "
                      f"{report - start:g} of {timeout_s:g} s ({environment.WORKER_WAIT})", file=sys.stderr,
                      flush=True)
                report += progress_s
            if time.monotonic() > deadline:
                name, address = next(iter(peers.items()))
                raise PeerLostError(
                    f"{name} at {address} not reachable after {timeout_s:g} s"
                    + (f" (nor {', '.join(f'{n} at {a}' for n, a in list(peers.items())[1:])})" if len(peers) > 1
                       else "")
                    + f": it did not start, or the address is wrong; {environment.WORKER_WAIT} sets the wait")
            time.sleep(poll_s)
    finally:
        listener.close()


def _listen(config: environment.TFConfig) -> socket.socket:
    """A listening socket on this task's port (all interfaces, as the gRPC server binds).

    Raises:
      ClusterConfigError: if the port is taken: the strategy's server could not start (TensorFlow would fail
        seconds later with "Could not start gRPC server", and the peers would take the other process for us).
    """
    address = config.cluster[config.task_type][config.task_index]
    port = int(address.rpartition(":")[2])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free for the server
    try:
        sock.bind(("", port))
        sock.listen(64)
    except OSError as e:
        sock.close()
        raise ClusterConfigError(
            f"port {port} of this worker (TF_CONFIG cluster.{config.task_type}[{config.task_index}] = "
            f"{address!r}) is taken ({e.strerror}): another process listens on it; stop it or give this worker "
            "a free port") from None
    return sock


def _accepts(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
        return True
    except OSError:  # refused, unreachable, or a name not resolvable yet (a pod not yet scheduled)
        return False
