"""Batch arithmetic: harness/distribute/batch.py."""
import pytest

from harness.distribute.batch import BatchSizes, batch_sizes, dropped_records, steps_per_epoch
from harness.errors import BatchSizeError


def test_global_from_per_replica():
    b = batch_sizes(workers=2, replicas_per_worker=4, per_replica_batch_size=8)
    assert (b.replicas_in_sync, b.per_worker_batch_size, b.global_batch_size) == (8, 32, 64)


def test_per_replica_from_global():
    assert batch_sizes(workers=2, replicas_per_worker=2, global_batch_size=40).per_replica_batch_size == 10


def test_global_not_divisible_names_both_numbers():
    with pytest.raises(BatchSizeError, match=r"global batch size 30 .* 4 replicas"):
        batch_sizes(workers=2, replicas_per_worker=2, global_batch_size=30)


@pytest.mark.parametrize("kwargs", [{}, {"global_batch_size": 8, "per_replica_batch_size": 2},
                                    {"global_batch_size": 0}, {"per_replica_batch_size": -1}])
def test_bad_batch_arguments(kwargs):
    with pytest.raises(BatchSizeError):
        batch_sizes(workers=1, replicas_per_worker=2, **kwargs)


def test_steps_are_the_minimum_over_workers_and_dropped_is_the_rest():
    b = BatchSizes(per_replica_batch_size=4, workers=3, replicas_per_worker=2)
    steps = steps_per_epoch([50, 17, 40], b)
    assert steps == 2
    assert dropped_records([50, 17, 40], steps, b) == (34, 1, 24)


def test_zero_steps_explains_itself():
    b = BatchSizes(per_replica_batch_size=64, workers=3, replicas_per_worker=1)
    with pytest.raises(BatchSizeError, match=r"worker 1 reads 20 records < per-worker batch 64 "
                                             r"\(per-replica batch 64 x 1 replicas per worker\)"):
        steps_per_epoch([100, 20, 64], b)
