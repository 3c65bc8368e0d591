"""The one module that reads launcher environment variables. Everything else asks `WorkerContext`.

Sources, in order of precedence (the first one present wins):

1. `TF_CONFIG`: the cluster and this task, as tf.distribute reads it
   (https://www.tensorflow.org/guide/distributed_training#setting_up_the_tf_config_environment_variable,
   https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras). MultiWorkerMirroredStrategy builds
   its cluster from it, so when it is set it is the truth. Kubeflow's TFJob operator writes it in each pod.
   Without it, a Kubernetes Indexed Job (`harness launch k8s --kind indexed-job`) implies one:
   `JOB_COMPLETION_INDEX` (set by Kubernetes) plus `HARNESS_K8S_SERVICE`, `HARNESS_K8S_JOB`,
   `HARNESS_NUM_WORKERS`, `HARNESS_PORT` (set by the manifest) give worker i at `<job>-<i>.<service>:<port>`
   (see `indexed_job_tf_config`).
2. Launcher variables, one row of `LAUNCHERS` each (after accelerate's `utils/environment.py`): the generic
   `HARNESS_*` seam for any other launcher, then Horovod, Open MPI, MVAPICH2, PMI (MPICH / Intel MPI hydra),
   Slurm. MPI rows come before Slurm because `mpirun` inside an allocation leaves the allocation's Slurm
   variables in place while its own are per process.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Optional

from harness import ports
from harness.errors import ClusterConfigError

TF_CONFIG = "TF_CONFIG"
CHIEF = "chief"
WORKER = "worker"
# Task types that train, in the order MultiWorkerMirroredStrategy numbers them (chief first, then workers).
TRAINING_TASK_TYPES = (CHIEF, WORKER)


@dataclasses.dataclass(frozen=True)
class Launcher:
    """The variables one launcher sets in each process. `None`: the launcher has no such variable."""

    name: str
    rank: str
    size: str
    local_rank: Optional[str]
    local_size: Optional[str]


LAUNCHERS: tuple[Launcher, ...] = (
    Launcher("harness", "HARNESS_RANK", "HARNESS_NUM_WORKERS", "HARNESS_LOCAL_RANK", "HARNESS_LOCAL_SIZE"),
    Launcher("horovod", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    Launcher("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE"),
    Launcher("mvapich2", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
             "MV2_COMM_WORLD_LOCAL_SIZE"),
    Launcher("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    # SLURM_TASKS_PER_NODE is a compressed list ("2(x3),1"), not a number: the local size is left unknown.
    Launcher("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
)


@dataclasses.dataclass(frozen=True)
class LauncherEnv:
    """What one launcher's variables say about this process (local values `None` when not set)."""

    launcher: str
    rank: int
    size: int
    local_rank: Optional[int]
    local_size: Optional[int]


@dataclasses.dataclass(frozen=True)
class TFConfig:
    """A validated `TF_CONFIG`.

    Attributes:
      cluster: task type -> addresses (`"host:port"`), only `"chief"` and `"worker"`.
      task_type: this task's type, `"chief"` or `"worker"`.
      task_index: this task's index within its type.
    """

    cluster: Mapping[str, tuple[str, ...]]
    task_type: str
    task_index: int

    def tasks(self) -> list[tuple[str, int]]:
        """All training tasks in rank order: the chief (if any), then the workers."""
        return [(t, i) for t in TRAINING_TASK_TYPES for i in range(len(self.cluster.get(t, ())))]


def _environ(environ: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def read_tf_config(environ: Optional[Mapping[str, str]] = None) -> Optional[TFConfig]:
    """Parse and validate `TF_CONFIG`; when it is unset or empty, the one a Kubernetes Indexed Job implies
    (`indexed_job_tf_config`), else `None`.

    Raises:
      ClusterConfigError: if it is not a JSON object, has no `cluster`, names a task type other than chief and
        worker (parameter servers and evaluators are not supported), has more than one chief, or its `task` type
        is not in the cluster or its index is out of range.
    """
    env = _environ(environ)
    raw = env.get(TF_CONFIG, "").strip()
    if not raw:
        return indexed_job_tf_config(env)
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ClusterConfigError(f"TF_CONFIG is not valid JSON ({e}): {raw!r}") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict) or not config["cluster"]:
        raise ClusterConfigError(f'TF_CONFIG has no "cluster" object: {raw!r}')
    cluster = {}
    for task_type, addresses in config["cluster"].items():
        if task_type not in TRAINING_TASK_TYPES:
            raise ClusterConfigError(f'TF_CONFIG cluster has task type "{task_type}": only "chief" and "worker" '
                                     f"are supported (MultiWorkerMirroredStrategy)")
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise ClusterConfigError(f'TF_CONFIG cluster "{task_type}" must be a list of "host:port" strings')
        cluster[task_type] = tuple(addresses)
    if len(cluster.get(CHIEF, ())) > 1:
        raise ClusterConfigError(f"TF_CONFIG cluster has {len(cluster[CHIEF])} chiefs; at most one is allowed")
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ClusterConfigError(f'TF_CONFIG has no "task": {{"type": ..., "index": ...}}: {raw!r}')
    task_type, task_index = task["type"], task["index"]
    if task_type not in cluster:
        raise ClusterConfigError(f'TF_CONFIG task type "{task_type}" is not in the cluster '
                                 f"(task types: {sorted(cluster)})")
    if type(task_index) is not int or not 0 <= task_index < len(cluster[task_type]):
        raise ClusterConfigError(f'TF_CONFIG task index {task_index!r} is out of range: the cluster has '
                                 f'{len(cluster[task_type])} "{task_type}" tasks')
    return TFConfig(cluster=cluster, task_type=task_type, task_index=task_index)


# A Kubernetes Indexed Job: the index Kubernetes sets, and the variables `harness launch k8s` writes.
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
K8S_SERVICE = "HARNESS_K8S_SERVICE"
K8S_JOB = "HARNESS_K8S_JOB"
NUM_WORKERS = "HARNESS_NUM_WORKERS"
PORT = "HARNESS_PORT"
# Optional "host:port,..." (one per index) in place of the DNS names, for clusters that need other addresses
# (host networking) and for tests on one machine.
WORKER_ADDRESSES = "HARNESS_WORKER_ADDRESSES"
DEFAULT_PORT = ports.TF_SERVER_PORT


def indexed_job_tf_config(environ: Optional[Mapping[str, str]] = None) -> Optional[TFConfig]:
    """The TF_CONFIG of pod `JOB_COMPLETION_INDEX` of an Indexed Job behind a headless Service; `None` unless both
    `JOB_COMPLETION_INDEX` and `HARNESS_K8S_SERVICE` are set.

    Pod i of Job `<job>` with `subdomain: <service>` is reachable at `<job>-<i>.<service>` (Kubernetes: "Indexed
    Job for parallel processing with static work assignment", "Job with pod-to-pod communication"), so worker i
    is `<job>-<i>.<service>:<port>`, or the i-th entry of `HARNESS_WORKER_ADDRESSES` when that is set.

    Raises:
      ClusterConfigError: if `HARNESS_K8S_JOB` or `HARNESS_NUM_WORKERS` is missing, a value is not an integer,
        the index is out of range, or `HARNESS_WORKER_ADDRESSES` does not list one address per worker.
    """
    env = _environ(environ)
    if JOB_COMPLETION_INDEX not in env or not env.get(K8S_SERVICE):
        return None
    for name in (K8S_JOB, NUM_WORKERS):
        if not env.get(name):
            raise ClusterConfigError(f"{name} is not set: an Indexed Job pod ({JOB_COMPLETION_INDEX}="
                                     f"{env[JOB_COMPLETION_INDEX]}, {K8S_SERVICE}={env[K8S_SERVICE]}) needs it to "
                                     f"build TF_CONFIG (harness launch k8s --kind indexed-job sets it)")
    index, workers = _int(env, JOB_COMPLETION_INDEX), _int(env, NUM_WORKERS)
    port = _int(env, PORT) if env.get(PORT) else DEFAULT_PORT
    if not 0 <= index < workers:
        raise ClusterConfigError(f"{JOB_COMPLETION_INDEX}={index} is out of range for {NUM_WORKERS}={workers}")
    if env.get(WORKER_ADDRESSES):
        addresses = tuple(a.strip() for a in env[WORKER_ADDRESSES].split(","))
        if len(addresses) != workers or not all(a.rpartition(":")[0] for a in addresses):
            raise ClusterConfigError(f"{WORKER_ADDRESSES}={env[WORKER_ADDRESSES]!r} must list {workers} "
                                     f'"host:port" addresses ({NUM_WORKERS}={workers})')
    else:
        addresses = tuple(f"{env[K8S_JOB]}-{i}.{env[K8S_SERVICE]}:{port}" for i in range(workers))
    return TFConfig(cluster={WORKER: addresses}, task_type=WORKER, task_index=index)


# Where fetched and converted data is kept (`harness.data.export.index.cache_dir`), and the seconds a gs:// read may
# take before it is named stuck (`harness.data.export.gcs`).
CACHE_DIR = "HARNESS_CACHE_DIR"
GCS_PROBE = "HARNESS_GCS_PROBE_S"


# Seconds a worker waits for its peers to arrive before failing with a named error (see strategy.wait_for_workers).
WORKER_WAIT = "HARNESS_WORKER_WAIT_S"
DEFAULT_WORKER_WAIT_S = 120.0
K8S_WORKER_WAIT_S = 900.0   # on a cluster, scheduling and image pulls take minutes (`harness launch k8s` sets it)


# Seconds a running worker tolerates without step progress (a peer lost, a worker stuck) before it ends the run
# with a named ClusterFault (harness.train.lifecycle.watchdog); a TensorFlow error naming a lost peer ends it at once.
PEER_TIMEOUT = "HARNESS_PEER_TIMEOUT_S"
DEFAULT_PEER_TIMEOUT_S = 60.0
# Horovod's Gloo rendezvous and collectives time out after this (Horovod's default 30 s); the harness sets it to
# the worker wait where it is not set, so one setting bounds the wait for a late peer (harness.distribute.horovod).
GLOO_TIMEOUT = "HOROVOD_GLOO_TIMEOUT_SECONDS"
# Every host's names for its link (`harness launch horovod --network-interface`): each rank gives Gloo the one its
# host has (`harness.distribute.horovod.gloo_interface`).
NETWORK_INTERFACES = "HARNESS_NETWORK_INTERFACES"


# Attempts a run may start from the same backup step (a restarted pod, a re-run) before a retryable fault is made
# permanent (harness.train.lifecycle.attempts): restartPolicy ExitCode recreates a 137/138 pod without end.
MAX_ATTEMPTS = "HARNESS_MAX_ATTEMPTS"
DEFAULT_MAX_ATTEMPTS = 5


def read_max_attempts(environ: Optional[Mapping[str, str]] = None) -> int:
    """`HARNESS_MAX_ATTEMPTS` (default 5): how many attempts may start from the same backup step before a
    retryable exit becomes permanent (`harness.train.lifecycle.attempts`).

    Raises:
      ClusterConfigError: if it is not a positive integer.
    """
    raw = _environ(environ).get(MAX_ATTEMPTS, "").strip()
    if not raw:
        return DEFAULT_MAX_ATTEMPTS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ClusterConfigError(f"{MAX_ATTEMPTS}={raw!r} must be a positive whole number of attempts")
    return value


def read_worker_wait_s(environ: Optional[Mapping[str, str]] = None) -> float:
    """`HARNESS_WORKER_WAIT_S` (default 120 s): how long a worker waits for a late peer, in the harness's own wait
    (`harness.distribute.strategy.wait_for_workers`), in MultiWorkerMirroredStrategy's constructor (its
    watchdog) and in Horovod's Gloo rendezvous (`HOROVOD_GLOO_TIMEOUT_SECONDS`, set from it where unset).

    Raises:
      ClusterConfigError: if it is not a positive number.
    """
    return _seconds(environ, WORKER_WAIT, DEFAULT_WORKER_WAIT_S)


def read_peer_timeout_s(environ: Optional[Mapping[str, str]] = None) -> float:
    """`HARNESS_PEER_TIMEOUT_S` (default 60 s): the most seconds a running worker waits without step progress
    before it ends the run naming the lost or stuck peer (`harness.train.lifecycle.watchdog`).

    Raises:
      ClusterConfigError: if it is not a positive number.
    """
    return _seconds(environ, PEER_TIMEOUT, DEFAULT_PEER_TIMEOUT_S)


def _seconds(environ: Optional[Mapping[str, str]], name: str, default: float) -> float:
    raw = _environ(environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ClusterConfigError(f"{name}={raw!r} must be a positive number of seconds")
    return value


def _int(environ: Mapping[str, str], name: Optional[str]) -> Optional[int]:
    if name is None or name not in environ:
        return None
    try:
        return int(environ[name])
    except ValueError:
        raise ClusterConfigError(f"{name}={environ[name]!r} is not an integer") from None


def read_launcher(environ: Optional[Mapping[str, str]] = None) -> Optional[LauncherEnv]:
    """The first launcher in `LAUNCHERS` whose rank and size variables are both set; `None` if none is.

    Raises:
      ClusterConfigError: if a value is not an integer or the rank is out of `[0, size)`.
    """
    env = _environ(environ)
    for launcher in LAUNCHERS:
        if launcher.rank in env and launcher.size in env:
            found = LauncherEnv(launcher.name, _int(env, launcher.rank), _int(env, launcher.size),
                                _int(env, launcher.local_rank), _int(env, launcher.local_size))
            if not 0 <= found.rank < found.size:
                raise ClusterConfigError(f"{launcher.rank}={found.rank} is out of range for "
                                         f"{launcher.size}={found.size}")
            return found
    return None
