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


def _train_cli(tmp_path, *flags):
    import subprocess
    import sys
    synth.write_table_export(str(tmp_path / "d"), shards=1, records=256, classes=4, seed=0)
    return subprocess.run([sys.executable, "-m", "harness.cli", "train", "--data", str(tmp_path / "d"), "--label",
                           "class", "--epochs", "1", "--global-batch-size", "32", "--output", str(tmp_path / "o"),
                           *map(str, flags)], capture_output=True, text=True, timeout=300)


def test_fewer_class_names_than_the_sample_has_classes_is_refused_before_training(tmp_path):
    """2 names for labels 0-3: refused after the sample, naming the names, the first record and the count to
    declare (not a mid-training LabelValueError saying the classes were "taken from a sample")."""
    r = _train_cli(tmp_path, "--class-names", "water", "crop")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "epoch 1/1" not in r.stdout, r.stderr[-2000:]
    assert "ConfigError: label 'class': a shuffled sample of" in r.stderr, r.stderr[-2000:]
    assert ("outside the 2 classes [0, 2) of the 2 class_names ['water', 'crop']; declare 4 classes or more (one "
            "name each)") in r.stderr, r.stderr[-2000:]
    assert ": record " in r.stderr


def test_num_classes_and_class_names_of_another_count_are_refused(tmp_path):
    r = _train_cli(tmp_path, "--class-names", "a", "b", "c", "--num-classes", "4")
    assert r.returncode == 2 and ("ConfigError: --num-classes 4 but 3 class_names ['a', 'b', 'c']: give one name per "
                                  "class") in r.stderr, r.stderr[-2000:]


def test_ignore_label_inside_the_classes_is_warned(tmp_path):
    r = _train_cli(tmp_path, "--ignore-label", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("warning: ignore_label 1 is inside the classes [0, 4): class 1 gets no loss and no metrics (its output is "
            "never trained); if it is a class, not nodata, drop ignore_label") in r.stdout + r.stderr
