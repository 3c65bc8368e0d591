"""harness/data/export/scan.py: the full scan that names the first bad record or label, and TensorFlow errors given
names."""
import pytest
import tensorflow as tf

from example_records import example as _example, write as _write
from harness.data.input import pipeline as P, stages
from harness.data.export import scan, shards as S
from harness.data.spec import dataspec as SP, validate
from harness.errors import FeatureLengthError, LabelValueError, MissingFeatureError


def test_missing_feature_after_the_first_record_is_traced_to_file_and_record(tmp_path):
    good = [_example(a=[float(i)], b=[1.0], cls=[0.0]) for i in range(3000)]
    bad = list(good)
    bad[2500] = _example(a=[1.0], cls=[0.0])  # `b` lost in the third read batch of the scan
    _write(tmp_path / "x-00000.tfrecord.gz", good, gz=True)
    _write(tmp_path / "x-00001.tfrecord.gz", bad, gz=True)
    shards = S.discover_shards(str(tmp_path))
    spec = SP.DataSpec(kind="table", bands=("a", "b"), label="cls")
    validate.validate_spec(spec, shards)  # the first records match: only a full scan finds record 2500
    err = scan.first_bad_record(spec, shards)
    assert isinstance(err, MissingFeatureError)
    assert str(err).startswith(f"{shards[1].path}: record 2500: band 'b' declared but absent")
    bad[2500] = _example(a=[1.0], b=[1.0, 2.0], cls=[0.0])
    _write(tmp_path / "x-00001.tfrecord.gz", bad, gz=True)
    err = scan.first_bad_record(spec, S.discover_shards(str(tmp_path)))
    assert isinstance(err, FeatureLengthError) and "record 2500: band 'b': expected 1 value (table), found 2" \
        in str(err)
    _write(tmp_path / "x-00001.tfrecord.gz", good, gz=True)
    assert scan.first_bad_record(spec, S.discover_shards(str(tmp_path))) is None


def test_labels_that_are_not_class_ids_fail_the_batch(tmp_path):
    for value, num_classes in ((1.5, None), (float("nan"), None), (-1.0, None), (float("inf"), 3), (7.0, 3)):
        labels = [0.0, 1.0, value, 2.0]
        path = tmp_path / f"l{len(list(tmp_path.iterdir()))}-00000.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for y in labels:
                feats = {"a": tf.train.Feature(float_list=tf.train.FloatList(value=[y])),
                         "class": tf.train.Feature(float_list=tf.train.FloatList(value=[y]))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
        found = S.discover_shards(str(path))
        spec = SP.DataSpec(kind="table", bands=("a",), label="class", num_classes=num_classes)
        with pytest.raises(tf.errors.InvalidArgumentError, match="labels must be class ids"):
            list(P.build_dataset(found, spec, stages.PipelineOptions(per_replica_batch_size=4, training=False)))
        assert scan.first_bad_label(spec, found, num_classes)[:2] == (found[0].path, 2)
        error = scan.bad_label_error(spec, found, num_classes)
        assert str(error).startswith(f"{found[0].path}: record 2: label 'class' holds ")
        assert ("declare --num-classes 8" if value == 7.0 else "class ids are integers >= 0") in str(error)


def test_tensorflow_errors_get_names():
    spec = SP.DataSpec(kind="table", bands=("a",), label="species")
    e = tf.errors.InvalidArgumentError(None, None, "Received a label value of 2 which is outside the valid range "
                                                   "of [0, 2).  Label values: 0 2 1")
    named = scan.named_error(e, spec, 2)
    assert isinstance(named, LabelValueError) and "value 2 is outside the 2 classes [0, 2)" in str(named)
    e = tf.errors.InvalidArgumentError(None, None, "Feature: dropoff (data type: int64) is required but could not "
                                                   "be found.")
    named = scan.named_error(e, spec, 2)
    assert isinstance(named, MissingFeatureError) and "'dropoff' (int64) is missing" in str(named)
    other = tf.errors.InvalidArgumentError(None, None, "something else")
    assert scan.named_error(other, spec, 2) is other
