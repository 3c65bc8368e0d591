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


def test_cache_keyed_by_size_and_mtime_and_holds_only_the_files_that_exist(tmp_path):
    import json

    from harness.data.export import synth
    out = tmp_path / "t"
    synth.write_table_export(str(out), records=5, seed=0)
    found = S.discover_shards(str(out))
    path = str(tmp_path / "idx.json")
    assert index.record_counts(found, index_path=path) == [5]
    old_key = index.identities(found)[0]
    synth.write_table_export(str(out), records=7, seed=0)  # rewritten in place: new size and mtime
    assert index.record_counts(found, index_path=path) == [7]
    entries = json.load(open(path))
    assert list(entries) == index.identities(found) and old_key not in entries   # the rewritten file's entry gone
    other = tmp_path / "o"
    synth.write_table_export(str(other), records=3, seed=1)
    os.remove(found[0].path)   # an export deleted: its entry leaves at the next write
    assert index.record_counts(S.discover_shards(str(other)), index_path=path) == [3]
    assert [k.split("|")[0] for k in json.load(open(path))] == [str(other / "export.tfrecord.gz")]


def test_default_location_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    assert index.cache_dir() == str(tmp_path)



def _four_shards(tmp_path, corrupt=None):
    """4 GZIP shards of 8 records; `corrupt`: that shard's bytes flipped mid-stream (its count fails, named)."""
    from harness.data.export import synth

    paths = [p for p in synth.write_table_export(str(tmp_path), prefix="t", shards=4, records=32, seed=2)
             if ".tfrecord" in p]
    if corrupt is not None:
        data = open(paths[corrupt], "rb").read()
        open(paths[corrupt], "wb").write(data[:12] + bytes(b ^ 0xFF for b in data[12:40]) + data[40:])
    return S.discover_shards(str(tmp_path))


@pytest.mark.parametrize("bad", [None, 2, 3])   # none; in the other worker's share (0, 2); in this worker's (1, 3)
def test_split_counting_gathers_each_workers_share_and_a_bad_shard_fails_every_worker_named(tmp_path, bad):
    """Rank 1 of 2 counts shards 1 and 3 and takes 0 and 2 from rank 0's gathered row (issue 62). A shard that
    fails on either worker fails on both, with its named error, after the gather: the worker that failed still
    gathers, so no other worker waits for it."""
    import numpy as np

    found = _four_shards(tmp_path, bad)
    good = {i: index.count_shard(s) for i, s in enumerate(found) if i != bad}
    rank0 = [v for i in (0, 2) for v in ((-1.0, 0.0) if i == bad else (good[i].records, good[i].bytes))]
    gathered = []

    def gather(values):
        gathered.append(list(values))
        return np.array([rank0, values], np.float64)

    tally, path = {}, str(tmp_path / "idx.json")
    mine = [v for i in (1, 3) for v in ((-1.0, 0.0) if i == bad else (good[i].records, good[i].bytes))]
    if bad is None:
        stats = index.record_stats(found, index_path=path, split=index.Split(1, 2, gather), tally=tally)
        assert stats == [good[i] for i in range(4)] and gathered == [mine]
        assert tally == {"shards": 4, "counted": 2, "cached": 0, "gathered": 2}
        gathered.clear()   # every count now in this worker's index: nothing counted, the gather still made
        assert index.record_stats(found, index_path=path, split=index.Split(1, 2, gather), tally=tally) == stats
        assert gathered == [mine] and tally == {"shards": 4, "counted": 0, "cached": 2, "gathered": 2}
        return
    with pytest.raises(CorruptShardError, match=rf"t-0000{bad}\.tfrecord\.gz"):
        index.record_stats(found, index_path=path, split=index.Split(1, 2, gather), tally=tally)
    assert gathered == [mine]


def test_a_refuted_compression_is_sniffed_counted_again_and_told_to_the_other_workers(tmp_path):
    """With `found` (`index.Found`, as `source.open_shards` counts), a shard whose given compression (a guess on
    gs://: the first shard's, `source._compressions`) fails its count read is sniffed and counted again: its stats,
    and the compression found in the index and in `found.compressions`. Without `found`, the mismatch is named as
    before. Split across 2 workers, the worker that refuted it says so in its gathered row (`_RECOUNT`) and every
    other worker counts that shard itself."""
    import dataclasses

    import numpy as np

    from harness.errors import CompressionMismatchError

    found = _four_shards(tmp_path)   # GZIP, given here as uncompressed for shards 0 and 3
    good = [index.count_shard(s) for s in found]
    wrong = [dataclasses.replace(s, compression="") if i in (0, 3) else s for i, s in enumerate(found)]
    with pytest.raises(CompressionMismatchError, match="t-00000"):
        index.record_stats(wrong, use_cache=False)
    told, path = index.Found(), str(tmp_path / "one.json")
    assert index.record_stats(wrong, index_path=path, found=told) == good
    assert told.compressions == {found[0].path: "GZIP", found[3].path: "GZIP"}
    assert [e["compression"] for e in index.lookup(index.identities(found), index_path=path)] == ["GZIP"] * 4

    rank0 = [index._RECOUNT, 0.0, good[2].records, good[2].bytes]   # rank 0 refuted shard 0's, counted shard 2
    sent = []

    def gather(values):
        sent.append(list(values))
        return np.array([rank0, values], np.float64)

    told, path = index.Found(), str(tmp_path / "two.json")
    assert index.record_stats(wrong, index_path=path, split=index.Split(1, 2, gather), found=told) == good
    assert sent == [[good[1].records, good[1].bytes, index._RECOUNT, 0.0]]   # shard 3 refuted here
    assert told.compressions == {found[3].path: "GZIP", found[0].path: "GZIP"}
    assert [e["compression"] for e in index.lookup(index.identities(found), index_path=path)] == ["GZIP"] * 4
