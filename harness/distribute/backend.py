"""The training backend: what a job asks of tf.distribute or of Horovod, behind one small interface.

After orbit's split of the loop by job (../shared/STYLE.md): the job never branches on the backend; it asks a
`TrainingBackend` for
  - `strategy` and `context`: the `tf.distribute.Strategy` the steps run under (the default one under Horovod)
    and this process's `WorkerContext`;
  - `distribute(dataset_fn)`: the per-worker datasets as the strategy wants them;
  - `loss_divisor(plan)`: what a replica divides its summed per-example loss by;
  - `trainer_kwargs()`: the training loop's seams (gradient tape, cross-rank sum);
  - `control_plane()`: object collectives (gather, broadcast) for statistics and self-checks;
  - `agree_steps`, `prepare_restore`, `broadcast_backup`, `epoch_end_callbacks`: the points where Horovod's ranks
    must be brought in line, which tf.distribute does by itself;
  - `is_writer`: whether this process writes the backup, the model and the summary (the chief, rank 0).

tf.distribute: each replica divides by the global batch and the optimizer sums the gradients over replicas
(tensorflow.org/tutorials/distribute/custom_training). Horovod: each rank divides by its own batch and
`hvd.DistributedGradientTape` averages over ranks (horovod.readthedocs.io/en/stable/tensorflow.html); the update
is the same.
"""
from __future__ import annotations

from typing import Callable, Optional

from harness.distribute import mpi
from harness.distribute.context import Backend, WorkerContext
from harness.errors import ClusterConfigError, ConfigError

BACKENDS = ("tf", "horovod")  # tf.distribute strategies; Horovod (one process per device)


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

    def trainer_kwargs(self) -> dict:
        """No seams: `strategy.reduce` already spans every worker."""
        return {}

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

    def prepare_restore(self, model, optimizer) -> None:
        """Nothing: tf.distribute restores on every worker."""

    def broadcast_backup(self, backup, initial_step: int) -> int:
        """The step every worker continues from: the one it restored."""
        return initial_step

    def epoch_end_callbacks(self, model) -> list:
        """Nothing to align: tf.distribute aggregates non-trainable state when it saves."""
        return []


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

    def trainer_kwargs(self) -> dict:
        return self._hvd.trainer_kwargs()

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

    def prepare_restore(self, model, optimizer) -> None:
        """Build the optimizer's slots before the restore, so the broadcast covers them."""
        optimizer.build(model.trainable_variables)

    def broadcast_backup(self, backup, initial_step: int) -> int:
        return self._hvd.broadcast_backup(backup)

    def epoch_end_callbacks(self, model) -> list:
        return [self._hvd.epoch_end_sync(model)]


def make_backend(name: str = "tf", *, strategy: str = "auto", cpu_replicas: Optional[int] = None,
                 distribution: Optional[tuple] = None) -> TrainingBackend:
    """Build the backend (before any other TensorFlow op runs).

    Args:
      name: "tf" (tf.distribute) or "horovod".
      strategy, cpu_replicas: the tf.distribute strategy kind and logical CPU replicas (`strategy.make_strategy`).
      distribution: `(strategy, context)` built already (the Python API, tests); its context's backend decides.
    Raises:
      ConfigError: for an unknown name, or strategy options with Horovod.
      ClusterConfigError: from `strategy.make_strategy` / `horovod.init`.
    """
    if name not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {name!r}")
    if distribution is None:
        if name == "horovod":
            from harness.distribute import horovod
            distribution = horovod.init()
        else:
            from harness.distribute.strategy import make_strategy
            distribution = make_strategy(strategy, num_cpu_replicas=cpu_replicas)
    strat, context = distribution
    if name == "horovod" and context.backend is not Backend.HOROVOD:
        raise ClusterConfigError(f"backend horovod, but the distribution given is {context.backend.value}")
    return (HorovodBackend if context.backend is Backend.HOROVOD else TrainingBackend)(strat, context)
