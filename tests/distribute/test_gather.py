"""harness/distribute/gather.py: what one worker gathers, and how the tf.distribute all-gather's rows are unpacked
(one part per worker, padding removed), through a strategy seam: no test here gathers across processes."""
import numpy as np
import pytest
import tensorflow as tf

from harness.distribute.context import Backend, WorkerContext
from harness.distribute import gather


def test_one_worker_gathers_its_own_part():
    part = {"rank": 0, "steps": [1, 2]}
    gathered = gather.gather_to_chief(part, context=WorkerContext.single())
    assert gathered == [part] and gathered[0] is part


def test_multi_worker_without_a_strategy_is_refused():
    context = WorkerContext(rank=0, num_workers=2, local_rank=0, replicas_per_worker=1, task_type="worker",
                            task_index=0, backend=Backend.MULTI_WORKER)
    with pytest.raises(ValueError, match="needs the strategy"):
        gather.gather_to_chief({}, context=context)


class _TwoWorkersOfTwoReplicas:
    """A strategy seam for `_gather_collective`: `run` all-gathers this worker's value (from the replica function)
    with the other worker's, each sent by both of a worker's replicas, rank 0 first, as MultiWorkerMirrored does."""

    def __init__(self, other_part):
        self.other = gather._encode(other_part)

    def run(self, fn):
        mine = fn()
        if mine.shape.rank == 1:  # the lengths
            theirs = tf.constant([len(self.other)], tf.int32)
        else:  # the rows, padded to the longest
            theirs = tf.constant(np.pad(self.other, (0, mine.shape[1] - len(self.other)))[None], tf.int32)
        return tf.concat([mine, mine, theirs, theirs], axis=0)

    def experimental_local_results(self, out):
        return (out,)


def test_collective_gather_unpacks_one_part_per_worker_in_rank_order():
    """Parts whose JSON is not whole int32 words, of different lengths (the shorter one padded), non-ASCII text."""
    part = {"rank": 0, "host": "hôte", "steps": [{"input_wait_s": 0.125, "warmup": True}], "odd": "abcde"}
    other = {"rank": 1, "steps": []}
    context = WorkerContext(rank=0, num_workers=2, local_rank=0, replicas_per_worker=2, task_type="worker",
                            task_index=0, backend=Backend.MULTI_WORKER)
    strategy = _TwoWorkersOfTwoReplicas(other)
    assert gather.gather_to_chief(part, context=context, strategy=strategy) == [part, other]
