"""Every bad input of the issue: a named error whose message names file, record and feature; nothing lost."""
import gzip
import shutil

import numpy as np
import pytest

from example_records import example as _example, write as _write
from harness.data.export import index, records, shards as S
from harness.data.spec import dataspec as SP, infer, validate
from harness.errors import (CompressionMismatchError, EmptyFeatureError, FeatureDtypeError, FeatureLengthError,
                            MissingFeatureError, MissingShardError, NotExampleError, NotTFRecordError,
                            SchemaDriftError, TruncatedShardError)


def _patch_spec(**kw):
    return SP.DataSpec(kind="image", bands=("B1",), label="landcover", patch_size=4, **kw)


def test_gzip_presented_as_uncompressed(table_export):
    path = str(next(table_export.glob("*.gz")))
    with pytest.raises(CompressionMismatchError, match="declared uncompressed"):
        records.read_records(S.Shard(path, "p", None, ""), 1)


def test_uncompressed_presented_as_gzip(tmp_path):
    path = _write(tmp_path / "u.tfrecord", [_example(a=[1.0])])
    with pytest.raises(CompressionMismatchError, match="declared GZIP"):
        records.read_records(S.Shard(path, "p", None, "GZIP"), 1)
    with pytest.raises(CompressionMismatchError):
        index.count_shard(S.Shard(path, "p", None, "GZIP"))


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_shard_reports_last_good_record(tmp_path, gz):
    rng = np.random.default_rng(0)  # incompressible values: the cut falls inside the GZIP stream too
    path = _write(tmp_path / "t.tfrecord", [_example(a=rng.random(2000).tolist()) for i in range(6)], gz=gz)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) * 2 // 3 + 101])  # inside a record, not at a boundary
    (shard,) = S.discover_shards(path)
    with pytest.raises(TruncatedShardError, match=r"t\.tfrecord.*last good record index \d"):
        index.record_counts([shard], use_cache=False)


def test_truncated_inside_a_record_header(tmp_path):
    # TensorFlow itself stops silently here; the size check catches it.
    path = _write(tmp_path / "h.tfrecord", [_example(a=[1.0])] * 3)
    with open(path, "ab") as f:
        f.write(b"\x05\x00\x00")
    with pytest.raises(TruncatedShardError, match="last good record index 2"):
        index.record_counts(S.discover_shards(path), use_cache=False)


def test_missing_feature_names_closest_key(tmp_path):
    path = _write(tmp_path / "m.tfrecord", [_example(B1=[0.0] * 16, landcover=[1.0] * 16)])
    spec = SP.DataSpec(kind="image", bands=("B1",), label="Landcover", patch_size=4)
    with pytest.raises(MissingFeatureError, match=r"m\.tfrecord: record 0: label 'Landcover'.*'landcover'"):
        validate.validate_spec(spec, S.discover_shards(path))


def test_band_with_wrong_number_of_values(tmp_path):
    path = _write(tmp_path / "l.tfrecord", [_example(B1=[0.0] * 256, landcover=[1.0] * 16)])
    with pytest.raises(FeatureLengthError, match=r"record 0: band 'B1': expected 16 values \(4x4.*256 = 16x16"):
        validate.validate_spec(_patch_spec(), S.discover_shards(path))


def test_label_declared_int64_stored_float(shared_data):
    found = S.discover_shards(str(shared_data / "gee-aces-points/testing.tfrecord.gz"))
    spec = SP.DataSpec(kind="table", bands=("red_before",), label="class", dtypes={"class": "int64"})
    with pytest.raises(FeatureDtypeError, match=r"testing\.tfrecord\.gz: record 0: label 'class': expected dtype "
                                                r"int64, found float"):
        validate.validate_spec(spec, found)


def test_feature_present_but_empty(shared_data, tmp_path):
    # TFX writes an always-empty `pickup_census_tract` (a Feature with no list set).
    found = S.discover_shards(str(shared_data / "tfx/tfx/components/testdata/csv_example_gen/Split-eval"))
    spec = SP.DataSpec(kind="table", bands=("fare", "pickup_census_tract"), label="tips")
    with pytest.raises(EmptyFeatureError, match="'pickup_census_tract' is present but holds no values"):
        validate.validate_spec(spec, found)
    path = _write(tmp_path / "e.tfrecord", [_example(B1=[], landcover=[1.0] * 16)])
    with pytest.raises(EmptyFeatureError, match=r"e\.tfrecord: record 0: band 'B1'"):
        validate.validate_spec(_patch_spec(), S.discover_shards(path))


def test_zero_record_shards_counted_not_fatal(shared_data, caplog):
    folder = shared_data / "deepconsensus/at_6c6d9eb8/deepconsensus/testdata/ecoli/output/tf_examples"
    found = S.discover_shards(str(folder / "*/*.gz"))
    assert index.record_counts(found) == [0, 0, 253]
    spec = SP.DataSpec(kind="table", bands=("subreads/num_passes",), dtypes={"subreads/num_passes": "int64"})
    report = validate.validate_spec(spec, found)
    assert len(report.empty) == 2 and len(report.checked) == 1
    assert "zero-record" in caplog.text


@pytest.mark.parametrize("content", [b"hello, this is not a TFRecord file at all" * 4, b"abc"])
def test_not_a_tfrecord_file(tmp_path, content):
    path = tmp_path / "junk.tfrecord"
    path.write_bytes(content)
    (shard,) = S.discover_shards(str(path))
    with pytest.raises(NotTFRecordError, match="junk.tfrecord"):
        records.read_records(shard, 1)
    with pytest.raises(NotTFRecordError):
        index.count_shard(shard)


def test_gzip_of_garbage_is_not_tfrecord(tmp_path):
    path = tmp_path / "junk.gz"
    path.write_bytes(gzip.compress(b"not a record " * 20))
    with pytest.raises(NotTFRecordError):
        records.read_records(S.discover_shards(str(path))[0], 1)


def test_a_real_sequence_example_is_read_as_one(shared_data):
    """TFX's SequenceExamples (context f, i; a bytes feature list s) are read as such, never as empty Examples:
    the context's numbers are the bands of a sequence spec, the bytes list is no band."""
    found = S.discover_shards(str(shared_data / "tfx/tfx/components/testdata/tfrecord_sequence/Split-train"))
    schema = infer.read_schema(found)
    assert schema["s"].sequence and schema["s"].dtype == "bytes" and not schema["f"].sequence
    assert infer.infer_spec(found).to_config() == {"kind": "table", "bands": ["f", "i"],
                                                "dtypes": {"f": "float", "i": "int64"}, "sequence": True}


def test_other_protobuf_is_not_an_example(shared_data):
    folder = shared_data / "deepconsensus/at_6c6d9eb8/deepconsensus/testdata/ecoli/output"
    for pattern in ("predictions/*.gz", "labels/*.gz"):
        with pytest.raises(NotExampleError, match="record 0"):
            validate.validate_spec(SP.DataSpec(kind="table", bands=("x",)), S.discover_shards(str(folder / pattern)))


def test_missing_shard_index(tmp_path):
    for i in (0, 2):
        _write(tmp_path / f"exp-{i:05d}.tfrecord", [_example(a=[1.0])])
    with pytest.raises(MissingShardError, match="00001"):
        S.discover_shards(str(tmp_path))


def test_shards_whose_schemas_differ(shared_data, tmp_path):
    # The same TFX columns, written with other dtypes: trip_seconds int64 in one shard, float in the other.
    base = shared_data / "tfx/tfx/components/testdata"
    a = tmp_path / "mix-00000-of-00002.gz"
    b = tmp_path / "mix-00001-of-00002.gz"
    shutil.copy(base / "csv_example_gen/Split-eval/data_tfrecord-00000-of-00012.gz", a)
    shutil.copy(base / "external/tfrecord/data_tfrecord-00000-of-00002.gz", b)
    found = S.discover_shards(str(tmp_path))
    spec = infer.infer_spec(found, label="tips")
    with pytest.raises(SchemaDriftError, match=r"mix-00001-of-00002\.gz: record 0: band '\w+': expected dtype "
                                               r"int64, found float"):
        validate.validate_spec(spec, found)
