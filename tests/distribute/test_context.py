"""The worker context: harness/distribute/context.py (the variables it reads: test_environment.py)."""
import json
import types

import pytest

from harness.distribute.context import Backend, WorkerContext
from harness.distribute.environment import read_launcher
from harness.errors import ClusterConfigError

WORKERS = ["host-a:2222", "host-a:2223", "host-b:2222"]


def tf_config(cluster, task_type, index) -> dict:
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}


def test_tf_config_workers_only_worker_0_is_chief():
    contexts = [WorkerContext.from_environment(tf_config({"worker": WORKERS}, "worker", i)) for i in range(3)]
    assert [c.rank for c in contexts] == [0, 1, 2]
    assert [c.is_chief for c in contexts] == [True, False, False]
    assert [c.local_rank for c in contexts] == [0, 1, 0]  # two tasks on host-a, one on host-b
    assert {(c.num_workers, c.backend) for c in contexts} == {(3, Backend.MULTI_WORKER)}


def test_tf_config_with_chief_chief_is_rank_0():
    cluster = {"chief": ["host-c:2222"], "worker": WORKERS[:2]}
    chief = WorkerContext.from_environment(tf_config(cluster, "chief", 0), replicas_per_worker=4)
    worker0 = WorkerContext.from_environment(tf_config(cluster, "worker", 0), replicas_per_worker=4)
    assert (chief.rank, chief.is_chief, chief.task_type, chief.num_workers) == (0, True, "chief", 3)
    assert (worker0.rank, worker0.is_chief, worker0.task_index) == (1, False, 0)
    assert worker0.replicas_in_sync == 12


def test_mpi_wins_over_slurm_and_tf_config_wins_over_launchers():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    assert read_launcher(env).launcher == "openmpi"
    ctx = WorkerContext.from_environment(env)
    assert (ctx.rank, ctx.num_workers, ctx.backend, ctx.is_chief) == (1, 2, Backend.HOROVOD, False)
    ctx = WorkerContext.from_environment({**env, **tf_config({"worker": WORKERS}, "worker", 2)})
    assert (ctx.rank, ctx.num_workers, ctx.backend) == (2, 3, Backend.MULTI_WORKER)


def test_nothing_set_is_a_single_worker():
    assert WorkerContext.from_environment({}) == WorkerContext.single()
    ctx = WorkerContext.from_environment({}, replicas_per_worker=2)
    assert (ctx.backend, ctx.replicas_in_sync, ctx.is_chief) == (Backend.MIRRORED, 2, True)


def test_from_input_context():
    import tensorflow as tf
    ctx = WorkerContext.from_input_context(tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                                                      num_replicas_in_sync=8))
    assert (ctx.rank, ctx.num_workers, ctx.replicas_per_worker, ctx.is_chief) == (1, 2, 4, False)
    assert ctx.backend is Backend.MULTI_WORKER


def test_from_horovod_seam():
    hvd = types.SimpleNamespace(rank=lambda: 3, size=lambda: 4, local_rank=lambda: 1)
    ctx = WorkerContext.from_horovod(hvd)
    assert (ctx.rank, ctx.num_workers, ctx.local_rank, ctx.replicas_in_sync) == (3, 4, 1, 4)
    assert ctx.backend is Backend.HOROVOD and not ctx.is_chief


def test_chief_only():
    calls = []
    chief, worker = (WorkerContext.from_environment(tf_config({"worker": WORKERS}, "worker", i)) for i in (0, 1))
    assert chief.chief_only(calls.append)("saved") is None and calls == ["saved"]
    worker.chief_only(calls.append)("twice")
    assert calls == ["saved"]


@pytest.mark.parametrize("kwargs", [
    dict(rank=2, num_workers=2, backend=Backend.MULTI_WORKER),
    dict(rank=0, num_workers=2, backend=Backend.MIRRORED),
    dict(rank=0, num_workers=1, replicas_per_worker=2, backend=Backend.SINGLE),
])
def test_inconsistent_context(kwargs):
    fields = dict(local_rank=0, replicas_per_worker=1, task_type="worker", task_index=0) | kwargs
    with pytest.raises(ClusterConfigError):
        WorkerContext(**fields)
