"""harness/data/input/stages.py: every stage of an input pipeline decided once, without TensorFlow."""
import os
import subprocess
import sys

import pytest

from harness.data.input import stages as S
from harness.errors import BatchSizeError, ConfigError

GB = 10 ** 9


def _decide(*, training=True, batch=8, records=1000, mean=220.0, decoded=36, image=False, files=4,
            available=100 * GB, **options):
    names = []
    plan = S.decide(S.PipelineOptions(per_replica_batch_size=batch, training=training, seed=1, **options),
                    files=[f"f{i}" for i in range(files)], compressions=[""] * files, records=records,
                    mean_record_bytes=mean, decoded_record_bytes=decoded, image=image, cpu_count=2,
                    available_memory=available, cache_name=lambda rb: names.append(rb) or f"name-rb{rb}")
    return plan, names


def test_the_module_imports_no_tensorflow():
    code = "import sys, harness.data.input.stages; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr[-2000:]


def test_small_records_training_in_memory_cache_records_and_batch_each_epoch_alone():
    """One worker keeping every whole batch: read batches parsed, records cached, batched by the keep."""
    plan, names = _decide(records=1000, records_per_epoch=1000 // 8 * 8, cache="auto")
    assert plan.read_batch == int(256 * 1024 // 220) and plan.parse == S.PARSE_READ_BATCHES
    assert plan.cache.kind == "memory" and plan.cache_holds_records and not plan.unbatch_after_cache
    assert (plan.keep, plan.keep_filter, plan.batch) == (S.KEEP_BATCHES, False, S.BATCHED_BY_KEEP)
    assert plan.shuffle_buffer == 1000 and plan.shuffle_files and plan.parallel_reads == 2 and plan.repeat
    assert plan.deterministic and names == []  # no file cache: no name (each name stats every file)


def test_more_records_than_the_memory_cache_holds_cache_read_batches_split_each_epoch(monkeypatch):
    monkeypatch.setattr(S, "MEMORY_CACHE_MAX_RECORDS", 999)
    plan, _ = _decide(records=1000, cache="memory")
    assert plan.cache.kind == "memory" and not plan.cache_holds_records and plan.unbatch_after_cache
    assert (plan.keep, plan.batch) == (S.KEEP_ALL, S.BATCH)


def test_a_keep_of_fewer_batches_filters_and_a_keep_of_odd_records_keeps_records():
    fewer, _ = _decide(records=1000, records_per_epoch=800)
    assert (fewer.keep, fewer.keep_filter, fewer.batch) == (S.KEEP_BATCHES, True, S.BATCHED_BY_KEEP)
    odd, _ = _decide(records=1000, records_per_epoch=803)
    assert (odd.keep, odd.keep_filter, odd.batch, odd.records_per_epoch) == (S.KEEP_RECORDS, True, S.BATCH, 803)


def test_evaluation_regroups_read_batches_deterministically_and_keeps_every_record():
    plan, _ = _decide(training=False, records=1003, cache="none")
    assert (plan.batch, plan.dropped, plan.shuffle_buffer, plan.keep) == (S.REBATCH, 0, None, S.KEEP_ALL)
    assert not plan.drop_remainder and "the last batch partial" in plan.describe()
    assert plan.deterministic and not plan.shuffle_files and not plan.repeat and not plan.unbatch_after_cache
    small, _ = _decide(training=False, records=5)   # fewer records than one batch: one partial batch
    assert not small.drop_remainder and small.dropped == 0
    first, _ = _decide(training=False, records=1003, records_per_epoch=803)   # the first records, whole batches
    assert first.drop_remainder and first.dropped == 3


def test_large_records_are_parsed_into_a_cache_or_only_when_kept():
    cached, _ = _decide(mean=2e6, decoded=2 * 10 ** 6, records=40, image=True, cache="memory",
                        records_per_epoch=16)
    assert cached.read_batch is None and cached.parse == S.PARSE_BEFORE_CACHE and cached.cache_holds_records
    assert (cached.keep, cached.batch) == (S.KEEP_BATCHES, S.BATCHED_BY_KEEP)
    uncached, _ = _decide(mean=2e6, decoded=2 * 10 ** 6, records=40, image=True, cache="none",
                          records_per_epoch=16)
    assert uncached.parse == S.PARSE_KEPT and not uncached.cache_holds_records
    assert (uncached.keep, uncached.batch) == (S.KEEP_RECORDS, S.BATCH)  # records kept, then parsed, batched


def test_auto_cache_is_decided_on_the_decoded_bytes():
    """1000 records of 36 decoded bytes: 36 kB; in memory under a budget of 50 kB, in files (the name asked for
    once, with the read batch) or nowhere under 20 kB."""
    memory, _ = _decide(records=1000, decoded=36, available=100_000)
    assert memory.cache.kind == "memory" and memory.cached_bytes == 36_000
    files, names = _decide(records=1000, decoded=36, available=40_000, cache_dir="/c")
    assert files.cache.kind == "file" and files.cache.path == os.path.join("/c", f"name-rb{files.read_batch}")
    assert names == [files.read_batch] and "exceed" in files.cache.reason
    none, _ = _decide(records=1000, decoded=36, available=40_000)
    assert none.cache.kind == "none" and "no --cache-dir" in none.cache.reason
    assert none.parse == S.PARSE_READ_BATCHES  # small records are parsed in read batches, cached or not


def test_record_sharding_reads_one_order_and_never_shuffles_files():
    plan = S.decide(S.PipelineOptions(per_replica_batch_size=4, training=True, seed=0), files=["a", "b"],
                    compressions=["", ""], records=50, mean_record_bytes=100, decoded_record_bytes=8,
                    image=False, record_sharding=True, input_pipeline_id=1, num_input_pipelines=3)
    assert plan.record_sharding and plan.deterministic and not plan.shuffle_files
    assert "record-sharded 1/3" in plan.describe()


def test_augmentation_applies_to_training_images_only(caplog):
    assert _decide(image=True, augment=True, brightness=0.2)[0].augment
    table, _ = _decide(image=False, augment=True)
    assert not table.augment and "augment ignored" in caplog.text
    evaluation, _ = _decide(training=False, image=True, augment=True, brightness=0.2)
    assert not evaluation.augment and evaluation.brightness == 0.0


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(records=100, records_per_epoch=101), BatchSizeError, "exceeds the 100 records"),
    (dict(records=100, records_per_epoch=5), BatchSizeError, "< per-replica batch 8"),
    (dict(training=False, records=100, records_per_epoch=5), BatchSizeError, "5 < per-replica batch 8"),
    (dict(batch=0), BatchSizeError, "per_replica_batch_size must be >= 1"),
    (dict(cache="disk"), ConfigError, "cache must be one of auto, memory, file, none"),
    (dict(cache="file"), ConfigError, "cache='file' needs cache_dir"),
])
def test_refused_plans_name_the_reason(kwargs, error, words):
    with pytest.raises(error, match=words):
        _decide(**kwargs)


def test_describe_names_every_stage():
    plan, _ = _decide(records=1000, records_per_epoch=800, cache="memory", image=True, augment=True)
    text = plan.describe()
    for words in ("input pipeline 0/1: 4 files, 1000 records (220 B serialized, 36 B decoded each)",
                  "read: 2 file(s) at once; parse",   # cached: the first pass's file order, not reshuffled
                  "repeat: epochs from 1, each in its own seeded order",
                  f"parse: read batches of {plan.read_batch} records", "cache: memory (cache='memory'), holding "
                  "parsed records", "shuffle: records, buffer 1000", "keep: the first 800 records per epoch as "
                  "batches", "batch: 8 per replica", "augment: flips/rotations", "prefetch: autotune"):
        assert words in text, (words, text)


def test_the_tuned_levers_override_the_defaults():
    """`harness tune`'s levers (PipelineOptions parse, parallel_reads, map_parallelism, prefetch) are the plan's."""
    default, _ = _decide(mean=220.0, files=8)
    assert default.parse == S.PARSE_READ_BATCHES and default.parallel_reads == 2  # 2 CPUs
    assert default.map_parallelism is None and default.prefetch_depth is None
    assert "prefetch: autotune" in default.describe()
    plan, _ = _decide(mean=220.0, files=8, parse="records", parallel_reads=3, map_parallelism=5, prefetch=4)
    assert plan.read_batch is None and plan.parse == S.PARSE_BEFORE_CACHE   # small records parsed one by one
    assert (plan.parallel_reads, plan.map_parallelism, plan.prefetch_depth) == (3, 5, 4)
    assert "5 calls in flight" in plan.describe() and "prefetch: 4 batches" in plan.describe()
    assert _decide(files=2, parallel_reads=3)[0].parallel_reads == 2            # at most the files
    large, _ = _decide(mean=1e6, decoded=10 ** 6, parse="batches", cache="none")
    assert large.parse == S.PARSE_READ_BATCHES and large.read_batch == 1        # 256 kB / 1 MB: 1 record
    with pytest.raises(ConfigError, match="parse must be one of auto, records, batches, got 'rows'"):
        _decide(parse="rows")


def test_cloud_storage_files_are_read_more_at_once_than_local_files():
    """A gs:// reader waits for each block of its file, so the plan reads READERS_PER_CORE_REMOTE files a core."""
    assert S.READERS_PER_CORE_REMOTE > S.READERS_PER_CORE
    local, remote = [f"/data/f{i}" for i in range(64)], [f"gs://bucket/f{i}" for i in range(64)]
    assert S.decide_parallel_reads(local, 2) == 2 * S.READERS_PER_CORE
    assert S.decide_parallel_reads(remote, 2) == 2 * S.READERS_PER_CORE_REMOTE
    assert S.decide_parallel_reads(remote[:3], 2) == min(3, 2 * S.READERS_PER_CORE_REMOTE)  # at most the files
    plan = S.decide(S.PipelineOptions(per_replica_batch_size=8, training=True, seed=1),
                    files=[f"gs://bucket/export/f{i}.tfrecord.gz" for i in range(16)], compressions=["GZIP"] * 16,
                    records=1000, mean_record_bytes=220.0, decoded_record_bytes=36, image=False, cpu_count=2,
                    available_memory=100 * GB, cache_name=lambda rb: "name")
    assert plan.parallel_reads == 2 * S.READERS_PER_CORE_REMOTE
    assert _decide(files=16)[0].parallel_reads == 2 * S.READERS_PER_CORE               # local paths: as before
