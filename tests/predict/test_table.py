"""Table exports (points): one output row per input record in input order, the kept properties (by default the
ids and coordinates, and the run's label as the truth) then the predictions, as CSV (parts per input shard and the
whole table) or TFRecord; under 1 and 2 workers; an upload line only for rows with a location."""
import csv
import json

import numpy as np
import pytest
import tensorflow as tf
from predict_support import read_outputs

from harness.data.export import synth
from harness.distribute.context import Backend, WorkerContext
from harness.errors import ConfigError, MissingFeatureError
from harness.data.spec.dataspec import DataSpec
from harness.predict import identity
from harness.predict.job import run
from harness.predict.options import PredictOptions

BANDS = ["a", "b", "c", "d"]


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    out = tmp_path_factory.mktemp("points")
    synth.write_table_export(str(out), prefix="points", shards=3, records=50, bands=BANDS, label="class",
                             classes=3, seed=5)
    rows = []
    for path in sorted(out.glob("*.tfrecord.gz")):   # each point given an id and coordinates, as users export them
        examples = [tf.train.Example.FromString(raw.numpy())
                    for raw in tf.data.TFRecordDataset(str(path), compression_type="GZIP")]
        with tf.io.TFRecordWriter(str(path), "GZIP") as w:
            for ex in examples:
                f = ex.features.feature
                f["system:index"].bytes_list.value.append(f"{path.name[7:12]}_{len(rows)}".encode())
                f["longitude"].float_list.value.append(89.0 + len(rows) / 100)
                f["latitude"].float_list.value.append(27.0 - len(rows) / 100)
                w.write(ex.SerializeToString())
                rows.append({k: f[k].float_list.value[0] for k in [*BANDS, "class", "longitude"]})
    return out, rows


@pytest.fixture(scope="module")
def two_class_model(tmp_path_factory):
    """Logits [b - a, 0] of the bands a, b: class 0 where b > a."""
    import tf_keras as keras

    x = keras.Input((4,))
    dense = keras.layers.Dense(2, use_bias=False)
    y = dense(x)
    dense.set_weights([np.array([[-1, 0], [1, 0], [0, 0], [0, 0]], np.float32)])
    path = tmp_path_factory.mktemp("table_model") / "m.keras"
    keras.Model(x, y).save(str(path))
    # the run's spec beside it, as `harness train` writes it: its label is written as the truth
    spec = DataSpec(kind="table", bands=tuple(BANDS), label="class", num_classes=3)
    (path.parent / "summary.json").write_text(json.dumps({"spec": spec.to_config()}))
    return path


def _options(model, data, out, **kw):
    return PredictOptions(model=str(model), data=(str(data),), output=str(out), batch_size=7, **kw)


def _worker(rank, workers):
    return WorkerContext(rank, workers, 0, 1, "worker", rank, Backend.MULTI_WORKER if workers > 1 else Backend.SINGLE)


@pytest.mark.parametrize("workers", [1, 2])
def test_csv_one_row_per_record_in_order(points, two_class_model, tmp_path, workers):
    data, rows = points
    out, lines = tmp_path / "out", []
    options = _options(two_class_model, data, out, output_bands=("predicted", "p0", "p1"), probabilities=True)
    for rank in range(workers):
        run(options, context=_worker(rank, workers), say=lines.append)
    with open(out / "points.csv") as f:
        table = list(csv.DictReader(f))
    # by default the id and the coordinates, then the label as the truth (a class id), then the predictions
    assert list(table[0]) == ["system:index", "longitude", "latitude", "class_true", "predicted", "p0", "p1"]
    assert len(table) == len(rows) == 50
    assert [r["class_true"] for r in table] == [str(int(r["class"])) for r in rows]   # in input order
    assert [r["system:index"] for r in table[:2]] == ["00000_0", "00000_1"] and table[-1]["system:index"] == "00002_49"
    assert [np.float32(r["longitude"]) for r in table] == [np.float32(r["longitude"]) for r in rows]
    assert [int(r["predicted"]) for r in table] == [0 if r["b"] > r["a"] else 1 for r in rows]
    p0 = 1 / (1 + np.exp(-np.array([np.float32(r["b"]) - np.float32(r["a"]) for r in rows])))
    np.testing.assert_allclose([float(r["p0"]) for r in table], p0, rtol=1e-5)
    assert sorted(p.name for p in out.glob("points-*.csv")) == [f"points-{i:05d}.csv" for i in range(3)]
    copy = lines.index(f"gcloud storage cp {out}/points.csv gs://BUCKET/PATH/")   # the chief's, then the upload
    assert lines[copy + 1] == ("earthengine upload table --asset_id=projects/my-project/assets/predictions "
                               "--x_column=longitude --y_column=latitude gs://BUCKET/PATH/points.csv")


def test_tfrecord_rows(points, two_class_model, tmp_path):
    data, rows = points
    result = run(_options(two_class_model, data, tmp_path / "out", keep=("class", "a"), format="tfrecord",
                          output_bands=("predicted",)), context=WorkerContext.single(), say=lambda line: None)
    got = read_outputs(result["outputs"])
    assert [r["predicted"].tolist() for r in got] == [[0 if r["b"] > r["a"] else 1] for r in rows]
    assert [r["predicted"].dtype for r in got[:1]] == [np.int64]
    assert [np.float32(r["a"][0]) for r in got] == [np.float32(r["a"]) for r in rows]


def test_rows_without_a_location_get_no_upload_line_but_the_reason(points, two_class_model, tmp_path):
    data, rows = points
    lines = []
    result = run(_options(two_class_model, data, tmp_path / "out", keep=("system:index",)),
                 context=WorkerContext.single(), say=lines.append)
    with open(tmp_path / "out" / "points.csv") as f:
        assert next(csv.reader(f)) == ["system:index", "class_true", "class"]
    assert result["upload"] == [] and identity.NO_LOCATION in lines and not any("earthengine" in x for x in lines)


def test_identifying_names_and_location_flags():
    names = ["B2", "system:index", "Longitude", "lat", "x", "plot_id", "class", "ndvi"]
    assert identity.identifying(names, exclude=["B2", "class"]) == ["plot_id", "system:index", "Longitude", "lat",
                                                                     "x"]
    assert identity.location_flags(["id", "Longitude", "lat"]) == ["--x_column=Longitude", "--y_column=lat"]
    assert identity.location_flags(["id", ".geo", "lon", "lat"]) == ["--primary_geometry_column=.geo"]
    assert identity.location_flags(["x", "y", "lon"]) is None


def test_keep_errors(points, two_class_model, tmp_path):
    data, _ = points
    with pytest.raises(MissingFeatureError, match=r"--keep 'id' is absent from the records"):
        run(_options(two_class_model, data, tmp_path / "a", keep=("id",)), context=WorkerContext.single())
    with pytest.raises(ConfigError, match=r"--keep 'class' has the name of a prediction column"):
        run(_options(two_class_model, data, tmp_path / "b", keep=("class",)), context=WorkerContext.single())
