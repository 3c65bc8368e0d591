"""The Horovod backend: one process per device, gradients averaged by `hvd.DistributedGradientTape`.

What `harness.train.job` asks of it, in order:
  - `init()`: `hvd.init()`, pin this process's GPU by local rank, and return the default strategy with the
    `WorkerContext` (rank, size, local rank from Horovod; files are then sharded by the global rank).
  - `agree_steps(n)`: every rank computed the same epoch plan from the same record counts; a min all-reduce
    proves it, so no rank can wait in a collective for a step another rank never takes.
  - `broadcast_backup(backup)`: rank 0 alone restores a backup; then every variable the backup holds (model,
    optimizer slots and step counter, loss scale, global step) is broadcast from rank 0 before the first step,
    so all ranks start from rank 0's state whether fresh or resumed.
  - `distributed_tape`, `sum_over_ranks`: what `HorovodBackend` gives the trainer's step.
  - `average_model_state(model)`: at every epoch end and before the final save, the ranks' non-trainable float
    variables (BatchNorm moving statistics, which each rank updates from its own batches) are averaged, as
    tf.distribute aggregates them (sync-on-read, MEAN) when it saves; so every rank holds the same model.
  - `control_plane()`: per-rank statistics to rank 0 and the sharding self-check (mpi4py under mpirun).

Batch semantics are tf.distribute's: a rank is a replica (per-replica batch = per-rank batch, one replica per
worker), so `harness plan --workers N --replicas-per-worker 1` shows a Horovod run's numbers. Each rank divides its
summed loss by its own batch and the tape averages the gradients over ranks: the same update as tf.distribute's
division by the global batch followed by a sum. The learning rate is never scaled with the number of ranks.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from harness.distribute import environment, mpi
from harness.distribute.context import WorkerContext
from harness.distribute.strategy import WAIT_PROGRESS_S
from harness.errors import ClusterConfigError

log = logging.getLogger(__name__)


def _hvd():
    import horovod.tensorflow as hvd  # only a Horovod run needs Horovod installed

    return hvd


def init(*, config=tf.config) -> tuple[tf.distribute.Strategy, WorkerContext]:
    """Initialize Horovod (before any other TensorFlow op) and pin this process's GPU.

    Under an MPI launcher mpi4py initializes MPI first, with MPI_THREAD_MULTIPLE checked
    (`mpi.init_thread_multiple`): Horovod then leaves MPI running when it shuts down (as it does on every rank once
    any rank exits), so the control plane works until the process ends.

    Returns:
      `(default strategy, context)`: every rank runs its step on the default strategy; the context says who it is.
    Raises:
      ClusterConfigError: if this host has GPUs but fewer than local rank + 1 (see `pin_gpu`); under an MPI
        launcher, if MPI grants less than MPI_THREAD_MULTIPLE (before Horovod starts its thread).
    """
    hvd = _hvd()
    if mpi.launched_by_mpi():
        mpi.init_thread_multiple()
    else:
        gloo_interface()
    timeout_s = gloo_timeout()
    with waiting_lines(timeout_s):
        hvd.init()
    context = WorkerContext.from_horovod(hvd)
    pin_gpu(context.local_rank, config=config)
    agree_devices(len(config.list_physical_devices("GPU")), control_plane().allgather)
    log.info("Horovod (%s controller): %s", "MPI" if hvd.mpi_enabled() else "Gloo", context)
    return tf.distribute.get_strategy(), context


@contextlib.contextmanager
def waiting_lines(timeout_s: float, *, every_s: float = WAIT_PROGRESS_S, out=None):
    """While the block runs (`hvd.init()`: Horovod's rendezvous waits for every rank), one line on stderr every
    `every_s` seconds, `harness: rank 0 waits in hvd.init() for the other ranks (Horovod's rendezvous), 15 of 120 s
    (HOROVOD_GLOO_TIMEOUT_SECONDS)`, as the harness's own peer wait says it: a pod log says why nothing happens."""
    import sys
    import threading
    import time

    out = out or sys.stderr
    rank = os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "?"
    done, start = threading.Event(), time.monotonic()

    def say():
        while not done.wait(every_s):
            print(f"harness: rank {rank} waits in hvd.init() for the other ranks (Horovod's rendezvous), "
                  f"{time.monotonic() - start:.0f} of {timeout_s:g} s ({environment.GLOO_TIMEOUT})", file=out,
                  flush=True)
    thread = threading.Thread(target=say, daemon=True, name="harness-hvd-init-wait")
    thread.start()
    try:
        yield
    finally:
        done.set()


def gloo_interface(environ=None, interfaces=None) -> Optional[str]:
    """Give Gloo (and NCCL) an interface this host has, before `hvd.init()` reads `HOROVOD_GLOO_IFACE`.

    horovodrun sets `HOROVOD_GLOO_IFACE` to the first of the interfaces it was given (`--network-interfaces`) or
    found common to every host, and `NCCL_SOCKET_IFNAME` to all of them (horovod/runner/gloo_run.py,
    `create_run_env_vars`: "add multiple ifaces in future"). Where hosts name their links differently, a host
    without that name aborted in Gloo's C++ ("Unable to find address for: enp129s0f1", horovod/horovod#2431) with
    no Python error. `harness launch horovod --network-interface NIC,...` puts every host's names in
    `HARNESS_NETWORK_INTERFACES` (`harness.launch.mpi.horovodrun_command`); here the first of them this host has
    is taken for Gloo, NCCL gets the whole list (it uses the names its host has), and the choice is said.

    Args:
      environ: the environment to read and set (default os.environ).
      interfaces: this host's interface names (default `socket.if_nameindex()`).
    Returns:
      the interface Gloo will use, or None when `HOROVOD_GLOO_IFACE` is not set (Gloo's own choice).
    Raises:
      ClusterConfigError: this host has none of the names, naming them and the host's own.
    """
    env = os.environ if environ is None else environ
    given = env.get("HOROVOD_GLOO_IFACE", "").strip()
    if not given:
        return None
    import socket

    here = [name for _, name in socket.if_nameindex()] if interfaces is None else list(interfaces)
    listed = [n.strip() for n in env.get(environment.NETWORK_INTERFACES, "").split(",") if n.strip()] or [given]
    if len(listed) > 1:
        env["NCCL_SOCKET_IFNAME"] = ",".join(listed)
    usable = [n for n in listed if n in here]
    if not usable:
        others = [n for n in here if n not in ("lo", "docker0")][:1]
        raise ClusterConfigError(
            f"rank {env.get('HOROVOD_RANK', '?')} on {socket.gethostname()}: none of the network interfaces given "
            f"({', '.join(listed)}) is on this host, which has {', '.join(here)}: add this host's name for its link "
            f"(harness launch horovod --network-interface {','.join(listed + others)})")
    if usable[0] != given:
        env["HOROVOD_GLOO_IFACE"] = usable[0]
        log.info("Gloo on %s, this host's name for the link (horovodrun gave %s)", usable[0], given)
    return usable[0]


def agree_devices(gpus: int, allgather) -> None:
    """Every rank on a GPU, or none: the ranks' GPU counts compared over the control plane (`allgather`) after
    `hvd.init()`, before the first collective. A rank on CPU beside ranks on GPUs (a host without GPUs, or with its
    GPUs hidden) reached the first all-reduce with a CPU tensor where the others hold GPU tensors for NCCL.

    Raises:
      ClusterConfigError: naming the ranks and hosts with GPUs and those without (permanent).
    """
    import socket

    everyone = allgather((gpus, socket.gethostname()))
    without = [(r, host) for r, (n, host) in enumerate(everyone) if n == 0]
    if not without or len(without) == len(everyone):
        return

    def ranks(rows):
        hosts = {}
        for r, host in rows:
            hosts.setdefault(host, []).append(str(r))
        return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(rs)} on {h}" for h, rs in hosts.items())
    with_gpus = [(r, host) for r, (n, host) in enumerate(everyone) if n]
    raise ClusterConfigError(
        f"some ranks have no GPU ({ranks(without)}) and the others have ({ranks(with_gpus)}): Horovod runs one "
        "rank per GPU; give every host GPUs, or hide them on every host (CUDA_VISIBLE_DEVICES='') to train on CPU")


def gloo_timeout(environ=None) -> int:
    """Give Gloo's rendezvous and collectives the harness's peer wait: `HOROVOD_GLOO_TIMEOUT_SECONDS` (Horovod's
    default 30 s, horovod/runner/common/util/config_parser.py) set to `HARNESS_WORKER_WAIT_S` (whole seconds,
    rounded up) where it is not set, before `hvd.init()` reads it; so a rank that arrives later than 30 s but
    within the wait does not abort the others. Returns the timeout in effect (seconds).

    Raises:
      ClusterConfigError: if `HARNESS_WORKER_WAIT_S` is not a positive number.
    """
    env = os.environ if environ is None else environ
    if not env.get(environment.GLOO_TIMEOUT, "").strip():
        env[environment.GLOO_TIMEOUT] = str(math.ceil(environment.read_worker_wait_s(env)))
    return int(env[environment.GLOO_TIMEOUT])


def pin_gpu(local_rank: int, *, config=tf.config) -> Optional[str]:
    """Make GPU `local_rank` this process's only visible GPU, with memory growth. No GPU: nothing to pin.

    Returns:
      the pinned device's name, None without GPUs.
    Raises:
      ClusterConfigError: if `local_rank >= ` the visible GPUs (more processes on this host than GPUs).
    """
    gpus = config.list_physical_devices("GPU")
    if not gpus:
        return None
    if local_rank >= len(gpus):
        raise ClusterConfigError(
            f"local rank {local_rank} >= {len(gpus)} visible GPUs on this host: start at most {len(gpus)} "
            f"processes per host (-H host:{len(gpus)}), or hide the GPUs (CUDA_VISIBLE_DEVICES='') to train on CPU")
    gpu = gpus[local_rank]
    config.experimental.set_memory_growth(gpu, True)
    config.set_visible_devices(gpu, "GPU")
    return gpu.name


def agree_steps(steps_per_epoch: int) -> int:
    """Check that every rank planned `steps_per_epoch` (all-reduce min and max). Returns it.

    Raises:
      ClusterConfigError: if the ranks disagree (they listed different files or counted different records), on
        every rank at once, instead of a hang at the last step of the shortest rank.
    """
    hvd = _hvd()
    value = tf.constant(steps_per_epoch, tf.int64)
    low = int(hvd.allreduce(value, op=hvd.Min, name="harness.steps_min"))
    high = int(hvd.allreduce(value, op=hvd.Max, name="harness.steps_max"))
    if low != high:
        raise ClusterConfigError(f"ranks planned different steps per epoch ({low} to {high}; rank {hvd.rank()}: "
                                 f"{steps_per_epoch}): they see different files or record counts")
    return low


def broadcast_backup(backup) -> int:
    """Broadcast every variable of `backup` from rank 0 (which restored it, if there was one). Returns the global
    step all ranks continue from.

    The optimizer must be built first (`optimizer.build(model.trainable_variables)`), so its slots exist here.

    Raises:
      ClusterConfigError: if a rank holds other variables than rank 0 (shapes, dtypes), on every rank.
    """
    hvd = _hvd()
    variables = backup.variables()
    # A broadcast over lists that differ between ranks hangs: compare them first, and fail on every rank.
    # (Shapes and dtypes: Keras' generated names depend on what else a process built before.)
    mine = [(tuple(v.shape), v.dtype.name) for v in variables]
    rank0 = hvd.broadcast_object(mine, root_rank=0, name="harness.backup_variables")
    if mine != rank0:
        diff = next((f"#{i} {variables[i].name}: {a} here, {b} on rank 0"
                     for i, (a, b) in enumerate(zip(mine, rank0)) if a != b),
                    f"{len(mine)} variables here, {len(rank0)} on rank 0")
        raise ClusterConfigError(f"rank {hvd.rank()} built other variables than rank 0 ({diff}); every rank must "
                                 "build the same model and optimizer")
    hvd.broadcast_variables(variables, root_rank=0)
    return int(backup.step.numpy())


def distributed_tape(tape):
    """`hvd.DistributedGradientTape(tape)`: its `gradient` averages the gradients over the ranks
    (horovod.readthedocs.io/en/stable/tensorflow.html)."""
    return _hvd().DistributedGradientTape(tape)


def sum_over_ranks(tensor):
    """`tensor` summed over every rank (`hvd.allreduce(op=hvd.Sum)`, a collective)."""
    hvd = _hvd()
    return hvd.allreduce(tensor, op=hvd.Sum)


def average_model_state(model) -> None:
    """Replace each non-trainable floating-point variable of `model` by its mean over the ranks (collective)."""
    import tensorflow as tf

    hvd = _hvd()
    # the tf.Variable of each: itself (tf-keras), or the one a Keras 3 variable holds (`.value`)
    for i, v in enumerate(v if isinstance(v, tf.Variable) else v.value for v in model.non_trainable_variables):
        if v.dtype.is_floating:
            v.assign(hvd.allreduce(v, op=hvd.Average, name=f"harness.model_state.{i}"))


def epoch_end_sync(model) -> Callable[[int, dict], None]:
    """An `on_epoch_end` callback for `Trainer.fit` that runs `average_model_state` (before the backup)."""
    return lambda epoch, logs: average_model_state(model)


class HorovodControlPlane:
    """`mpi.ControlPlane` over Horovod's object collectives (cloudpickle through a byte broadcast / all-gather):
    Gloo runs have no MPI for mpi4py. Horovod has no gather: it all-gathers and keeps the root's copy."""

    def __init__(self):
        self._hvd = _hvd()
        self.rank, self.size = self._hvd.rank(), self._hvd.size()
        self._calls = 0

    def _name(self, what: str) -> str:
        self._calls += 1  # Horovod matches collectives across ranks by name
        return f"harness.control.{what}.{self._calls}"

    def allgather(self, obj: Any) -> list:
        return list(self._hvd.allgather_object(obj, name=self._name("allgather")))

    def gather(self, obj: Any, root: int = 0) -> Optional[list]:
        everyone = self.allgather(obj)
        return everyone if self.rank == root else None

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._hvd.broadcast_object(obj, root_rank=root, name=self._name("bcast"))


def control_plane() -> mpi.ControlPlane:
    """mpi4py's COMM_WORLD when an MPI launcher started this process, else Horovod's object collectives."""
    if mpi.launched_by_mpi():
        plane = mpi.MPIControlPlane()
        if plane.size == _hvd().size():
            return plane
        log.warning("mpi4py sees %d processes, Horovod %d: using Horovod's collectives", plane.size,
                    _hvd().size())
    return HorovodControlPlane()


def format_ranks(stats: Sequence[dict]) -> str:
    """Rank 0's table of the per-rank statistics gathered after training."""
    lines = [f"{'rank':>4}  {'host':<16} {'files':>5}  {'records':>8}  {'dropped':>8}  {'examples/s':>10}  "
             f"{'input stall':>11}"]
    lines += [f"{s['rank']:>4}  {s['host'][:16]:<16} {len(s['files']):>5}  {s['records']:>8}  {s['dropped']:>8}  "
              f"{s['examples_per_s']:>10.1f}  {100 * s['input_stall_share']:>10.1f}%" for s in stats]
    return "\n".join(lines)
