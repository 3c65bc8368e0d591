"""The training backend (harness/distribute/backend.py): tf.distribute's answers in-process; Horovod's are
exercised by real ranks in test_horovod_backend.py."""
import pytest

from harness.distribute import mpi
from harness.distribute.backend import HorovodBackend, TrainingBackend, make_backend
from harness.distribute.plan import make_plan
from harness.errors import ClusterConfigError, ConfigError


@pytest.fixture(scope="module")
def mirrored():
    from harness.distribute.strategy import make_strategy
    return make_strategy("mirrored", num_cpu_replicas=2)


def test_tf_backend_answers(mirrored):
    backend = make_backend("tf", distribution=mirrored)
    assert type(backend) is TrainingBackend and backend.is_writer and backend.context.replicas_in_sync == 2
    plan = make_plan([("a", 100)], workers=1, replicas_per_worker=2, per_replica_batch_size=8)
    assert backend.loss_divisor(plan) == 16  # the global batch: the optimizer sums the replicas' gradients
    assert backend.trainer_kwargs() == {} and backend.epoch_end_callbacks(None) == []
    assert isinstance(backend.control_plane(), mpi.LocalControlPlane)  # one worker: local collectives
    assert backend.gather_ranks({"rank": 0}) is None and backend.describe() is None
    assert backend.broadcast_backup(None, 40) == 40


def test_distributed_dataset_from_the_function(mirrored):
    import tensorflow as tf

    backend = make_backend("tf", distribution=mirrored)
    seen = []

    def fn(ctx):
        seen.append((ctx.input_pipeline_id, ctx.num_input_pipelines))
        return tf.data.Dataset.range(8).batch(2)

    batch = next(iter(backend.distribute(fn)))
    assert seen == [(0, 1)] and len(backend.strategy.experimental_local_results(batch)) == 2


def test_horovod_loss_divisor_is_the_per_rank_batch():
    plan = make_plan([("a", 100), ("b", 100)], workers=2, replicas_per_worker=1, per_replica_batch_size=8)
    backend = HorovodBackend.__new__(HorovodBackend)  # no hvd.init() in the test process
    assert backend.loss_divisor(plan) == 8 and plan.global_batch_size == 16


def test_refusals(mirrored):
    with pytest.raises(ConfigError, match="backend must be one of"):
        make_backend("mpi", distribution=mirrored)
    with pytest.raises(ClusterConfigError, match="backend horovod, but the distribution given is mirrored"):
        make_backend("horovod", distribution=mirrored)
