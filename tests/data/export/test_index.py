import os
import sys
import threading

import pytest

from harness.data.export import index, records, shards as S
from harness.errors import CorruptShardError


def test_real_point_counts(shared_data):
    found = S.discover_shards(str(shared_data / "gee-aces-points/*.tfrecord.gz"))  # three splits, merged on purpose
    counts = dict(zip((os.path.basename(s.path) for s in found), index.record_counts(found)))
    # The origin repository declares 8531/2404/1222: count, never trust a declared size.
    assert counts == {"training.tfrecord.gz": 8316, "validation.tfrecord.gz": 2385, "testing.tfrecord.gz": 1219}


def test_counted_once_then_cached(table_export, monkeypatch, tmp_path):
    found = S.discover_shards(str(table_export))
    path = str(tmp_path / "idx.json")
    first = index.record_stats(found, index_path=path)
    assert sum(s.records for s in first) == 64 and all(s.bytes > 0 for s in first)

    def boom(shard):
        raise AssertionError("re-read although cached")

    monkeypatch.setattr(index, "count_shard", boom)
    monkeypatch.setattr(index, "count_shards", boom)
    assert index.record_stats(found, index_path=path) == first


def test_counting_calls_tensorflow_from_the_calling_thread_only(tmp_path):
    """TensorFlow's Python API dispatcher is not safe for ops built from two Python threads at once (it checks one
    call's arguments in storage the threads share): counting shards in a thread pool crashed ranks with signal 11
    in `PyObject_GetAttr` under `PyInstanceChecker::Check`. Every Python frame of TensorFlow that counting enters
    runs on the calling thread; the shards are read in parallel by tf.data's own threads."""
    from harness.data.export import synth
    synth.write_table_export(str(tmp_path / "t"), shards=8, records=800, seed=4)
    found = S.discover_shards(str(tmp_path / "t"))
    threads = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_globals.get("__name__", "").startswith("tensorflow"):
            threads.add(threading.get_ident())

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        counts = index.record_counts(found, use_cache=False)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert threads == {threading.get_ident()}
    assert len(counts) == 8 and sum(counts) == 800
    assert counts == [len(records.read_records(s, 10 ** 6)) for s in found]


def test_a_bad_shard_among_many_is_named_in_order(tmp_path):
    """Read together, the shards are read again one by one when one fails: the error names the bad one."""
    from harness.data.export import synth
    synth.write_table_export(str(tmp_path / "t"), shards=4, records=400, seed=5, compressed=False)
    found = S.discover_shards(str(tmp_path / "t"))
    raw = bytearray(open(found[2].path, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(found[2].path, "wb").write(bytes(raw))
    with pytest.raises(CorruptShardError, match=os.path.basename(found[2].path)):
        index.record_counts(found, use_cache=False)


def test_cache_keyed_by_size_and_mtime(tmp_path):
    from harness.data.export import synth
    out = tmp_path / "t"
    synth.write_table_export(str(out), records=5, seed=0)
    found = S.discover_shards(str(out))
    path = str(tmp_path / "idx.json")
    assert index.record_counts(found, index_path=path) == [5]
    synth.write_table_export(str(out), records=7, seed=0)  # rewritten in place: new size and mtime
    assert index.record_counts(found, index_path=path) == [7]


def test_default_location_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    assert index.cache_dir() == str(tmp_path)
