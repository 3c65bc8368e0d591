"""A run's inputs (harness/train/inputs.py): prepared once, the same on every worker."""
import numpy as np

from harness.data import synth
from harness.distribute.backend import TrainingBackend
from harness.distribute.context import Backend, WorkerContext
from harness.train import inputs
from harness.train.options import TrainOptions


class _TwoWorkers(TrainingBackend):
    """Rank 1 of 2; rank 0's row of every all-gather is given (its sample saw class 3, ours did not)."""

    def __init__(self, rank0_row):
        super().__init__(None, WorkerContext(1, 2, 0, 1, "worker", 1, Backend.MULTI_WORKER))
        self.rank0_row, self.gathered = rank0_row, []

    def allgather(self, values):
        self.gathered.append(list(values))
        return np.array([self.rank0_row(len(values)), list(values)], np.float64)


def test_classes_and_statistics_are_the_same_on_every_worker(tmp_path):
    """Each worker took the class count from its own sample: with a rare class, workers built logits [.., 3] and
    [.., 4] and failed in their first collective (issue 11, item 10). Now the largest label over every worker's
    sample decides, and the band statistics are the chief's."""
    synth.write_table_export(str(tmp_path), prefix="t", shards=2, records=400, classes=3, seed=1)
    backend = _TwoWorkers(lambda n: [3.0] + [10.0] * ((n - 1) // 2) + [4.0] * ((n - 1) // 2))
    said = []
    prepared = inputs.prepare(TrainOptions(data=(str(tmp_path),), per_replica_batch_size=8), backend,
                              say=said.append)
    mine = backend.gathered[0]
    assert mine[0] == 2  # this worker's sample: classes 0-2
    assert prepared.num_classes == 4  # rank 0 saw class 3
    assert np.all(prepared.mean == 10.0) and np.all(prepared.variance == 4.0)  # the chief's statistics
    assert any(line.startswith("classes: 4") for line in said)
    assert prepared.plan.assignments[1].files == prepared.plan.files[1]
    assert any(line.startswith('spec: {"kind": "table"') for line in said)  # the merged spec is shown
