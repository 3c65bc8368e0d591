import json

import numpy as np
import pytest
import tensorflow as tf

from harness import cli
from harness.data.input import pipeline as P, decode, stages
from harness.data.export import shards as S, synth
from harness.data.spec import dataspec as SP, infer, validate
from harness.errors import ConfigError


def test_inspect_real_points_cli(shared_data, capsys):
    paths = sorted(str(p) for p in (shared_data / "gee-aces-points").glob("*.gz"))
    assert cli.main(["inspect", *paths]) == 0
    out = capsys.readouterr().out
    for n in ("8316", "2385", "1219"):
        assert f"{n} records" in out
    assert cli.main(["inspect", "--json", *paths]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert len(rep["features"]) == 9 and all(f["dtype"] == "float" and f["values"] == 1 for f in rep["features"])
    assert "class" in {f["name"] for f in rep["features"]}
    assert sorted(s["records"] for s in rep["shards"]) == [1219, 2385, 8316]
    assert rep["config"]["data"]["label"] == "class" and rep["config"]["data"]["kind"] == "table"


def test_inspect_real_image_patch_shape(shared_data, capsys):
    assert cli.main(["inspect", str(shared_data / "gee-aces-image")]) == 0
    out = capsys.readouterr().out
    assert "65536" in out and "256x256" in out and "patchDimensions [256, 256]" in out
    assert "before: ['blue_before'" in out


def test_synth_then_inspect_round_trip_with_margin_and_mixer(tmp_path, capsys):
    out = tmp_path / "exp"
    assert cli.main(["synth", str(out), "--records", "5", "--shards", "2", "--patch-size", "6",
                     "--kernel-size", "4", "--bands", "a", "b", "--classes", "3", "--dtype", "int64"]) == 0
    files = capsys.readouterr().out.split()
    assert [f.rsplit("/", 1)[1] for f in files] == ["export-00000.tfrecord.gz", "export-00001.tfrecord.gz",
                                                    "export-mixer.json"]
    mixer = json.loads((out / "export-mixer.json").read_text())
    assert mixer["patchDimensions"] == [6, 6] and mixer["totalPatches"] == 5 and mixer["patchesPerRow"] == 3
    assert cli.main(["inspect", "--json", str(out)]) == 0
    rep = json.loads(capsys.readouterr().out)
    data = rep["config"]["data"]
    assert data["patch_size"] == 6 and data["kernel_margin"] == 4 and data["label"] == "landcover"
    assert data["dtypes"] == {"a": "int64", "b": "int64", "landcover": "float"}
    assert [s["records"] for s in rep["shards"]] == [3, 2] and rep["warnings"] == []
    assert rep["features"][0]["patch"] == "10x10 = 6x6 + margin 4"
    spec = SP.DataSpec.from_config(data)
    validate.validate_spec(spec, S.discover_shards(str(out)))


def test_margins_overlap_neighbours_exactly(tmp_path):
    synth.write_image_export(str(tmp_path), records=2, shards=1, bands=["a"], patch_size=4, kernel_size=2)
    (shard,) = S.discover_shards(str(tmp_path / "*.gz"))
    spec = infer.infer_spec([shard], mixer=S.find_mixer([shard]))
    serialized = [r.numpy() for r in tf.data.TFRecordDataset(shard.path, "GZIP")]
    left, right = decode.decode(spec, tf.constant(serialized))[0][..., 0].numpy()
    # stored 6x6 with 1 pixel margin each side: left's columns 4,5 are right's columns 0,1
    np.testing.assert_allclose(left[:, 4:6], right[:, 0:2])


@pytest.mark.parametrize("dtype", ["float", "int64", "bytes"])
def test_dtypes_parse_and_labels_learnable(tmp_path, dtype):
    synth.write_image_export(str(tmp_path), records=4, shards=1, bands=["a", "b", "c"], classes=3,
                             patch_size=16, dtype=dtype, seed=3)
    found = S.discover_shards(str(tmp_path))
    spec = infer.infer_spec(found, mixer=S.find_mixer(found))
    validate.validate_spec(spec, found)
    x, y = next(iter(P.build_dataset(found, spec, stages.PipelineOptions(per_replica_batch_size=4, training=False))))
    assert x.shape == (4, 16, 16, 3) and x.dtype == tf.float32 and y.dtype == tf.int32
    # A per-pixel linear classifier fitted by least squares beats the majority class by far.
    feats = np.c_[x.numpy().reshape(-1, 3), np.ones(4 * 256)]
    onehot = np.eye(3)[y.numpy().reshape(-1)]
    pred = feats @ np.linalg.lstsq(feats, onehot, rcond=None)[0]
    accuracy = (pred.argmax(1) == y.numpy().reshape(-1)).mean()
    majority = np.bincount(y.numpy().reshape(-1)).max() / y.numpy().size
    assert accuracy > max(0.8, majority + 0.2)


def test_table_export_names():
    with pytest.raises(ConfigError, match="records >= shards"):
        synth.write_table_export("/nonexistent-not-written", records=1, shards=2)


def test_inspect_shows_patches_only_for_features_of_the_patch_size(tmp_path, capsys):
    from harness.data.export import inspect as inspect_lib
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(tmp_path / "ids-00000.tfrecord.gz"), "GZIP") as w:
        for i in range(3):
            feats = {
                "B1": tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(64).tolist())),
                "B2": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(rng.integers(0, 255, 64,
                                                                                            dtype=np.uint8))])),
                "landcover": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i % 2)] * 64)),
                "tile_id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"tile%012d" % i])),  # 16 bytes
                "quality": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * 9)),  # an array property
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
    rep = inspect_lib.report([str(tmp_path)])
    patches = {f["name"]: f["patch"] for f in rep["features"]}
    assert patches == {"B1": "8x8", "B2": "8x8", "landcover": "8x8", "tile_id": "", "quality": ""}
    assert rep["config"]["data"]["kind"] == "image" and rep["config"]["data"]["bands"] == ["B1", "B2"]


def test_the_scenes_points_are_pixels_of_its_image_under_one_class_rule(tmp_path, capsys):
    """`harness synth --scene` (the README's no-data block): every point of every split is a distinct pixel of the
    image export (its 8 band values found at one pixel of the mosaic the mixer lays out), in the ACES layout."""
    assert cli.main(["synth", "--scene", str(tmp_path / "data"), "--seed", "3"]) == 0
    printed = capsys.readouterr().out.split()
    points, image = tmp_path / "data" / "gee-aces-points", tmp_path / "data" / "gee-aces-image"
    assert printed == [str(points / f"{s}.tfrecord.gz") for s in ("training", "validation", "testing")] + [
        str(image / "image_2021.tfrecord.gz"), str(image / "image_2021.json")]
    mixer = json.loads((image / "image_2021.json").read_text())
    side, per_row = mixer["patchDimensions"][0], mixer["patchesPerRow"]
    mosaic = np.zeros((per_row * side, per_row * side, len(synth.ACES_BANDS)), np.float32)
    for i, raw in enumerate(tf.data.TFRecordDataset(str(image / "image_2021.tfrecord.gz"), "GZIP")):
        f = tf.train.Example.FromString(raw.numpy()).features.feature
        r, c = divmod(i, per_row)
        mosaic[r * side:(r + 1) * side, c * side:(c + 1) * side] = np.stack(
            [np.reshape(f[b].float_list.value, (side, side)) for b in synth.ACES_BANDS], -1)
    at = {tuple(v): n for n, v in enumerate(mosaic.reshape(-1, mosaic.shape[-1]))}
    seen, counts = set(), {}
    for split in ("training", "validation", "testing"):
        rows = [tf.train.Example.FromString(raw.numpy()).features.feature
                for raw in tf.data.TFRecordDataset(str(points / f"{split}.tfrecord.gz"), "GZIP")]
        pixels = [at[tuple(np.float32([f[b].float_list.value[0] for b in synth.ACES_BANDS]))] for f in rows]
        seen |= set(pixels)
        counts[split] = (len(rows), len(set(pixels)), {int(f["class"].float_list.value[0]) for f in rows})
    assert {k: v[:2] for k, v in counts.items()} == {k: (n, n) for k, n in synth.SCENE_SPLITS.items()}
    assert len(seen) == sum(synth.SCENE_SPLITS.values())           # the splits share no pixel
    assert counts["training"][2] == set(range(5))                   # every class drawn
    with pytest.raises(ConfigError, match="40001 points asked of 4 patch"):
        synth.write_scene(str(tmp_path / "big"), splits={"training": 40001})
    before = (points / "training.tfrecord.gz").read_bytes()   # where the real exports are: never over them
    assert cli.main(["synth", "--scene", str(tmp_path / "data")]) == 2
    assert f"{points / 'training.tfrecord.gz'} exists (and 4 more): the stand-ins never overwrite an export" in \
        capsys.readouterr().err and (points / "training.tfrecord.gz").read_bytes() == before


def test_the_quicklook_draws_the_mosaic_the_mixer_lays_out(tmp_path, capsys):
    """`harness inspect EXPORT --quicklook OUT.png`: each pixel of the picture is the export's pixel at (scale *
    row, scale * column) of the mosaic (each patch cropped of its kernel margin, placed by the mixer), the band
    stretched between its 2nd and 98th percentile; the slot no patch fills is white; a table has no picture."""
    import matplotlib.image

    from harness.predict import maps

    synth.write_image_export(str(tmp_path / "img"), prefix="img", shards=2, records=5, patch_size=12,
                             kernel_size=4, bands=["B2", "B3", "B4"], seed=2)   # a 3 x 2 grid, the last slot empty
    assert cli.main(["inspect", str(tmp_path / "img"), "--quicklook", str(tmp_path / "q.png"),
                     "--quicklook-bands", "B3"]) == 0
    assert "quick-look: " + str(tmp_path / "q.png") + ": 36 x 24 pixels (1 export pixel(s) per pixel, 5 patches), " \
           "B3 as grey" in capsys.readouterr().out
    mosaic = np.full((24, 36), np.nan)
    for i, raw in enumerate(tf.data.TFRecordDataset(sorted(str(p) for p in (tmp_path / "img").glob("*.gz")),
                                                    "GZIP")):
        values = np.reshape(tf.train.Example.FromString(raw.numpy()).features.feature["B3"].float_list.value, (16, 16))
        r, c = divmod(i, 3)
        mosaic[r * 12:(r + 1) * 12, c * 12:(c + 1) * 12] = values[2:14, 2:14]   # the central P x P
    shards = S.discover_shards([str(tmp_path / "img")])
    mixer = S.find_mixer(shards)
    spec = infer.infer_spec(shards, mixer=mixer)
    for max_pixels, scale in ((36, 1), (18, 2)):
        out = maps.export_quicklook(shards, mixer, spec, ["B3"], str(tmp_path / f"q{scale}.png"),
                                    max_pixels=max_pixels)
        want = mosaic[::scale, ::scale]
        low, high = np.nanpercentile(want, (2, 98))
        want = np.nan_to_num(np.clip((want - low) / (high - low), 0, 1), nan=1.0)
        got = matplotlib.image.imread(tmp_path / f"q{scale}.png")[..., 0]
        assert (out["scale"], got.shape) == (scale, want.shape)
        np.testing.assert_allclose(got, want, atol=1 / 255 + 1e-6)
        assert (got[12 // scale:, 24 // scale:] == 1.0).all()   # the sixth slot: no patch, white
    # the same export with collapsed bands (one feature B2 of 3 planes, inferred as an array band): its plane 1,
    # B3's values, draws the same picture
    synth.write_image_export(str(tmp_path / "col"), prefix="col", shards=2, records=5, patch_size=12,
                             kernel_size=4, bands=["B2", "B3", "B4"], seed=2, collapse=True, label=None)
    assert cli.main(["inspect", str(tmp_path / "col"), "--quicklook", str(tmp_path / "c.png"),
                     "--quicklook-bands", "B2[1]"]) == 0
    assert (matplotlib.image.imread(tmp_path / "c.png") == matplotlib.image.imread(tmp_path / "q.png")).all()
    synth.write_table_export(str(tmp_path / "pts"), records=8)
    capsys.readouterr()
    assert cli.main(["inspect", str(tmp_path / "pts"), "--quicklook", str(tmp_path / "t.png")]) == 2
    assert "--quicklook draws an image export of patches with its mixer; " + str(tmp_path / "pts") + " is a table" \
        in capsys.readouterr().err and not (tmp_path / "t.png").exists()
