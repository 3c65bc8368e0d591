"""Helpers of the predict tests (tests/predict): constants of the synthetic export, models whose outputs are known
value for value, and how the tests run the CLI."""
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np

BANDS = ["B2", "B3", "B4", "B8"]
P, K = 16, 4          # patchDimensions and kernel size: stored patches of 20x20, cropped by 2 per side
RECORDS = 23          # 5 shards of 5, 5, 5, 4, 4 patches
IMAGE_GROUPS = {"a": BANDS[:2], "b": BANDS[2:]}


def band_picker(path, weights, *, side=None, crop=0):
    """A `.keras` model: a 1x1 convolution without bias whose output channel j is sum_c weights[j][c] * band c
    (one weight 1 and the rest 0 returns that band exactly); `crop` > 0 crops its output (a wrong size)."""
    import tf_keras as keras

    w = np.asarray(weights, np.float32)
    x = keras.Input((side, side, w.shape[1]))
    conv = keras.layers.Conv2D(w.shape[0], 1, use_bias=False, name="pick")
    y = conv(x)
    conv.set_weights([w.T.reshape(1, 1, w.shape[1], w.shape[0])])
    if crop:
        y = keras.layers.Cropping2D(crop)(y)
    keras.Model(x, y).save(str(path))
    return path


def stored_bands(export: pathlib.Path, band: str) -> np.ndarray:
    """Every patch's `band` in shard order, [records, S, S] float32 (read with plain TensorFlow)."""
    import tensorflow as tf

    out = []
    for path in sorted(export.glob("*.tfrecord*")):
        comp = "GZIP" if path.suffix == ".gz" else ""
        for raw in tf.data.TFRecordDataset(str(path), compression_type=comp):
            ex = tf.train.Example.FromString(raw.numpy())
            values = np.array(ex.features.feature[band].float_list.value, np.float32)
            out.append(values.reshape(P + K, P + K))
    return np.stack(out)


def read_outputs(paths) -> list[dict]:
    """Every Example of TFRecord outputs in order, as {band: numpy array} (read with plain TensorFlow; the
    tests' and benchmarks/per_pixel.py's reader of `harness predict`'s outputs)."""
    import tensorflow as tf

    rows = []
    for path in paths:
        for raw in tf.data.TFRecordDataset(path):
            ex = tf.train.Example.FromString(raw.numpy())
            row = {}
            for k, f in ex.features.feature.items():
                kind = f.WhichOneof("kind")
                row[k] = np.array(getattr(f, kind).value)
            rows.append(row)
    return rows


def harness_cmd(*args) -> list:
    return [sys.executable, "-m", "harness.cli", *map(str, args)]


def run_cli(*args, timeout=300, ok=True) -> subprocess.CompletedProcess:
    r = subprocess.run(harness_cmd(*args), capture_output=True, text=True, timeout=timeout)
    if ok:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def cli_in_process(*args, ok=True) -> subprocess.CompletedProcess:
    """`harness ARGS` run in this process (`harness.cli.main`), as `run_cli` runs it in a child: its exit code,
    stdout and stderr. Only for commands that do not train (synth, inspect, plan, reshard, export, predict): the
    test process keeps TensorFlow's state (2 logical CPUs, tests/conftest.py); it saves a process that imports
    TensorFlow (~2.5 CPU-s)."""
    import contextlib
    import io

    from harness import cli

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    r = subprocess.CompletedProcess(["harness", *argv], code, out.getvalue(), err.getvalue())
    if ok:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def copy_export(src: pathlib.Path, dst: pathlib.Path, *, mixer_changes=None) -> pathlib.Path:
    shutil.copytree(src, dst)
    if mixer_changes:
        mixer = next(dst.glob("*-mixer.json"))
        obj = json.loads(mixer.read_text())
        obj.update(mixer_changes)
        mixer.write_text(json.dumps(obj))
    return dst


def grouped_image_run(folder, delivery, *, model_delivery=None):
    """A run folder: a model over IMAGE_GROUPS built for `model_delivery` (default `delivery`), 3 classes, and a
    summary.json whose spec delivers the groups by `delivery` (stored (P+K)-pixel patches). Returns the folder and
    the spec."""
    import tf_keras as keras

    from harness.data.spec.dataspec import DataSpec

    s = P + K
    if (model_delivery or delivery) == "time":
        x = keras.Input((2, s, s, 2), name="series")
        y = keras.layers.Reshape((s, s, 3))(keras.layers.Conv3D(3, (2, 1, 1))(x))
    else:
        x = {g: keras.Input((s, s, 2), name=g) for g in IMAGE_GROUPS}
        y = keras.layers.Conv2D(3, 1)(keras.layers.Concatenate()([x["a"], x["b"]]))
    folder.mkdir()
    keras.Model(x, y).save(str(folder / "model.keras"))
    spec = DataSpec(kind="image", bands=(), label="landcover", band_groups=IMAGE_GROUPS, group_delivery=delivery,
                    patch_size=P, kernel_margin=K, num_classes=3)
    (folder / "summary.json").write_text(json.dumps({"spec": spec.to_config()}))
    return folder, spec


def check_map(folder: pathlib.Path, prefix: str, *, band: str = "class", probabilities=None) -> dict:
    """Open `<prefix>.tif` of a predict output folder with rasterio and check it against the TFRecord predictions
    and the mixer: CRS and affine transform from the mixer, patch i at grid row i // patchesPerRow, column
    i % patchesPerRow, every pixel equal to `band`'s values, the slots with no patch nodata, a valid
    Cloud-Optimized GeoTIFF (rio-cogeo's validator, GDAL's rules), overviews when larger than one tile. With
    `probabilities` (the class names), `<prefix>-probabilities.tif` likewise, one band per class. Returns
    {"profile", "colormap", "overviews"} of the class map, and for a class map its "categories" and
    "attribute_table" as GDAL reads them (tests/gdal_info.py), the table's colours checked against the colour
    table's."""
    import rasterio
    from rio_cogeo.cogeo import cog_validate

    mixer = json.loads((folder / f"{prefix}-mixer.json").read_text())
    p, per_row, total = mixer["patchDimensions"][0], mixer["patchesPerRow"], mixer["totalPatches"]
    rows = read_outputs(sorted(folder.glob(f"{prefix}-*.tfrecord")))
    assert len(rows) == total
    grid_rows = -(-total // per_row)
    files = [(folder / f"{prefix}.tif", [band])]
    if probabilities:
        files.append((folder / f"{prefix}-probabilities.tif", [f"probability_{i}" for i in range(len(probabilities))]))
    found = {}
    for path, bands in files:
        valid, errors, _ = cog_validate(str(path), quiet=True)
        assert valid, (path, errors)
        with rasterio.open(path) as src:
            assert src.crs == rasterio.crs.CRS.from_user_input(mixer["projection"]["crs"])
            assert tuple(src.transform)[:6] == tuple(mixer["projection"]["affine"]["doubleMatrix"])
            assert (src.width, src.height, src.count) == (per_row * p, grid_rows * p, len(bands))
            data = src.read()
            if src.width > 256 or src.height > 256:
                assert src.overviews(1), path
            for i in range(grid_rows * per_row):
                r, c = divmod(i, per_row)
                window = data[:, r * p:(r + 1) * p, c * p:(c + 1) * p]
                if i < total:
                    want = np.stack([rows[i][b].reshape(p, p) for b in bands])
                    np.testing.assert_array_equal(window, want.astype(window.dtype))
                elif src.dtypes[0] == "uint8":
                    assert (window == src.nodata).all()
                else:
                    assert np.isnan(window).all()
            if path.name == f"{prefix}.tif":
                found = {"profile": src.profile, "overviews": src.overviews(1), "descriptions": src.descriptions,
                         "colormap": src.colormap(1) if src.dtypes[0] == "uint8" else None}
            else:
                assert src.descriptions == tuple(probabilities)
    if found.get("colormap") is not None:   # a class map: its names as GDAL reads them (gdalinfo), and its RAT's
        from gdal_info import attribute_table, categories, gdalinfo
        info = gdalinfo(str(folder / f"{prefix}.tif"), "-noct")
        found["categories"], found["attribute_table"] = categories(info), attribute_table(info)
        assert found["categories"] and str(folder / f"{prefix}.tif.aux.xml") in info, info[:2000]
        rgb = [list(found["colormap"][i][:3]) for i in range(len(found["categories"]))]
        assert [[int(v) for v in row[2:]] for row in found["attribute_table"]] == rgb   # the colour table's colours
    return found
