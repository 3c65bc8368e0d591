import os


from harness.data import index, shards as S


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
    assert index.record_stats(found, index_path=path) == first


def test_cache_keyed_by_size_and_mtime(tmp_path):
    from harness.data import synth
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
