"""harness/data/export/records.py: records read and decoded as tf.train.Example, their schema, and what is refused.
Framing faults (truncated, corrupt, wrong compression) are in test_bad_input.py and test_discovery_faults.py."""
import pytest
import tensorflow as tf

from example_records import example, write
from harness.data.export import records, shards as S, synth
from harness.errors import NotExampleError


def test_schema_of_a_synthetic_image_record(tmp_path):
    synth.write_image_export(str(tmp_path), prefix="img", shards=1, records=2, bands=["B3", "B2"], label="landcover",
                             classes=3, patch_size=8, kernel_size=4, dtype="bytes", seed=0)
    (shard,) = S.discover_shards(str(tmp_path))
    (ex,) = records.first_examples(shard, 1)
    schema = records.schema_of(ex)
    assert list(schema) == ["B2", "B3", "landcover"]  # sorted by name, not in the order written
    assert schema["B2"] == records.FeatureInfo(records.BYTES, 1, 12 * 12)  # one uint8 string of (8 + 4)^2 bytes
    assert schema["landcover"] == records.FeatureInfo(records.FLOAT, 144, 0)


def test_schema_of_int64_and_empty_features():
    ex = example(n=[3, 4, 5], x=[1.5])
    ex.features.feature["gap"].Clear()  # present with no list set, as TFX writes a missing value
    assert records.schema_of(ex) == {"gap": records.FeatureInfo(records.EMPTY, 0),
                                     "n": records.FeatureInfo(records.INT64, 3),
                                     "x": records.FeatureInfo(records.FLOAT, 1)}


def test_first_examples_counts_and_decodes_in_order(tmp_path):
    paths = synth.write_table_export(str(tmp_path), prefix="pts", shards=2, records=5, bands=["a"], dtype="int64",
                                     seed=3)
    first, second = S.discover_shards(str(tmp_path))
    assert [len(records.first_examples(first, n)) for n in (1, 2, 10)] == [1, 2, 3]  # 5 records: 3 + 2
    assert len(records.first_examples(second, 10)) == 2
    raw = list(tf.data.TFRecordDataset(paths[0], compression_type="GZIP").as_numpy_iterator())
    assert records.first_examples(first, 3) == [tf.train.Example.FromString(r) for r in raw]
    assert records.read_records(first, 2) == raw[:2]


def test_a_sequence_example_among_examples_is_refused_by_file_and_record(tmp_path):
    seq = tf.train.SequenceExample()
    seq.context.feature["id"].int64_list.value.append(1)
    seq.feature_lists.feature_list["frames"].feature.add().float_list.value.extend([0.5, 0.25])
    path = write(tmp_path / "seq.tfrecord", [example(a=[1.0]), seq.SerializeToString()])
    (shard,) = S.discover_shards(path)
    assert len(records.first_examples(shard, 1)) == 1  # record 0 is an Example
    with pytest.raises(NotExampleError, match=r"seq\.tfrecord: record 1 is a tf\.train\.SequenceExample, unlike "
                                              r"record 0 \(tf\.train\.Example\)"):
        records.first_examples(shard, 2)


def test_bytes_that_are_not_a_protobuf_are_refused():
    with pytest.raises(NotExampleError, match=r"^f\.tfrecord: record 7 is not a tf\.train\.Example \("):
        records.decode_example(b"\x0a\xff", path="f.tfrecord", index=7)  # field 1 with a length past the end
    assert records.decode_example(example(a=[2.0]).SerializeToString(), path="f", index=0) == example(a=[2.0])


def test_reading_zero_records_of_a_good_shard_is_empty(tmp_path):
    """`first_examples(shard, 0)` raised NotTFRecordError ("bytes but no complete record") on a good shard."""
    from harness.data.export import records, synth
    from harness.data.export.shards import discover_shards

    synth.write_table_export(str(tmp_path), prefix="t", shards=1, records=3, seed=0)
    shard = discover_shards([str(tmp_path)])[0]
    assert records.first_examples(shard, 0) == [] and len(records.first_examples(shard, 2)) == 2
