"""Who am I in this job: one frozen `WorkerContext`, resolved once and passed to whoever needs it.

After accelerate's `PartialState`: rank, number of workers, local rank, replicas, chief, and helpers such as
`chief_only`. Only `harness.distribute.environment` reads environment variables; other modules ask the context.

Ranks follow MultiWorkerMirroredStrategy: the chief (if the cluster has one) is rank 0, then the workers in
index order; the chief is task type "chief", or worker 0 when there is no chief
(https://www.tensorflow.org/api_docs/python/tf/distribute/MultiWorkerMirroredStrategy).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, Callable, Mapping, Optional, TypeVar

from harness.distribute import environment
from harness.errors import ClusterConfigError

F = TypeVar("F", bound=Callable[..., Any])


class Backend(enum.Enum):
    """How replicas are kept in sync."""

    SINGLE = "single"              # one device, the default tf.distribute strategy
    MIRRORED = "mirrored"          # one worker, several local devices, tf.distribute.MirroredStrategy
    MULTI_WORKER = "multi_worker"  # several workers from TF_CONFIG, tf.distribute.MultiWorkerMirroredStrategy
    HOROVOD = "horovod"            # one process per device, Horovod allreduce


def one_process_per_replica(backend: str) -> bool:
    """Whether `--backend NAME` runs one process per replica, the ranks of an MPI or Gloo job (Horovod), rather than
    one process per worker driving its local replicas (tf.distribute, "tf")."""
    return backend == Backend.HOROVOD.value


@dataclasses.dataclass(frozen=True)
class WorkerContext:
    """This process's place in the job.

    Attributes:
      rank: global worker index, 0-based (0 is the chief).
      num_workers: workers in the job (one input pipeline each).
      local_rank: this worker's index among the workers on its host.
      replicas_per_worker: local replicas (devices) this worker drives.
      task_type: `"chief"` or `"worker"` (launchers and single-worker jobs: `"worker"`).
      task_index: index within `task_type`.
      backend: how replicas are kept in sync.
      local_size: workers on this worker's host (they share its CPUs and memory: `resources`); 1 where the
        source does not say.
    """

    rank: int
    num_workers: int
    local_rank: int
    replicas_per_worker: int
    task_type: str
    task_index: int
    backend: Backend
    local_size: int = 1

    def __post_init__(self):
        if not 0 <= self.rank < self.num_workers:
            raise ClusterConfigError(f"rank {self.rank} out of range for {self.num_workers} workers")
        if self.local_rank < 0 or self.replicas_per_worker < 1:
            raise ClusterConfigError(f"local rank {self.local_rank} must be >= 0 and replicas per worker "
                                     f"{self.replicas_per_worker} >= 1")
        if self.local_size < 1:
            raise ClusterConfigError(f"local size {self.local_size} must be >= 1")
        if self.backend in (Backend.SINGLE, Backend.MIRRORED) and self.num_workers != 1:
            raise ClusterConfigError(f"{self.backend.value} runs one worker, not {self.num_workers}")
        if self.backend in (Backend.SINGLE, Backend.HOROVOD) and self.replicas_per_worker != 1:
            raise ClusterConfigError(f"{self.backend.value} runs one replica per worker, not "
                                     f"{self.replicas_per_worker}")

    @property
    def replicas_in_sync(self) -> int:
        """Replicas over all workers: `num_workers x replicas_per_worker`."""
        return self.num_workers * self.replicas_per_worker

    @property
    def chief_writes_alone(self) -> bool:
        """Whether only the chief saves (backups, models): under Horovod a save holds no collective, so ranks other
        than 0 skip it and their hosts need not see the output folder; under tf.distribute every worker saves (a
        save is a collective) and a non-chief's copy goes to a temporary folder."""
        return self.backend is Backend.HOROVOD

    @property
    def is_chief(self) -> bool:
        """Whether this worker writes checkpoints, summaries and logs."""
        return self.rank == 0

    def chief_only(self, fn: F) -> F:
        """Wrap `fn` so it runs on the chief only; elsewhere the call does nothing and returns None."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs) if self.is_chief else None
        return wrapper  # type: ignore[return-value]

    def __str__(self) -> str:
        return (f"rank {self.rank}/{self.num_workers} ({self.task_type}:{self.task_index}, local rank "
                f"{self.local_rank}{', chief' if self.is_chief else ''}), {self.replicas_in_sync} replicas in sync "
                f"({self.backend.value})")

    # --- constructors, one per source -----------------------------------------------------------------------------
    @classmethod
    def single(cls, *, replicas_per_worker: int = 1) -> "WorkerContext":
        """A one-worker job on one device (`SINGLE`) or several (`MIRRORED`)."""
        backend = Backend.MIRRORED if replicas_per_worker > 1 else Backend.SINGLE
        return cls(0, 1, 0, replicas_per_worker, environment.WORKER, 0, backend)

    @classmethod
    def from_input_context(cls, input_context, *, local_rank: int = 0) -> "WorkerContext":
        """From the `tf.distribute.InputContext` a strategy passes to a dataset function.

        The input pipeline id is the rank; InputContext does not know the host, so `local_rank` is given.
        """
        workers = input_context.num_input_pipelines
        replicas, rem = divmod(input_context.num_replicas_in_sync, workers)
        if rem:
            raise ClusterConfigError(f"{input_context.num_replicas_in_sync} replicas in sync do not divide among "
                                     f"{workers} input pipelines")
        backend = (Backend.MULTI_WORKER if workers > 1 else Backend.MIRRORED if replicas > 1 else Backend.SINGLE)
        rank = input_context.input_pipeline_id
        return cls(rank, workers, local_rank, replicas, environment.WORKER, rank, backend)

    @classmethod
    def from_tf_config(cls, config: environment.TFConfig, *, replicas_per_worker: int = 1) -> "WorkerContext":
        """From a validated TF_CONFIG. The local rank counts earlier tasks on the same host."""
        tasks = config.tasks()
        rank = tasks.index((config.task_type, config.task_index))
        hosts = [config.cluster[t][i].rsplit(":", 1)[0] for t, i in tasks]
        local_rank = hosts[:rank].count(hosts[rank])
        return cls(rank, len(tasks), local_rank, replicas_per_worker, config.task_type, config.task_index,
                   Backend.MULTI_WORKER, local_size=hosts.count(hosts[rank]))

    @classmethod
    def from_launcher(cls, env: environment.LauncherEnv, *, backend: Backend = Backend.HOROVOD,
                      replicas_per_worker: int = 1) -> "WorkerContext":
        """From launcher variables (mpirun, srun, horovodrun, ...). Local rank 0 and local size 1 when the
        launcher sets none."""
        return cls(env.rank, env.size, env.local_rank or 0, replicas_per_worker, environment.WORKER, env.rank,
                   backend, local_size=env.local_size or 1)

    @classmethod
    def from_horovod(cls, hvd) -> "WorkerContext":
        """From an initialized Horovod module (`horovod.tensorflow` or `horovod.tensorflow.keras`).

        Only `hvd.rank()`, `hvd.size()`, `hvd.local_rank()` and `hvd.local_size()` (where there is one) are
        called; one replica per process.
        """
        rank = hvd.rank()
        local_size = hvd.local_size() if hasattr(hvd, "local_size") else 1
        return cls(rank, hvd.size(), hvd.local_rank(), 1, environment.WORKER, rank, Backend.HOROVOD,
                   local_size=local_size)

    @classmethod
    def from_environment(cls, environ: Optional[Mapping[str, str]] = None, *,
                         replicas_per_worker: int = 1) -> "WorkerContext":
        """From TF_CONFIG, else launcher variables, else a single worker (precedence: `environment`).

        A multi-worker job from launcher variables (no TF_CONFIG) is taken to be Horovod: MultiWorkerMirrored
        needs TF_CONFIG.

        Raises:
          ClusterConfigError: if TF_CONFIG or a launcher variable is malformed.
        """
        config = environment.read_tf_config(environ)
        if config is not None:
            return cls.from_tf_config(config, replicas_per_worker=replicas_per_worker)
        launcher = environment.read_launcher(environ)
        if launcher is not None and launcher.size > 1:
            return cls.from_launcher(launcher, replicas_per_worker=replicas_per_worker)
        return cls.single(replicas_per_worker=replicas_per_worker)
