"""Epoch plan: harness/distribute/plan.py (hand-computed cases)."""
import json

import pytest

from harness.distribute.plan import make_plan
from harness.errors import BatchSizeError, ConfigError


def test_four_files_four_workers():
    plan = make_plan([("a", 100), ("b", 100), ("c", 100), ("d", 96)], workers=4, replicas_per_worker=1,
                     per_replica_batch_size=4)
    assert plan.policy == "file"
    assert plan.files == (("a",), ("b",), ("c",), ("d",))
    assert plan.records == (100, 100, 100, 96)
    assert plan.steps_per_epoch == 24
    assert plan.dropped == (4, 4, 4, 0)
    assert (plan.per_worker_batch_size, plan.global_batch_size) == (4, 16)


def test_one_file_two_workers_shards_by_record():
    plan = make_plan([("only", 200)], workers=2, replicas_per_worker=1, per_replica_batch_size=20)
    assert plan.policy == "record"
    assert plan.files == (("only",), ("only",))
    assert plan.records == (100, 100)
    assert (plan.global_batch_size, plan.steps_per_epoch, plan.dropped) == (40, 5, (0, 0))


def test_files_go_round_robin_with_several_replicas_per_worker():
    plan = make_plan([(f"f{i}", 10 * (i + 1)) for i in range(5)], workers=2, replicas_per_worker=2,
                     global_batch_size=12)
    assert plan.files == (("f0", "f2", "f4"), ("f1", "f3"))
    assert plan.records == (90, 60)
    assert (plan.per_replica_batch_size, plan.per_worker_batch_size) == (3, 6)
    assert plan.steps_per_epoch == 10
    assert plan.dropped == (30, 0)


def test_global_batch_not_divisible_by_replicas():
    with pytest.raises(BatchSizeError, match="30.*4 replicas"):
        make_plan([("a", 100)], workers=2, replicas_per_worker=2, global_batch_size=30)


def test_zero_steps_names_the_worker_with_fewest_records():
    with pytest.raises(BatchSizeError, match="worker 1 reads 20 records < per-worker batch 64"):
        make_plan([("a", 100), ("b", 20)], workers=2, replicas_per_worker=1, per_replica_batch_size=64)


def test_conflicting_counts_for_one_path():
    with pytest.raises(ConfigError, match="b"):
        make_plan([("b", 1), ("b", 2)], workers=1, replicas_per_worker=1, per_replica_batch_size=1)


def test_to_dict_is_json_and_format_has_a_row_per_worker():
    plan = make_plan([("a", 100), ("b", 100), ("c", 100), ("d", 96)], workers=4, replicas_per_worker=1,
                     per_replica_batch_size=4)
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["steps_per_epoch"] == 24 and d["records_per_epoch"] == 396 and d["dropped"] == 12
    assert [w["dropped"] for w in d["per_worker"]] == [4, 4, 4, 0]
    text = plan.format()
    assert "steps per epoch: 24" in text and len(text.splitlines()) == 4 + 4


def test_zero_record_files_are_skipped_as_the_input_pipeline_skips_them():
    # Counting the empty file would give worker 1 nothing (and zero steps); skipped, each worker gets one file.
    plan = make_plan([("a", 10), ("empty", 0), ("b", 50)], workers=2, replicas_per_worker=1,
                     per_replica_batch_size=5)
    assert (plan.policy, plan.files, plan.records) == ("file", (("a",), ("b",)), (10, 50))
    assert (plan.steps_per_epoch, plan.dropped) == (2, (0, 40))


def test_every_file_empty():
    with pytest.raises(BatchSizeError, match="every file holds zero records"):
        make_plan([("a", 0), ("b", 0)], workers=1, replicas_per_worker=1, per_replica_batch_size=1)


def test_uneven_files_warn_with_the_split_and_the_fix():
    """3 files of 40 records over 2 workers: rank 0 reads 80, rank 1 40, and every worker runs rank 1's steps:
    40 of 120 records (33%) are read and dropped every epoch (issue 11, item 11)."""
    plan = make_plan([("a", 40), ("b", 40), ("c", 40)], workers=2, replicas_per_worker=1, global_batch_size=8)
    assert plan.records == (80, 40) and plan.dropped == (40, 0) and plan.dropped_share == pytest.approx(1 / 3)
    warning = plan.waste_warning()
    assert warning.startswith("warning: 40 of 120 records (33%) are read and dropped every epoch")
    assert "records per worker: 80/40, files per worker: 2/1" in warning
    assert "harness reshard DATA --output DIR --workers 2" in warning and warning in plan.format()
    assert plan.waste_warning(["/d/ex port/*.gz"]).endswith(
        "harness reshard '/d/ex port/*.gz' --output '/d/ex port-resharded' --workers 2")
    assert plan.to_dict()["dropped_share"] == pytest.approx(1 / 3)
    even = make_plan([("a", 40), ("b", 40)], workers=2, replicas_per_worker=1, global_batch_size=8)
    assert even.waste_warning() is None and "warning" not in even.format()
    # A batch remainder above the share, with even files: the advice is the batch, not resharding.
    small = make_plan([("a", 10), ("b", 10)], workers=2, replicas_per_worker=1, global_batch_size=8)
    assert small.dropped == (2, 2) and small.waste_warning().endswith("a smaller batch than 8 drops fewer")


def test_records_kept_per_worker_is_the_steps_times_the_per_worker_batch():
    """Uneven files (100/100/50 over 3 workers at 2 replicas x 8): every worker keeps 3 steps x 16 = 48 records;
    the rest of each worker's records are dropped, and the pipeline keeps exactly that (records_per_epoch)."""
    plan = make_plan([("a", 100), ("b", 100), ("c", 50)], workers=3, replicas_per_worker=2, per_replica_batch_size=8)
    assert (plan.steps_per_epoch, plan.per_worker_batch_size, plan.records_kept_per_worker) == (3, 16, 48)
    assert [r - plan.records_kept_per_worker for r in plan.records] == list(plan.dropped) == [52, 52, 2]


def test_files_with_records_skips_zero_record_files_in_order():
    from harness.distribute.sharding import assign_nonempty, files_with_records

    counts = [("a", 3), ("empty", 0), ("b", 1)]
    assert files_with_records(counts) == ["a", "b"] == list(assign_nonempty(counts, 1, 0).files)
