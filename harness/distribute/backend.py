"""The training backend: what a job asks of tf.distribute or of Horovod, behind one small interface.

After orbit's split of the loop by job (tensorflow/models `orbit/runner.py`, `controller.py`): the job never
branches on the backend; it asks a `TrainingBackend` for
  - `strategy` and `context`: the `tf.distribute.Strategy` the steps run under (the default one under Horovod)
    and this process's `WorkerContext`;
  - `distribute(dataset_fn)`: the per-worker datasets as the strategy wants them;
  - `loss_divisor(plan)`: what a replica divides its summed per-example loss by;
  - `gradient_tape(tape)`, `sum_over_ranks(t)`, `mean_over_ranks(t)`, `ranks_summed`: what the trainer's step asks
    (`harness.train.loop.trainer.Trainer`): the tape that reduces gradients, and sums over the processes that
    `strategy.reduce` does not span (Horovod's ranks);
  - `control_plane()`: object collectives (gather, broadcast) for statistics and self-checks;
  - `agree_steps`, `prepare_restore`, `broadcast_backup`, `epoch_end_callbacks`, `wait_for_chief`,
    `any_over_ranks`: the points where Horovod's ranks must be brought in line, which tf.distribute does by itself;
  - `is_writer`: whether this process writes the backup, the model and the summary (the chief, rank 0).

tf.distribute: each replica divides by the global batch and the optimizer sums the gradients over replicas
(tensorflow.org/tutorials/distribute/custom_training). Horovod: each rank divides by its own batch and
`hvd.DistributedGradientTape` averages over ranks (horovod.readthedocs.io/en/stable/tensorflow.html); the update
is the same.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from harness.choices import BACKENDS
from harness.distribute import environment, mpi
from harness.distribute.context import Backend, WorkerContext
from harness.errors import ClusterConfigError, ConfigError


class TrainingBackend:
    """tf.distribute: MirroredStrategy, MultiWorkerMirroredStrategy or one device (`strategy.make_strategy`).

    Args:
      strategy: the `tf.distribute.Strategy`, built before any other TensorFlow op.
      context: its `WorkerContext` (replicas in sync = strategy.num_replicas_in_sync).
    """

    name = "tf"

    def __init__(self, strategy, context: WorkerContext):
        self.strategy, self.context = strategy, context

    @property
    def is_writer(self) -> bool:
        """The chief alone writes the backup's kept copy, the model and summary.json."""
        return self.context.is_chief

    def say(self, *args, **kwargs) -> None:
        """print() on the writer only: one copy of every job-wide line."""
        if self.is_writer:
            print(*args, **kwargs)

    def scope(self):
        """Where the model and optimizer are built (`strategy.scope()`)."""
        return self.strategy.scope()

    def distribute(self, dataset_fn: Callable):
        """Distributed datasets from `dataset_fn(tf.distribute.InputContext) -> tf.data.Dataset`."""
        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def loss_divisor(self, plan) -> int:
        """Global batch: the optimizer sums the replicas' gradients."""
        return plan.global_batch_size

    ranks_summed = 1
    """Processes a `sum_over_ranks` spans: 1 under tf.distribute, whose `strategy.reduce` already spans every
    worker; the ranks under Horovod."""

    def gradient_tape(self, tape):
        """The tape the step differentiates with: `tape` itself (the optimizer sums over replicas)."""
        return tape

    def sum_over_ranks(self, tensor):
        """`tensor` summed over the processes `strategy.reduce` does not span: itself under tf.distribute."""
        return tensor

    def any_over_ranks(self, flag):
        """bool scalar `flag` or'd over the ranks (the same on every rank; a collective where ranks are summed:
        every rank calls it at the same point, in or outside a tf.function)."""
        if self.ranks_summed == 1:
            return flag
        import tensorflow as tf
        return self.sum_over_ranks(tf.cast(flag, tf.int32)) > 0

    def mean_over_ranks(self, tensor):
        """`sum_over_ranks(tensor) / ranks_summed` (float): the same value on every rank."""
        return self.sum_over_ranks(tensor) / self.ranks_summed if self.ranks_summed > 1 else tensor

    def control_plane(self) -> Optional[mpi.ControlPlane]:
        """Object collectives between workers: none across tf.distribute workers (a single worker gets a local
        one)."""
        return mpi.LocalControlPlane() if self.context.num_workers == 1 else None

    def agree_steps(self, steps_per_epoch: int) -> None:
        """Every worker derived the steps from the same counts (the strategy's collectives would fail loudly)."""

    def describe(self) -> Optional[str]:
        """A line for the log about how replicas are kept in sync, or None."""
        return None

    def gather_ranks(self, mine: dict) -> Optional[list]:
        """Every rank's statistics on rank 0 (None elsewhere, and None under tf.distribute, whose workers share
        no object collective)."""
        return None

    def allgather(self, values: Sequence[float]) -> np.ndarray:
        """Every worker's `values` (the same length on all), float64 `[workers, len(values)]` in rank order, on
        every worker: one collective all-gather over the strategy (`tf.distribute.Strategy.gather`; integers
        below 2**53 are exact). Every worker must call it at the same point."""
        import tensorflow as tf

        from harness.tracing import graph_function

        mine = np.asarray([self.context.rank, *values], np.float64)
        if self.context.num_workers == 1:
            return mine[None, 1:]
        if getattr(self, "_gather_fn", None) is None:
            strategy = self.strategy

            def gather_fn(row):
                per_replica = strategy.run(lambda r: r[None], args=(row,))
                return strategy.gather(per_replica, axis=0)   # one row per replica, workers' replicas in turn
            # One function for every length (reduce_retracing): an eager `gather` builds a function per call, which
            # TF 2.21 warns of as retracing on every multi-worker run. Every worker calls with the same lengths in
            # the same order, so every worker traces alike.
            self._gather_fn = graph_function(gather_fn, reduce_retracing=True)
        rows = self._gather_fn(tf.constant(mine)).numpy()
        by_rank = {int(r[0]): r[1:] for r in rows}
        return np.stack([by_rank[w] for w in range(self.context.num_workers)])

    def mean_over_workers(self, value: float) -> float:
        """The mean of `value` over every worker (every rank under Horovod), the same on all: one `allgather`.
        Every worker must call it at the same point (the controller's auto K: every worker must choose the same)."""
        if self.context.num_workers == 1:
            return float(value)
        return float(np.mean(self.allgather([value])[:, 0]))

    def sum_over_workers(self, values: Sequence[int]) -> np.ndarray:
        """int32 `[n]` `values` summed over every worker, on every worker: one all-reduce of n integers (a
        `strategy.reduce` inside a `tf.function` traced once; every worker must call it at the same point). One
        worker: `values` themselves, no collective. What the preemption check runs after each call of K steps
        (`harness.train.lifecycle.preemption`)."""
        import tensorflow as tf
        from harness.tracing import graph_function

        mine = np.asarray(values, np.int32)
        if self.context.num_workers == 1:
            return mine
        if getattr(self, "_sum_fn", None) is None:
            strategy = self.strategy

            @graph_function
            def sum_fn(v):
                per_replica = strategy.run(tf.identity, args=(v,))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            self._sum_fn = sum_fn
        # each of a worker's replicas contributed its values: divide the sum by the replicas per worker
        return self._sum_fn(tf.constant(mine)).numpy() // self.context.replicas_per_worker

    def prepare_restore(self, model, optimizer) -> None:
        """Nothing: tf.distribute restores on every worker."""

    def broadcast_backup(self, backup, initial_step: int) -> int:
        """The step every worker continues from: the one it restored."""
        return initial_step

    def epoch_end_callbacks(self, model) -> list:
        """Nothing for tf-keras's state (tf.distribute reads on-read variables as their mean when it saves); for a
        model whose replicas keep copies of their own (`_per_replica_copies`: Keras 3's BatchNormalization), an
        `align_model_state` at every epoch end, before the backup and the final save."""
        if model is None or self.strategy.num_replicas_in_sync == 1 or not _per_replica_copies(model):
            return []
        return [lambda epoch, logs: self.align_model_state(model)]

    def wait_for_chief(self) -> None:
        """After the chief's writes at an epoch end: nothing under tf.distribute (its collectives are not timed by
        an inspector that ends the job)."""

    def align_model_state(self, model) -> None:
        """Give every replica the model state that is saved: each on-read variable with MEAN aggregation (a Keras
        BatchNormalization's moving mean and variance, updated by each replica from its own batches) set to its
        mean over all replicas and workers (its read in cross-replica context, an all-reduce); each mirrored float
        variable with aggregation NONE (Keras 3's BatchNormalization statistics: each replica updates its own copy,
        and reading or saving gives replica 0's) set on every replica to the mean of the copies. Called before each
        evaluation, backup and save, so that every replica scores with the statistics of the saved model, not its
        own. Every worker must call it at the same point."""
        import tensorflow as tf

        with self.strategy.scope():
            for v in model.non_trainable_variables:
                if (getattr(v, "synchronization", None) == tf.VariableSynchronization.ON_READ
                        and getattr(v, "aggregation", None) == tf.VariableAggregation.MEAN):
                    v.assign(v.read_value())
        per_replica = _per_replica_copies(model)
        if per_replica and self.strategy.num_replicas_in_sync > 1:
            self.strategy.run(_replica_mean_of(per_replica))



def _per_replica_copies(model) -> list:
    """The `tf.Variable`s of the model's float non-trainable Keras 3 variables with aggregation NONE, which each
    replica updates in its own copy (BatchNormalization's statistics; tf-keras's are on-read variables with MEAN
    aggregation)."""
    import tensorflow as tf

    keras3 = [v.value for v in model.non_trainable_variables if not isinstance(v, tf.Variable)]
    return [v for v in keras3 if v.dtype.is_floating and v.aggregation == tf.VariableAggregation.NONE]


def _replica_mean_of(variables):
    """A function for `strategy.run` that sets each replica's copy of `variables` (mirrored variables with
    aggregation NONE: Keras 3's BatchNormalization statistics, each replica updating its own copy) to their mean
    over every replica and worker (one all-reduce)."""
    import tensorflow as tf

    @tf.function
    def mean():
        means = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN,
                                                                [tf.identity(v) for v in variables])
        for v, m in zip(variables, means):
            v.assign(m)
    return mean


class HorovodBackend(TrainingBackend):
    """Horovod: one process (rank) per device, the default strategy, `hvd.DistributedGradientTape`; rank 0's
    backup broadcast before the first step (`harness.distribute.horovod`)."""

    name = "horovod"

    def __init__(self, strategy, context: WorkerContext):
        super().__init__(strategy, context)
        from harness.distribute import horovod
        self._hvd = horovod
        self._plane = None

    def distribute(self, dataset_fn: Callable):
        """This rank's own pipeline, sharded by its global rank (one replica per rank)."""
        import tensorflow as tf
        c = self.context
        return dataset_fn(tf.distribute.InputContext(c.num_workers, c.rank, c.replicas_in_sync))

    def loss_divisor(self, plan) -> int:
        """Per-rank batch: the tape averages the ranks' gradients."""
        return plan.per_replica_batch_size

    @property
    def ranks_summed(self) -> int:
        return self.context.num_workers

    def gradient_tape(self, tape):
        """`hvd.DistributedGradientTape(tape)`: averages the gradients over the ranks."""
        return self._hvd.distributed_tape(tape)

    def sum_over_ranks(self, tensor):
        """`hvd.allreduce(tensor, op=hvd.Sum)` (a collective: every rank calls it at the same point)."""
        return self._hvd.sum_over_ranks(tensor)

    def control_plane(self) -> mpi.ControlPlane:
        if self._plane is None:
            self._plane = self._hvd.control_plane()
        return self._plane

    def agree_steps(self, steps_per_epoch: int) -> None:
        self._hvd.agree_steps(steps_per_epoch)

    def describe(self) -> str:
        return "Horovod: one replica per rank"

    def gather_ranks(self, mine: dict) -> Optional[list]:
        return self.control_plane().gather(mine, root=0)

    def allgather(self, values: Sequence[float]) -> np.ndarray:
        return np.asarray(self.control_plane().allgather([float(v) for v in values]), np.float64)

    def sum_over_workers(self, values: Sequence[int]) -> np.ndarray:
        """`hvd.allreduce(op=hvd.Sum)` of int32 `values` (see `TrainingBackend.sum_over_workers`)."""
        import tensorflow as tf

        mine = np.asarray(values, np.int32)
        if self.context.num_workers == 1:
            return mine
        return self._hvd.sum_over_ranks(tf.constant(mine)).numpy()

    def prepare_restore(self, model, optimizer) -> None:
        """Build the optimizer's slots before the restore, so the broadcast covers them."""
        optimizer.build(model.trainable_variables)

    def broadcast_backup(self, backup, initial_step: int) -> int:
        return self._hvd.broadcast_backup(backup)

    def epoch_end_callbacks(self, model) -> list:
        return [self._hvd.epoch_end_sync(model)]

    def wait_for_chief(self) -> None:
        """Every rank meets on the control plane (mpi4py's all-gather under an MPI launcher) after the chief's
        epoch-end writes (the backup, the best model, TensorBoard, the user's callbacks), so that no rank waits
        for them inside the next step's Horovod all-reduce: Horovod's stall inspector
        (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, MPI controller) shut the job down when a write lasted longer than
        its bound. Under horovodrun --gloo the plane is Horovod's own collective, which Horovod 0.28.1's Gloo
        controller does not inspect."""
        if self.context.num_workers > 1:
            self.control_plane().allgather(None)

    def align_model_state(self, model) -> None:
        """Each rank's non-trainable state (BatchNormalization statistics) averaged over the ranks."""
        self._hvd.average_model_state(model)


def make_backend(name: str = "tf", *, strategy: str = "auto", cpu_replicas: Optional[int] = None,
                 distribution: Optional[tuple] = None) -> TrainingBackend:
    """Build the backend (before any other TensorFlow op runs).

    Args:
      name: "tf" (tf.distribute) or "horovod".
      strategy, cpu_replicas: the tf.distribute strategy kind and logical CPU replicas (`strategy.make_strategy`).
      distribution: `(strategy, context)` built already (the Python API, tests); its context's backend decides.
    Raises:
      ConfigError: for an unknown name, or strategy options with Horovod.
      ClusterConfigError: from `strategy.make_strategy` / `horovod.init`; for the tf backend in one of several
        processes a launcher started without TF_CONFIG (`refuse_independent_copies`); for a strategy that
        disagrees with TF_CONFIG (`check_environment`).
    """
    if name not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "tf":
        refuse_independent_copies()  # before the strategy, which would start alone
    if distribution is None:
        if name == "horovod":
            from harness.distribute import horovod
            distribution = horovod.init()
        else:
            from harness.distribute.strategy import make_strategy
            distribution = make_strategy(strategy, num_cpu_replicas=cpu_replicas)
    check_environment(distribution[1])
    strat, context = distribution
    if name == "horovod" and context.backend is not Backend.HOROVOD:
        raise ClusterConfigError(f"backend horovod, but the distribution given is {context.backend.value}")
    return (HorovodBackend if context.backend is Backend.HOROVOD else TrainingBackend)(strat, context)


def _launcher_processes(environ: Mapping[str, str]) -> tuple[Optional[str], int]:
    """(launcher, processes it started together with this one): mpirun/MPIJob (OMPI, MV2, PMI), srun; 1 without.

    Under Slurm the batch script itself carries SLURM_NTASKS of the whole allocation: only an `srun` step
    (SLURM_STEP_NUM_TASKS) starts several processes."""
    found = environment.read_launcher(environ)
    if found is None or found.launcher in ("harness", "horovod"):
        return None, 1
    if found.launcher == "slurm":
        return "srun", int(environ.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    return found.launcher, found.size


def refuse_independent_copies(environ: Optional[Mapping[str, str]] = None) -> None:
    """Refuse to run tf.distribute as one of several processes that a launcher started without TF_CONFIG: each
    would build a one-worker strategy, call itself the chief and train (and write) its own copy.

    Raises:
      ClusterConfigError: naming the launcher, this process's rank and size, and both ways out.
    """
    import os
    env = os.environ if environ is None else environ
    launcher, processes = _launcher_processes(env)
    config = environment.read_tf_config(env)
    if processes > 1 and (config is None or len(config.tasks()) <= 1):
        found = environment.read_launcher(env)
        raise ClusterConfigError(
            f"this process is rank {found.rank} of {processes} started by {launcher}, with the tf backend and no "
            f"multi-worker TF_CONFIG: the {processes} processes would train {processes} independent copies, each "
            "its own chief writing the same output. Use --backend horovod (one process per device under "
            "mpirun/srun), or start the workers with TF_CONFIG (harness launch local / k8s --kind tfjob)")


def check_environment(context: WorkerContext, environ: Optional[Mapping[str, str]] = None) -> None:
    """A strategy handed in (the Python API) must agree with the cluster the environment describes: one built
    before TF_CONFIG was set trains alone while TF_CONFIG names several workers.

    Raises:
      ClusterConfigError: naming the strategy's workers and TF_CONFIG's (or the launcher's) count.
    """
    if context.backend is Backend.HOROVOD:
        return
    config = environment.read_tf_config(environ)
    expected = len(config.tasks()) if config is not None else 1
    if context.num_workers != expected:
        raise ClusterConfigError(
            f"the strategy has {context.num_workers} worker(s) ({context.backend.value}) but TF_CONFIG names "
            f"{expected}: build the strategy after TF_CONFIG is set (harness.distribute.strategy.make_strategy), "
            "before any other TensorFlow op")


def check_same_step(backend: TrainingBackend, step: int) -> None:
    """Every worker resumes from the same global step, checked before the restore and the first step (a backup
    only some workers see, a half-written one, an edited output folder), instead of a collective error deep in
    TensorFlow.

    Args:
      step: the step this worker's backup holds (`Backup.latest_step`): 0 for none, -1 for an unreadable backup,
        -2 for a Horovod rank that reads none (rank 0's is broadcast; those ranks are not compared).
    Raises:
      ClusterConfigError: naming every worker and the step it would resume from.
    """
    steps = [int(v) for v in backend.allgather([step])[:, 0]]
    compared = [s for s in steps if s != -2]
    if len(set(compared)) > 1 or -1 in compared:
        each = ", ".join(f"worker {w} at step {s}" if s >= 0 else f"worker {w}: unreadable backup"
                         for w, s in enumerate(steps) if s != -2)
        raise ClusterConfigError(f"workers disagree on the step they resume from ({each}): every worker must see "
                                 "the same backup (put --output on storage all workers share), or use a new --output")


def check_same_weights(backend: TrainingBackend, digest: str) -> list[str]:
    """Every worker ends with the same weights (SHA-256 `digest`, compared by its first 48 bits).

    Returns:
      every worker's 48-bit digest prefix (12 hex digits), in rank order.

    Raises:
      ClusterConfigError: naming the workers (ranks) whose weights differ from rank 0's: the saved model would
        be one rank's guess.
    """
    mine = int(digest[:12], 16)  # 48 bits: exact in float64
    digests = [int(v) for v in backend.allgather([mine])[:, 0]]
    differ = [w for w, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise ClusterConfigError(f"final weights differ between ranks: rank(s) {differ} differ from rank 0 "
                                 f"(sha256 prefixes {[f'{d:012x}' for d in digests]}); the replicas fell out of sync")
    return [f"{d:012x}" for d in digests]
