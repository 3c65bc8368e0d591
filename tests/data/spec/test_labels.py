"""The label rule (harness/data/spec/labels.py): one function, used by the pipeline, the scan and the job's check."""
import numpy as np
import pytest

from harness.data.spec import labels
from harness.data.input import pipeline, stages
from harness.data.export import scan, synth
from harness.data.export.shards import discover_shards
from harness.data.spec.infer import infer_spec
from harness.errors import LabelValueError


def test_rule_on_values():
    values = np.array([0.0, 3.0, 2.5, -1.0, np.nan, np.inf, 7.0])
    assert labels.is_class_id(values).numpy().tolist() == [True, True, False, False, False, False, True]
    assert labels.is_class_id(values, 5).numpy().tolist() == [True, True, False, False, False, False, False]
    assert labels.is_class_id(np.array([0, 4, 5, -2]), 5).numpy().tolist() == [True, True, False, False]


@pytest.mark.parametrize("value, words", [(7.0, "declare --num-classes 8"), (2.5, "class ids are integers >= 0"),
                                          (float("inf"), "class ids are integers >= 0")])
def test_error_names_the_place_and_the_fix(value, words):
    error = labels.not_a_class_id_error("f.tfrecord.gz: record 3", "landcover", value, 5)
    assert isinstance(error, LabelValueError)
    assert str(error).startswith(f"f.tfrecord.gz: record 3: label 'landcover' holds {value!r}") and words in str(error)


def test_pipeline_scan_and_job_check_agree(tmp_path):
    """An infinite label: the pipeline's batch check fails, the scan names the record, the job's first-record
    check refuses it: the same rule on all three paths (inf passed the pipeline before, as inf == round(inf))."""
    import tensorflow as tf

    synth.write_table_export(str(tmp_path), prefix="t", shards=1, records=8, seed=0)
    shards = discover_shards([str(tmp_path)])
    spec = infer_spec(shards, label="class")
    path = shards[0].path
    records = list(tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator())
    bad = tf.train.Example.FromString(records[0])
    bad.features.feature["class"].float_list.value[:] = [float("inf")]
    records[0] = bad.SerializeToString()
    with tf.io.TFRecordWriter(path, "GZIP") as w:
        for r in records:
            w.write(r)
    shards = discover_shards([str(tmp_path)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels must be class ids"):
        list(pipeline.build_dataset(shards, spec, stages.PipelineOptions(per_replica_batch_size=4, training=False)))
    assert scan.first_bad_label(spec, shards, None) == (path, 0, float("inf"))
    with pytest.raises(LabelValueError, match=r"record 0: label 'class' holds inf"):
        labels.check_first_labels(spec, shards)


def test_declared_nodata_passes_the_rule_and_is_delivered_as_ignored(tmp_path):
    """Labels 255 (nodata) in a table export of 4 classes: outside the classes unless declared `ignore_label: 255`;
    then the job's check and the scan pass them and the pipeline delivers them as IGNORED (-1), never as class 255. A
    regression label's nodata is delivered as NaN."""
    import tensorflow as tf

    synth.write_table_export(str(tmp_path), prefix="t", shards=1, records=8, seed=0)
    shards = discover_shards([str(tmp_path)])
    path = shards[0].path
    records = [tf.train.Example.FromString(r)
               for r in tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator()]
    stored = [ex.features.feature["class"].float_list.value[0] for ex in records]
    for i in (1, 4):
        records[i].features.feature["class"].float_list.value[:] = [255.0]
    with tf.io.TFRecordWriter(path, "GZIP") as w:
        for ex in records:
            w.write(ex.SerializeToString())
    shards = discover_shards([str(tmp_path)])
    spec = infer_spec(shards, label="class")
    assert scan.first_bad_label(spec, shards, 4) == (path, 1, 255.0)  # undeclared: class 255, not one of 4
    spec = spec.replace(ignore_label=255, num_classes=4)
    labels.check_first_labels(spec, shards)
    assert scan.first_bad_label(spec, shards, 4) is None
    options = stages.PipelineOptions(per_replica_batch_size=8, training=False)
    (_, got), = list(pipeline.build_dataset(shards, spec, options))
    want = [labels.IGNORED if i in (1, 4) else int(v) for i, v in enumerate(stored)]
    assert got.numpy().tolist() == want and got.dtype == tf.int32
    (_, values), = list(pipeline.build_dataset(shards, spec.replace(task="regression", num_classes=None), options))
    assert np.isnan(values.numpy()[[1, 4]]).all() and np.isfinite(np.delete(values.numpy(), [1, 4])).all()


def _rewrite(path, records):
    import tensorflow as tf

    with tf.io.TFRecordWriter(path, "GZIP") as w:
        for ex in records:
            w.write(ex.SerializeToString())


def test_a_nan_regression_label_is_named_not_a_nan_loss(tmp_path):
    """A regression label NaN at record 20 of 40 (past the job's first-record check): the pipeline's batch check
    fails (before, the loss went NaN some steps later, naming no record), the scan names file, record and value,
    also with an unrelated ignore_label declared (NaN is not silently nodata); at record 0 the job's check refuses
    it before training; the declared nodata value passes and is delivered as NaN."""
    import tensorflow as tf

    synth.write_table_export(str(tmp_path), prefix="t", shards=1, records=40, seed=0)
    path = discover_shards([str(tmp_path)])[0].path
    records = [tf.train.Example.FromString(r)
               for r in tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator()]
    records[20].features.feature["class"].float_list.value[:] = [float("nan")]
    _rewrite(path, records)
    shards = discover_shards([str(tmp_path)])
    spec = infer_spec(shards, label="class").replace(task="regression", num_classes=None)
    assert labels.is_label_value(np.array([0.5, np.nan, -np.inf, 5.0]), "regression", None, 5).numpy().tolist() == \
        [True, False, False, True]
    labels.check_first_labels(spec, shards)  # records 0-15 are finite
    options = stages.PipelineOptions(per_replica_batch_size=8, training=False)
    for declared in (None, 5.0):
        s = spec.replace(ignore_label=declared)
        with pytest.raises(tf.errors.InvalidArgumentError, match="or finite \\(regression\\)") as raised:
            list(pipeline.build_dataset(shards, s, options))
        named = scan.named_error(raised.value, s, None, shards)
        assert isinstance(named, LabelValueError)
        assert str(named).startswith(f"{path}: record 20: label 'class' holds nan: regression labels must be finite")
    records[20].features.feature["class"].float_list.value[:] = [1.0]
    records[0].features.feature["class"].float_list.value[:] = [float("inf")]
    records[3].features.feature["class"].float_list.value[:] = [-9999.0]
    _rewrite(path, records)
    with pytest.raises(LabelValueError, match=r"record 0: label 'class' holds inf: regression labels must be finite"):
        labels.check_first_labels(spec, shards)
    records[0].features.feature["class"].float_list.value[:] = [2.0]
    _rewrite(path, records)
    s = spec.replace(ignore_label=-9999.0)
    labels.check_first_labels(s, shards)
    assert scan.first_bad_label(s, shards, None) is None
    values = np.concatenate([y.numpy() for _, y in pipeline.build_dataset(shards, s, options)])
    assert np.flatnonzero(np.isnan(values)).tolist() == [3] and values[0] == 2.0
