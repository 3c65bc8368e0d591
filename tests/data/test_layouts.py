"""Earth Engine's layout options read as Earth Engine writes them (docs/GEE_FORMAT.md): array bands (tensorDepths)
stored CHW, collapsed bands (collapseBands) with the label inside or beside, per-pixel SequenceExamples
(sequenceData), table array properties; in-process, on exports `harness.data.export.synth` writes and on records built
here value by value."""
import numpy as np
import pytest
import tensorflow as tf

from harness.data.export import inspect as inspect_lib
from harness.data.input import decode
from harness.data.export import records, synth
from harness.data.export import shards as S
from harness.data.spec import dataspec as SP, infer, validate
from harness.errors import FeatureLengthError, SpecError


def _float(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=np.asarray(values, np.float32).reshape(-1)))


def _write(path, protos):
    with tf.io.TFRecordWriter(str(path)) as w:
        for p in protos:
            w.write(p.SerializeToString())
    return S.discover_shards(str(path))


def _decode(spec, shard, n):
    return decode.decode(spec, tf.constant(records.read_records(shard, n)))


def _orders(values, labels) -> bool:
    """True when the labels are bins of `values` (sorting by the value sorts the labels): only the channel the
    export's label was cut from does this."""
    values, labels = np.ravel(values), np.ravel(labels)
    return bool(np.all(np.diff(labels[np.argsort(values, kind="stable")]) >= 0))


def test_an_array_band_is_read_depth_outermost_as_earth_engine_writes_it(tmp_path):
    """2x2 patch, band `ts` of depth 2 stored as the values 0..7: plane 0 is [[0, 1], [2, 3]] (CHW), not the
    pixels' pairs (HWC would give plane 0 = [[0, 2], [4, 6]])."""
    ex = tf.train.Example(features=tf.train.Features(feature={
        "ts": _float(np.arange(8)), "b": _float([10, 11, 12, 13]), "label": _float([0, 1, 1, 0])}))
    (shard,) = _write(tmp_path / "x-00000.tfrecord", [ex])
    spec = infer.infer_spec([shard])
    assert spec.to_config() == {"kind": "image", "bands": ["b", "ts"], "label": "label", "dtype": "float",
                                "patch_size": 2, "kernel_margin": 0, "depths": {"ts": 2}}
    assert spec.channels == ("b", "ts[0]", "ts[1]") and spec.input_shape == (2, 2, 3)
    x, y = _decode(spec, shard, 1)
    np.testing.assert_array_equal(x[0, ..., 1], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(x[0, ..., 2], [[4, 5], [6, 7]])
    np.testing.assert_array_equal(x[0, ..., 0], [[10, 11], [12, 13]])
    np.testing.assert_array_equal(y[0], [[0, 1], [1, 0]])


def test_an_array_band_export_delivers_the_plane_the_label_was_cut_from(tmp_path):
    files = synth.write_image_export(str(tmp_path), shards=2, records=4, bands=("B2", "ndvi", "B3"),
                                     depths={"ndvi": 3}, patch_size=8, kernel_size=2, label_from="ndvi[1]")
    shards = S.discover_shards(str(tmp_path))
    spec = infer.infer_spec(shards, mixer=S.find_mixer(shards))
    assert (spec.depths, spec.patch_size, spec.kernel_margin) == ({"ndvi": 3}, 8, 2)
    validate.validate_spec(spec, shards)
    x, y = _decode(spec, shards[0], 2)
    assert x.shape == (2, 10, 10, 5) and len(files) == 3
    assert [c for c in spec.channels if _orders(x[..., spec.channels.index(c)], y)] == ["ndvi[1]"]
    # a time axis over the array bands: [T, H, W, C]
    timed = spec.replace(bands=("ndvi",), group_delivery="time")
    assert timed.input_shape == (3, 10, 10, 1) and list(timed.band_groups) == ["t0", "t1", "t2"]
    assert _decode(timed, shards[0], 1)[0].shape == (1, 3, 10, 10, 1)
    with pytest.raises(SpecError, match=r"every band of one depth, got {'B2': 1, 'B3': 1, 'ndvi': 3}"):
        spec.replace(group_delivery="time")
    text = inspect_lib.format_text(inspect_lib.report([str(tmp_path)]))
    assert "3 x 10x10 (an array band of depth 3, or 3 collapsed bands)" in text and "depths: {ndvi: 3}" in text


@pytest.mark.parametrize("dtype", ["float", "int64"])
def test_collapsed_bands_named_by_the_bands_flag_with_the_label_inside(tmp_path, dtype):
    """collapseBands writes one feature named after the first band: --bands names the others in order; one plane
    more is the label (last, as addBands puts it); int64 bands and a float label are promoted to float."""
    synth.write_image_export(str(tmp_path), shards=2, records=4, bands=("B1", "B2", "B3", "B4"), collapse=True,
                             patch_size=8, label_from="B3", dtype=dtype)
    shards = S.discover_shards(str(tmp_path))
    declared = {"bands": ["B1", "B2", "B3", "B4"], "label": "landcover"}
    schema = infer.read_schema(shards)
    assert list(schema) == ["B1"] and schema["B1"].dtype == "float" and schema["B1"].length == 5 * 64
    inferred = infer.infer_spec(shards, mixer=S.find_mixer(shards), label="landcover", declared=declared)
    spec = infer.refine(inferred, declared)
    assert spec.collapsed == {"B1": ("B1", "B2", "B3", "B4", "landcover")} and spec.features == ("B1",)
    assert SP.DataSpec.from_config(spec.to_config()) == spec
    validate.validate_spec(spec, shards)
    x, y = _decode(spec, shards[0], 2)
    assert x.shape == (2, 8, 8, 4) and y.dtype == tf.int32
    assert [c for c in spec.channels if _orders(x[..., spec.channels.index(c)], y)] == ["B3"]
    if dtype == "int64":
        assert np.all(x.numpy() == np.round(x.numpy())) and x.numpy().max() > 255  # DN values, kept whole
    with pytest.raises(SpecError, match=r"feature 'B1' holds 5 planes .* name 3"):
        infer.refine(inferred, {"bands": ["B1", "B2", "B3"], "label": "landcover"})


def test_collapsed_bands_declared_in_the_config_with_the_label_beside(tmp_path):
    """The label exported beside the collapsed tensor (its own feature); the config names the planes, one of them
    an array band of depth 2."""
    side = 4
    planes = np.arange(4 * side * side, dtype=np.float32).reshape(4, side, side)
    label = (planes[2] > planes[2].mean()).astype(np.float32)
    ex = tf.train.Example(features=tf.train.Features(feature={"red": _float(planes), "lc": _float(label)}))
    shards = _write(tmp_path / "c-00000.tfrecord", [ex])
    declared = {"collapsed": {"red": ["red", "ts", "nir"]}, "depths": {"ts": 2}, "label": "lc"}
    spec = infer.refine(infer.infer_spec(shards, label="lc", declared=declared), declared)
    assert spec.bands == ("red", "ts", "nir") and spec.channels == ("red", "ts[0]", "ts[1]", "nir")
    validate.validate_spec(spec, shards)
    x, y = _decode(spec, shards[0], 1)
    for i in range(4):
        np.testing.assert_array_equal(x[0, ..., i], planes[i])
    np.testing.assert_array_equal(y[0], label)
    wrong = SP.DataSpec.from_config({**spec.to_config(), "depths": {"ts": 3}})
    with pytest.raises(FeatureLengthError, match=r"band 'red': expected 80 values .*5 planes \(collapsed red, ts, "
                                                 r"nir\)\), found 64"):
        validate.validate_spec(wrong, shards)


def test_per_pixel_sequences_are_a_table_with_the_steps_as_channels(tmp_path):
    synth.write_image_export(str(tmp_path), shards=2, records=2, bands=("elev", "ndvi"), depths={"ndvi": 5},
                             sequence=True, patch_size=4, label_from="ndvi[3]")
    shards = S.discover_shards(str(tmp_path))
    spec = infer.infer_spec(shards, mixer=S.find_mixer(shards))
    assert spec.to_config() == {"kind": "table", "bands": ["elev", "ndvi"], "label": "landcover", "dtype": "float",
                                "depths": {"ndvi": 5}, "sequence": True}
    validate.validate_spec(spec, shards)
    x, y = _decode(spec, shards[0], 16)   # one patch: 16 pixels, row-major
    assert x.shape == (16, 6)
    assert [c for c in spec.channels if _orders(x[:, spec.channels.index(c)], y)] == ["ndvi[3]"]
    timed = spec.replace(bands=("ndvi",), group_delivery="time")
    assert _decode(timed, shards[0], 4)[0].shape == (4, 5, 1)


def test_a_short_feature_list_is_padded_and_a_long_one_named(tmp_path):
    def pixel(steps):
        return tf.train.SequenceExample(
            context=tf.train.Features(feature={"y": _float([1])}),
            feature_lists=tf.train.FeatureLists(feature_list={"v": tf.train.FeatureList(
                feature=[_float([s + 1]) for s in range(steps)])}))
    shards = _write(tmp_path / "p-00000.tfrecord", [pixel(4), pixel(2)])
    spec = infer.infer_spec(shards, label="y")
    assert spec.depths == {"v": 4} and spec.sequence
    x, _ = _decode(spec, shards[0], 2)
    np.testing.assert_array_equal(x, [[1, 2, 3, 4], [1, 2, 0, 0]])   # padded with 0, as tensorDepths pads
    long = _write(tmp_path / "q-00000.tfrecord", [pixel(6)])
    with pytest.raises(FeatureLengthError, match=r"q-00000.tfrecord: record 0: band 'v': expected up to 4 steps "
                                                 r"\(depth 4\), found 6"):
        validate.validate_spec(spec, long)


def test_a_table_array_property_is_an_array_band(tmp_path):
    synth.write_table_export(str(tmp_path), records=64, bands=("a", "ts"), depths={"ts": 4}, label_from="ts[2]")
    shards = S.discover_shards(str(tmp_path))
    spec = infer.infer_spec(shards)
    assert spec.depths == {"ts": 4} and spec.input_shape == (5,)
    x, y = _decode(spec, shards[0], 64)
    assert [c for c in spec.channels if _orders(x[:, spec.channels.index(c)], y)] == ["ts[2]"]


@pytest.mark.parametrize("config, message", [
    ({"bands": ["a"], "depths": {"a": 0}}, r"data.depths.a: expected a positive integer, got 0"),
    ({"bands": ["a"], "depths": [3]}, r"data.depths: expected a mapping band: depth"),
    ({"bands": ["a"], "label": "y", "depths": {"y": 2}}, r"label 'y' has depth 2"),
    ({"bands": ["a"], "collapsed": {"a": ["a", "b"]}}, r"collapsed bands are an image export option"),
    ({"kind": "image", "patch_size": 4, "bands": ["a", "b"], "collapsed": {"a": ["a", "b"], "c": ["b"]}},
     r"band 'b' is in two collapsed features"),
    ({"kind": "image", "patch_size": 4, "bands": ["a"], "sequence": True}, r"sequence .* kind table"),
])
def test_layout_config_errors_name_the_key(config, message):
    with pytest.raises(SpecError, match=message):
        SP.DataSpec.from_config(config)


def test_input_nodata_is_left_out_of_the_statistics_and_delivered_as_the_mean(tmp_path):
    """Earth Engine pads an array shorter than its depth with defaultValue (0): declared as input_nodata, the
    padding is not averaged into the band statistics, and the pipeline delivers it as the channel's mean (0 once
    normalized), in training as in predict (the fill is part of the spec)."""
    from harness.train.model.builtin import band_moments

    rows = [[1.0, 3.0, 0.0], [2.0, 5.0, 0.0], [3.0, 0.0, 0.0]]  # ts[1] padded in row 2, ts[2] never measured
    protos = [tf.train.Example(features=tf.train.Features(feature={"ts": _float(r), "y": _float([i % 2])}))
              for i, r in enumerate(rows)]
    (shard,) = _write(tmp_path / "t.tfrecord", protos)
    spec = infer.infer_spec([shard], label="y").replace(input_nodata=0)
    raw = tf.data.Dataset.from_tensors(_decode(spec, shard, 3))
    mean, variance = band_moments(raw, nodata=spec.input_nodata)
    np.testing.assert_allclose(mean, [2.0, 4.0, 0.0])
    np.testing.assert_allclose(variance, [2 / 3, 1.0, 1.0])   # a channel with no valid value: mean 0, variance 1
    filled = spec.replace(input_fill=SP.input_fill(spec, mean))
    assert filled.input_fill == {"ts[0]": 2.0, "ts[1]": 4.0, "ts[2]": 0.0}
    assert SP.DataSpec.from_config(filled.to_config()).to_config() == filled.to_config()
    x, _ = _decode(filled, shard, 3)
    np.testing.assert_array_equal(x, [[1, 3, 0], [2, 5, 0], [3, 4, 0]])
    grouped = filled.replace(group_delivery="time", input_fill={})
    assert SP.input_fill(grouped, np.array([7.0])) == {"ts[0]": 7.0, "ts[1]": 7.0, "ts[2]": 7.0}
