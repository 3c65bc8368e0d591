"""Shard discovery and reading faults: several exports in one folder, conflicting TFDS shard sets, the same file
named twice, an uncompressed file starting with the gzip magic, corrupt records."""
import logging

import numpy as np
import pytest
import tensorflow as tf

from harness.data.export import index, records, shards as S
from harness.errors import (CorruptShardError, MissingShardError, NotTFRecordError, ShardConflictError,
                            ShardDiscoveryError, TruncatedShardError)


def _example(n, rng):
    feature = {"a": tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(n).tolist()))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path, payloads, gz=False):
    with tf.io.TFRecordWriter(str(path), "GZIP" if gz else "") as w:
        for p in payloads:
            w.write(p)
    return str(path)


def _touch(path):
    return _write(path, [b"x"], gz=True)


# --- 1. several exports in one folder -----------------------------------------------------------------------------
@pytest.mark.parametrize("names", [["training.tfrecord.gz", "validation.tfrecord.gz", "testing.tfrecord.gz"],
                                   ["a-00000.tfrecord.gz", "b-00000.tfrecord.gz", "b-00001.tfrecord.gz"]])
def test_folder_with_several_exports_is_refused(tmp_path, names):
    for n in names:
        _touch(tmp_path / n)
    with pytest.raises(ShardDiscoveryError, match=r"holds \d exports.*\(1 file\).*pass one of them as a glob, "
                                                  r"e\.g\. '.*/(a|testing)\*\.tfrecord\.gz'") as e:
        S.discover_shards(str(tmp_path))
    assert "(2 files)" in str(e.value) or "training (1 file)" in str(e.value)


def test_real_split_folder_refused_and_glob_or_list_merged_with_warning(shared_data, caplog):
    folder = shared_data / "gee-aces-points"
    with pytest.raises(ShardDiscoveryError, match="training \\(1 file\\)"):
        S.discover_shards(str(folder))
    with caplog.at_level(logging.WARNING):
        assert len(S.discover_shards(str(folder / "*.tfrecord.gz"))) == 3
    assert "merging 3 exports" in caplog.text and "training (1 file)," in caplog.text
    caplog.clear()
    assert len(S.discover_shards(str(folder / "training*.tfrecord.gz"))) == 1
    assert "merging" not in caplog.text


def test_single_export_folders_still_work(shared_data, image_export):
    (shard,) = S.discover_shards(str(shared_data / "gee-aces-image"))  # one tfrecord beside a json mixer
    assert shard.prefix.endswith("image_2021")
    assert len(S.discover_shards(str(image_export))) == 3


# --- 2. TFDS shard sets -------------------------------------------------------------------------------------------
def test_two_tfds_sets_with_one_prefix_are_refused(tmp_path):
    for total in (2, 3):
        for i in range(total):
            _touch(tmp_path / f"x-{i:05d}-of-{total:05d}")
    for source in (str(tmp_path), str(tmp_path / "x-*")):
        with pytest.raises(ShardConflictError, match=r"x: .*conflicting totals: -of-00002 \(2 files\), "
                                                     r"-of-00003 \(3 files\)"):
            S.discover_shards(source)


def test_last_tfds_shard_missing_from_a_glob(tmp_path):
    for i in range(2):
        _touch(tmp_path / f"x-{i:05d}-of-00003")
    with pytest.raises(MissingShardError, match=r"shard index 00002 missing.*-of-00003"):
        S.discover_shards(str(tmp_path / "x-*"))


def test_duplicate_index_is_refused(tmp_path):
    _touch(tmp_path / "exp-00000.tfrecord.gz")
    _touch(tmp_path / "exp-00001.tfrecord.gz")
    _touch(tmp_path / "exp-00001.tfrecord")
    with pytest.raises(ShardConflictError, match=r"exp: shard index 00001 is held by 2 files"):
        S.discover_shards(str(tmp_path))


# --- 3. the same file twice ---------------------------------------------------------------------------------------
def test_same_file_named_twice_counted_once(tmp_path, monkeypatch, caplog):
    folder = tmp_path / "dir"
    folder.mkdir()
    a, b = _touch(folder / "exp-00000.tfrecord.gz"), _touch(folder / "exp-00001.tfrecord.gz")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert [s.path for s in S.discover_shards(["dir", "./dir"])] == ["dir/exp-00000.tfrecord.gz",
                                                                          "dir/exp-00001.tfrecord.gz"]
    assert "2 duplicate path(s) dropped" in caplog.text
    found = S.discover_shards([b, "dir/exp-00001.tfrecord.gz", a, a])
    assert [s.path for s in found] == [a, b]
    assert index.record_counts(found, use_cache=False) == [1, 1]


# --- 4. uncompressed, yet starting with 1f 8b ---------------------------------------------------------------------
def test_masked_crc32c_matches_tensorflow(tmp_path):
    assert S.masked_crc32c(b"") == 0xA282EAD8  # crc32c("") = 0
    payload = b"harness masked crc32c check"
    raw = open(_write(tmp_path / "c.tfrecord", [payload]), "rb").read()
    assert int.from_bytes(raw[8:12], "little") == S.masked_crc32c(raw[:8])
    assert int.from_bytes(raw[12 + len(payload):], "little") == S.masked_crc32c(payload)
    assert S.is_record_header(raw[:12]) and not S.is_record_header(raw[:8] + bytes(4))


def test_uncompressed_first_record_of_35615_bytes_is_not_gzip(tmp_path):
    path = _write(tmp_path / "big-00000.tfrecord", [b"\x07" * 35615, b"x", b"y"])
    assert open(path, "rb").read(2) == b"\x1f\x8b"
    (shard,) = S.discover_shards(path)
    assert shard.compression == ""
    assert index.record_counts([shard], use_cache=False) == [3]
    assert len(records.read_records(shard, 10)) == 3
    assert S.discover_shards(_write(tmp_path / "g.tfrecord", [b"x"], gz=True))[0].compression == "GZIP"


# --- 5. corrupt records -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
def test_flipped_byte_is_corrupt_not_truncated(tmp_path, gz):
    rng = np.random.default_rng(0)
    payloads = [_example(20, rng) for _ in range(300)]
    path = _write(tmp_path / "c.tfrecord", payloads, gz=gz)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    (shard,) = S.discover_shards(path)
    for read in (lambda: index.count_shard(shard), lambda: records.read_records(shard, 1000)):
        with pytest.raises(CorruptShardError, match=r"c\.tfrecord: corrupt record after (\d+) good records "
                                                    r"\(last good record index \d+\): ") as e:
            read()
        good = int(str(e.value).split("after ")[1].split()[0])
        assert 100 < good < 200, str(e.value)
        assert "[Op:" not in str(e.value) and "{{" not in str(e.value)


def test_corrupt_first_record_of_a_tfrecord_file_is_corrupt(tmp_path):
    path = _write(tmp_path / "f.tfrecord", [b"0123456789" * 10, b"x"])
    data = bytearray(open(path, "rb").read())
    data[12 + 50] ^= 0xFF  # inside record 0's payload: its header is valid
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptShardError, match=r"f\.tfrecord: corrupt record after 0 good records \(no good"):
        index.count_shard(S.discover_shards(path)[0])


def test_truncation_and_junk_keep_their_names_and_clean_detail(tmp_path):
    rng = np.random.default_rng(1)
    path = _write(tmp_path / "t.tfrecord", [_example(2000, rng) for _ in range(6)], gz=True)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) * 2 // 3])
    with pytest.raises(TruncatedShardError) as e:
        index.count_shard(S.discover_shards(path)[0])
    assert "failed with EOF reached" not in str(e.value) and "[Op:" not in str(e.value)
    junk = tmp_path / "junk.tfrecord"
    junk.write_bytes(b"not a TFRecord file, only text " * 8)
    with pytest.raises(NotTFRecordError, match="junk.tfrecord"):
        index.count_shard(S.discover_shards(str(junk))[0])


def test_glob_matching_only_folders_says_so(tmp_path):
    (tmp_path / "Split-train").mkdir()
    (tmp_path / "Split-eval").mkdir()
    with pytest.raises(ShardDiscoveryError, match=r"matches only folders .*add the file pattern, e\.g\. .*Split-\*/\*"):
        S.discover_shards(str(tmp_path / "Split-*"))


def test_symlink_to_a_listed_file_counted_once(tmp_path, caplog):
    real = _write(tmp_path / "exp-00000.tfrecord", [_example(3, np.random.default_rng(0))])
    link = tmp_path / "other" / "exp-00000.tfrecord"
    link.parent.mkdir()
    link.symlink_to(real)
    assert [s.path for s in S.discover_shards([real, str(link)])] == [real]
