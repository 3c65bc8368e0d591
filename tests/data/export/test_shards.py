import pytest
import tensorflow as tf

from harness.data.export import shards as S
from harness.errors import CompressionMismatchError, MissingShardError, MixerError, ShardDiscoveryError


def _touch(path, gz=True):
    with tf.io.TFRecordWriter(str(path), "GZIP" if gz else "") as w:
        w.write(b"x")
    return str(path)


def test_gee_names_sorted_numerically_not_lexically(tmp_path):
    for i in (2, 10, 0, 1, 3, 4, 5, 6, 7, 8, 9):
        _touch(tmp_path / f"exp-{i:05d}.tfrecord.gz")
    (tmp_path / "exp-mixer.json").write_text('{"patchDimensions": [8, 8], "patchesPerRow": 1, "totalPatches": 11}')
    found = S.discover_shards(str(tmp_path))
    assert [s.index for s in found] == list(range(11))
    assert {s.prefix for s in found} == {f"{tmp_path}/exp"}
    assert all(s.compression == "GZIP" for s in found)


def test_tfds_style_real_shards_in_order(shared_data):
    folder = shared_data / "tfx/tfx/components/testdata/csv_example_gen/Split-eval"
    found = S.discover_shards(str(folder / "*"))
    assert [s.index for s in found] == list(range(12))
    assert found[0].path.endswith("data_tfrecord-00000-of-00012.gz")


def test_tfds_missing_last_index_in_folder(tmp_path):
    for i in range(3):
        _touch(tmp_path / f"train.tfrecord-{i:05d}-of-00004")
    with pytest.raises(MissingShardError, match="00003"):
        S.discover_shards(str(tmp_path))


def test_missing_index_is_named(tmp_path):
    for i in (0, 1, 3):
        _touch(tmp_path / f"exp-{i:05d}.tfrecord.gz")
    with pytest.raises(MissingShardError, match="00002"):
        S.discover_shards(str(tmp_path / "exp-*.tfrecord.gz"))


def test_tfrecords_and_plain_names_and_explicit_list(tmp_path):
    a = _touch(tmp_path / "data-00000.tfrecords", gz=False)
    b = _touch(tmp_path / "data-00001.tfrecords", gz=False)
    c = _touch(tmp_path / "points.tfrecord.gz")
    found = S.discover_shards([c, b, a, a])
    assert [s.path for s in found] == [a, b, c]
    assert [s.compression for s in found] == ["", "", "GZIP"]
    assert found[2].index is None and found[2].prefix.endswith("/points")


def test_plain_year_is_not_an_index(shared_data):
    (shard,) = S.discover_shards(str(shared_data / "gee-aces-image"))
    assert shard.index is None and shard.prefix.endswith("image_2021")


def test_windows_separators_normalised(tmp_path):
    path = _touch(tmp_path / "exp-00000.tfrecord.gz")
    (shard,) = S.discover_shards(path.replace("/", "\\"))
    assert shard.path == path


def test_compression_sniffed_not_named(tmp_path):
    lying = _touch(tmp_path / "named.tfrecord.gz", gz=False)
    assert S.discover_shards(lying)[0].compression == ""


@pytest.mark.parametrize("gz, declared", [(True, ""), (False, "GZIP")])
def test_declared_compression_mismatch(tmp_path, gz, declared):
    path = _touch(tmp_path / "x.tfrecord", gz=gz)
    with pytest.raises(CompressionMismatchError, match="x.tfrecord"):
        S.discover_shards(path, compression=declared)


def test_nothing_found(tmp_path):
    with pytest.raises(ShardDiscoveryError):
        S.discover_shards(str(tmp_path / "*.gz"))
    with pytest.raises(ShardDiscoveryError):
        S.discover_shards(str(tmp_path / "absent.tfrecord"))


def test_mixer_found_renamed_and_given(shared_data, image_export, tmp_path):
    m = S.find_mixer(S.discover_shards(str(shared_data / "gee-aces-image")))
    assert m.patch_dimensions == (256, 256) and m.total_patches == 1
    m = S.find_mixer(S.discover_shards(str(image_export)))
    assert m.path.endswith("tiny-mixer.json") and m.total_patches == 10 and m.patch_dimensions == (8, 8)
    assert S.find_mixer(S.discover_shards(str(shared_data / "gee-aces-points/training*.tfrecord.gz"))) is None
    S.check_mixer(m, [4, 3, 3])
    with pytest.raises(MixerError, match="totalPatches 10 but the shards hold 9"):
        S.check_mixer(m, [4, 3, 2])
    bad = tmp_path / "bad-mixer.json"
    bad.write_text('{"patchDimensions": [8, 8]}')
    with pytest.raises(MixerError, match="totalPatches"):
        S.find_mixer([], str(bad))
    with pytest.raises(MixerError, match="not found"):
        S.find_mixer([], str(tmp_path / "none.json"))
