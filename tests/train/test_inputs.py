"""A run's inputs (harness/train/inputs.py): prepared once, the same on every worker."""
import numpy as np

from harness.data.export import synth
from harness.distribute.backend import TrainingBackend
from harness.distribute.context import Backend, WorkerContext
from harness.train import inputs
from harness.train.options import TrainOptions


class _TwoWorkers(TrainingBackend):
    """Rank 1 of 2; rank 0's row of each all-gather is given, in turn (`rows`: one function of the length each)."""

    def __init__(self, *rows):
        super().__init__(None, WorkerContext(1, 2, 0, 1, "worker", 1, Backend.MULTI_WORKER))
        self.rows, self.gathered = list(rows), []

    def allgather(self, values):
        self.gathered.append(list(values))
        return np.array([self.rows.pop(0)(len(values)), list(values)], np.float64)


def test_classes_and_statistics_are_the_same_on_every_worker(tmp_path):
    """Each worker took the class count from its own sample: with a rare class, workers built logits [.., 3] and
    [.., 4] and failed in their first collective (issue 11, item 10). Now the largest label over every worker's
    sample decides, and the band statistics are the chief's."""
    from harness.data.export import index, shards as shards_lib

    synth.write_table_export(str(tmp_path), prefix="t", shards=2, records=400, classes=3, seed=1)
    first, second = (index.count_shard(s) for s in shards_lib.discover_shards([str(tmp_path)]))
    # the record counts: rank 0 counted shard 0, this worker shard 1 (issue 62); each checked the first record of
    # its shard and passed; then rank 0's sample saw class 3
    backend = _TwoWorkers(lambda n: [first.records, first.bytes], lambda n: [1.0],
                          lambda n: [3.0] + [10.0] * ((n - 1) // 2) + [4.0] * ((n - 1) // 2))
    said = []
    prepared = inputs.prepare(TrainOptions(data=(str(tmp_path),), per_replica_batch_size=8), backend,
                              say=said.append)
    counted, checked, mine = backend.gathered
    assert counted == [second.records, second.bytes] and checked == [1.0] and prepared.train.records == 400
    assert ("training data: first records of 1 shard(s) checked here, 0 passed the same checks in an earlier run "
            "(record index), 1 by the other workers") in "\n".join(said)
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


def _one_worker():
    return TrainingBackend(None, WorkerContext(0, 1, 0, 1, "worker", 0, Backend.SINGLE))


def test_the_first_records_of_every_shard_are_read_once(tmp_path, monkeypatch):
    """The spec inference, validate_spec and check_first_labels each read the first records of every shard (two
    round trips each on gs://: the compression sniff and the read): 3 reads of the first shard, 2 of the others.
    Now `ShardSet.first_examples` reads the first shard once, 16 records deep, and one parallel pass
    (`records.first_records`, issue 62) reads record 0 of every other shard once, for the checks together."""
    from harness.data.export import records

    synth.write_table_export(str(tmp_path / "t"), prefix="t", shards=3, records=60, classes=3, seed=1)
    synth.write_table_export(str(tmp_path / "v"), prefix="v", shards=2, records=40, classes=3, seed=2)
    reads, read_records, first_records = [], records.read_records, records.first_records
    monkeypatch.setattr(records, "read_records", lambda shard, n: reads.append(shard.path) or read_records(shard, n))
    monkeypatch.setattr(records, "first_records",
                        lambda shards: reads.extend(s.path for s in shards) or first_records(shards))
    prepared = inputs.prepare(TrainOptions(data=(str(tmp_path / "t"),), validation_data=(str(tmp_path / "v"),),
                                           per_replica_batch_size=8), _one_worker())
    every = [s.path for s in (*prepared.train.shards, *prepared.validation.shards)]
    assert sorted(reads) == sorted(every) and len(every) == 5  # each shard once
    head = prepared.train.first_examples(prepared.train.shards[0], 16)
    assert len(head) == 16 and len(reads) == 5  # the first shard was read 16 records deep, for the label check


def test_the_profile_names_the_cache_the_pipeline_applied(tmp_path, caplog):
    """The pipeline decides the cache on the decoded size (parsed tensors), the profile's facts decided it again
    on the serialized size: with the memory budget between the two, the pipeline cached in memory and the profile
    said "not cached" (and advised --cache memory). The facts now read the plan the pipeline applied."""
    import dataclasses
    import logging

    import tensorflow as tf

    from harness.data.input import pipeline
    from harness.distribute import resources as resources_lib
    from harness.profile import report as report_lib

    synth.write_table_export(str(tmp_path), prefix="t", shards=2, records=400, classes=3, seed=1)
    prepared = inputs.prepare(TrainOptions(data=(str(tmp_path),), per_replica_batch_size=8, cache="auto"),
                              _one_worker())
    serialized = prepared.train.nbytes()
    decoded = sum(prepared.plan.records) * pipeline.decoded_record_bytes(prepared.spec)
    assert decoded < serialized  # an Example names every feature: its bytes exceed the float32 values
    # this worker's memory (harness.distribute.resources, measured by prepare): room for the decoded records only
    prepared = dataclasses.replace(prepared, resources=resources_lib.combine(
        local_size=1, host_cpus=2, affinity_cpus=2, cgroup_cpus=None, host_available_bytes=decoded + serialized))
    with caplog.at_level(logging.INFO, logger="harness.data.input.pipeline"):
        ds = prepared.dataset_fn(True)(tf.distribute.InputContext())
    applied = [r.getMessage() for r in caplog.records if "cache: " in r.getMessage()]
    assert len(applied) == 1 and "cache: memory (" in applied[0], applied
    assert any(n.op == "CacheDataset" or n.op.startswith("CacheDatasetV")
               for n in tf.compat.v1.GraphDef.FromString(
                   ds._as_serialized_graph().numpy()).node)  # a memory cache in the built graph
    facts = prepared.worker_facts(0)
    assert facts["cache"] == "memory"
    assert facts["input_pipeline"] == applied[0]  # the one text: the job's log line and the profile's
    tips = report_lib.advice({"input_stall_share": 0.9, "accelerator_busy_share": None}, [], facts)
    assert not any("the records are not cached" in t for t in tips)


def test_the_validation_cache_gets_the_memory_the_training_cache_leaves(tmp_path):
    """`--cache auto` decided each pipeline on half the worker's memory, so training and validation together could
    take all of it (issue 62: a worker that believed it had 2.6 GiB peaked at 3.6 GiB). The validation pipeline
    now decides on what the training pipeline's memory cache leaves."""
    import dataclasses

    from harness.distribute import resources as resources_lib

    synth.write_table_export(str(tmp_path / "t"), prefix="t", shards=2, records=400, classes=3, seed=1)
    synth.write_table_export(str(tmp_path / "v"), prefix="v", shards=2, records=400, classes=3, seed=2)
    options = TrainOptions(data=(str(tmp_path / "t"),), validation_data=(str(tmp_path / "v"),),
                           per_replica_batch_size=8, cache="auto")
    probe = inputs.prepare(options, _one_worker())
    held = probe.pipeline_plan(True, 0).records * probe.pipeline_plan(True, 0).decoded_record_bytes
    # the training records fit in half of 2.5x their size; the validation's (as many) not in half of the rest
    mine = dataclasses.replace(resources_lib.for_this_process(), memory_bytes=int(2.5 * held))
    prepared = inputs.prepare(options, _one_worker(), resources=mine)
    alone = prepared.pipeline_plan(False, 0)   # no training pipeline planned (`harness evaluate`): all the memory
    assert alone.cache.kind == "memory"
    prepared.pipelines.clear()
    train, val = prepared.pipeline_plan(True, 0), prepared.pipeline_plan(False, 0)   # as a run plans them
    assert train.cache.kind == "memory" and val.records * val.decoded_record_bytes == held
    assert val.cache.kind == "none", val.cache   # alone it would have fit in half of 2.5x: memory twice over
    assert "of records exceed" in val.cache.reason and "no --cache-dir" in val.cache.reason, val.cache.reason
