"""The one home of the map formats: predictions of an image export as a map a GIS opens (Cloud-Optimized
GeoTIFFs placed by the export's mixer, and a PNG quick-look beside them), written (`write`, `write_maps`) and read
back for `harness inspect` (`describe_maps`).

Placement (docs/GEE_FORMAT.md, "mixer.json" and "Predictions back"): the mixer's `projection` holds the export's
CRS and its affine transform `doubleMatrix` [a, b, c, d, e, f] (x = a*col + b*row + c, y = d*col + e*row + f:
GDAL's and rasterio's `Affine(a, b, c, d, e, f)` order). It is what Earth Engine places the uploaded predictions
with, and those are P x P per patch (the kernel margin cut), so its origin is the top-left corner of patch 0's
central P x P. Patch i covers rows `(i // patchesPerRow) * P` and columns `(i % patchesPerRow) * P`; the grid has
ceil(totalPatches / patchesPerRow) rows, and a slot past totalPatches (Earth Engine wrote no patch there) is nodata.

Files (under the output folder, named after the prefix):
- `<prefix>.tif`: classification: the class ids, uint8 (uint16 past 255 classes) with a colour table, nodata
  the largest value of the type; regression: one float32 band per output, nodata NaN.
- `<prefix>-probabilities.tif` (classification with `--probabilities`): one float32 band per class, named after
  the class (the run's `class_names`, else `class <i>`), nodata NaN.
- `<prefix>.png`: the map at most QUICKLOOK_PIXELS on its long side, classes in the GeoTIFF's colours with a
  legend (or the first regression output with a colour bar).
- `<prefix>.tif.aux.xml` (classification): the class names where GDAL reads them (`categories_xml`).
An input image export is drawn the same way, from its records (`export_quicklook`: `harness inspect --quicklook`).
Each GeoTIFF is written with GDAL's COG driver (gdal.org/drivers/raster/cog.html: tiles of BLOCK pixels, DEFLATE,
overviews down to one tile; class ids resampled by their mode, values by their mean) into a local temporary
folder, then copied to its place (a local folder or gs://) under a temporary name and renamed whole.
"""
from __future__ import annotations

import colorsys
import dataclasses
import math
import os
import shutil
import tempfile
from typing import Iterator, Optional, Sequence

import numpy as np

from harness.errors import ConfigError
from harness.predict import writer
from harness.predict.options import CLASSIFICATION

BLOCK = 256              # COG tile side, pixels (GDAL's COG driver default is 512; 256 is what web maps tile by)
QUICKLOOK_PIXELS = 1024  # the PNG's long side at most, pixels
SUFFIX, PROBABILITIES_SUFFIX, QUICKLOOK_SUFFIX = ".tif", "-probabilities.tif", ".png"
STRETCH_PERCENTILES = (2.0, 98.0)   # an export's quick-look: each band stretched between these percentiles
PAM_SUFFIX = ".aux.xml"   # GDAL's sidecar of a GeoTIFF (its Persistent Auxiliary Metadata)


@dataclasses.dataclass(frozen=True)
class Grid:
    """Where each patch of an image export lies (from its mixer).

    Attributes:
      crs: the projection's CRS as Earth Engine writes it ("EPSG:4326", or WKT).
      transform: the affine transform [a, b, c, d, e, f] of the P-pixel grid (see the module's docstring).
      patch: P, the side of every predicted patch, pixels.
      per_row: patchesPerRow; total: totalPatches.
    """

    crs: str
    transform: tuple[float, ...]
    patch: int
    per_row: int
    total: int

    @classmethod
    def from_mixer(cls, mixer, patch: int) -> "Grid":
        """The grid of `mixer` (`harness.data.export.shards.Mixer`) for predictions of side `patch`.

        Raises:
          ValueError: naming the mixer file, if its projection has no crs or no 6-value affine transform.
        """
        projection = mixer.projection or {}
        matrix = (projection.get("affine") or {}).get("doubleMatrix")
        if not projection.get("crs") or not matrix or len(matrix) != 6:
            raise ValueError(f"{mixer.path}: its projection has no crs and 6-value affine.doubleMatrix "
                             f"({projection!r}): the patches cannot be placed on a map")
        return cls(str(projection["crs"]), tuple(float(v) for v in matrix), patch, mixer.patches_per_row,
                   mixer.total_patches)

    @property
    def rows(self) -> int:
        return math.ceil(self.total / self.per_row)

    @property
    def width(self) -> int:
        return self.per_row * self.patch

    @property
    def height(self) -> int:
        return self.rows * self.patch

    def origin(self, i: int) -> tuple[int, int]:
        """(row, column) of patch i's top-left pixel in the map."""
        r, c = divmod(i, self.per_row)
        return r * self.patch, c * self.patch


@dataclasses.dataclass(frozen=True)
class MapPaths:
    """The files `write` makes; `probabilities` is None when none are written."""

    map: str
    quicklook: str
    probabilities: Optional[str]
    categories: Optional[str] = None   # a class map's names for GDAL and QGIS: `<map>.tif.aux.xml` (`categories_xml`)

    @classmethod
    def under(cls, folder: str, prefix: str, probabilities: bool, classification: bool = False) -> "MapPaths":
        join = os.path.join
        return cls(join(folder, prefix + SUFFIX), join(folder, prefix + QUICKLOOK_SUFFIX),
                   join(folder, prefix + PROBABILITIES_SUFFIX) if probabilities else None,
                   join(folder, prefix + SUFFIX + PAM_SUFFIX) if classification else None)

    def all(self) -> list[str]:
        return [p for p in (self.map, self.probabilities, self.categories, self.quicklook) if p]


def colours(n: int) -> list[tuple[int, int, int]]:
    """n distinct RGB colours (0-255), the same for every run: hues spaced by the golden ratio."""
    return [tuple(round(255 * v) for v in colorsys.hsv_to_rgb((0.6 + i * 0.618034) % 1.0, 0.65, 0.9))
            for i in range(n)]


def categories_xml(classes: Sequence[str]) -> str:
    """A GDAL PAM sidecar (`<map>.tif.aux.xml`, the file GDAL opens beside a GeoTIFF: gdalinfo, QGIS, rasterio) of
    a class map's band 1: the class names as its category names (GDALGetRasterCategoryNames: gdalinfo's
    "Categories", QGIS's paletted legend) and a thematic raster attribute table of value, class name and the colour
    table's RGB (GDALGetDefaultRAT; QGIS 3.30+ classifies by it). GeoTIFF keeps neither inside the file (GDAL's
    GTiff driver writes both to this sidecar; https://gdal.org/en/stable/drivers/raster/gtiff.html).

    Field types and usages are GDAL's enums (gdal.h: GFT_Integer 0, GFT_String 2; GFU_Name 2, GFU_MinMax 5,
    GFU_Red 6, GFU_Green 7, GFU_Blue 8)."""
    from xml.etree import ElementTree as ET

    root = ET.Element("PAMDataset")
    band = ET.SubElement(root, "PAMRasterBand", band="1")
    names = ET.SubElement(band, "CategoryNames")
    for name in classes:
        ET.SubElement(names, "Category").text = name
    rat = ET.SubElement(band, "GDALRasterAttributeTable", tableType="thematic")
    fields = (("value", 0, 5), ("class", 2, 2), ("red", 0, 6), ("green", 0, 7), ("blue", 0, 8))
    for i, (name, kind, usage) in enumerate(fields):
        defn = ET.SubElement(rat, "FieldDefn", index=str(i))
        ET.SubElement(defn, "Name").text = name
        ET.SubElement(defn, "Type").text = str(kind)
        ET.SubElement(defn, "Usage").text = str(usage)
    for i, (name, rgb) in enumerate(zip(classes, colours(len(classes)))):
        row = ET.SubElement(rat, "Row", index=str(i))
        for value in (i, name, *rgb):
            ET.SubElement(row, "F").text = str(value)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


def class_dtype(classes: int) -> tuple[str, int]:
    """(dtype, nodata) of a class-id band: uint8 up to 255 classes (nodata 255), else uint16 (nodata 65535)."""
    return ("uint8", 255) if classes <= 255 else ("uint16", 65535)


def _patches(paths: Sequence[str], bands: Sequence[str], patch: int, ids: Optional[str]) -> Iterator[dict]:
    """The predictions in patch order: {band: [P, P] array} per Example of the TFRecord files `paths` (the band
    `ids` int64, the others float32)."""
    import tensorflow as tf

    description = {b: tf.io.FixedLenFeature([patch * patch], tf.int64 if b == ids else tf.float32) for b in bands}
    data = tf.data.TFRecordDataset(list(paths)).batch(64).map(lambda x: tf.io.parse_example(x, description))
    for batch in data.as_numpy_iterator():
        for j in range(len(batch[bands[0]])):
            yield {b: batch[b][j].reshape(patch, patch) for b in bands}


def _write_cog(local_tiff: str, target: str, resampling: str) -> None:
    """Copy the tiled GeoTIFF `local_tiff` as a COG to `target` (local or gs://), whole or not at all."""
    from rasterio.shutil import copy as rio_copy

    cog = local_tiff[:-len(SUFFIX)] + ".cog" + SUFFIX
    rio_copy(local_tiff, cog, driver="COG", blocksize=BLOCK, compress="DEFLATE", overview_resampling=resampling,
             overviews="AUTO")
    _put(cog, target)


def _put(local: str, target: str) -> None:
    import tensorflow as tf

    with writer.atomic(target) as tmp:
        tf.io.gfile.copy(local, tmp, overwrite=True)


def write(paths: Sequence[str], grid: Grid, out: MapPaths, *, classification: bool, bands: Sequence[str],
          classes: Sequence[str] = ()) -> list[str]:
    """Write the map files of predictions `paths` (TFRecord outputs in patch order, as `harness.predict.writer`
    writes them) and return their paths.

    Args:
      bands: the written bands in order: for classification `class` (int64 ids) first, then one probability per
        class when `out.probabilities`; for regression one float32 band per output.
      classes: the class names, one per class (classification), named in the colour table's legend, the
        probability bands' descriptions and the PNG.
    Raises:
      ValueError: if the files hold more patches than the grid.
    """
    import rasterio
    from rasterio.transform import Affine

    p = grid.patch
    base = dict(driver="GTiff", width=grid.width, height=grid.height, crs=rasterio.crs.CRS.from_user_input(grid.crs),
                transform=Affine(*grid.transform), tiled=True, blockxsize=BLOCK, blockysize=BLOCK,
                compress="DEFLATE")
    written = []
    folder = tempfile.mkdtemp(prefix="harness-map-")
    try:
        class_type, class_nodata = class_dtype(len(classes))
        value_bands = list(bands[1:]) if classification else list(bands)
        maps = []   # (local path, band names read into it, dtype, nodata)
        if classification:
            maps.append((os.path.join(folder, "map.tif"), [bands[0]], class_type, class_nodata))
        if value_bands:
            maps.append((os.path.join(folder, "values.tif"), value_bands, "float32", float("nan")))
        datasets = [rasterio.open(path, "w", count=len(names), dtype=dt, nodata=nd, **base)
                    for path, names, dt, nd in maps]
        try:
            if classification:
                datasets[0].write_colormap(1, {**{i: (*c, 255) for i, c in enumerate(colours(len(classes)))},
                                               class_nodata: (0, 0, 0, 0)})
                datasets[0].set_band_description(1, "class")
                datasets[0].update_tags(CLASS_NAMES=",".join(classes))
            if value_bands:
                names = list(classes) if classification else value_bands
                for b, name in enumerate(names, 1):
                    datasets[-1].set_band_description(b, name)
            n = 0
            for n, patch in enumerate(_patches(paths, bands, p, bands[0] if classification else None), 1):
                if n > grid.total:
                    raise ValueError(f"{paths[-1]}: more predicted patches than the mixer's totalPatches "
                                     f"{grid.total}")
                window = rasterio.windows.Window(grid.origin(n - 1)[1], grid.origin(n - 1)[0], p, p)
                for ds, (_, names, dt, _) in zip(datasets, maps):
                    ds.write(np.stack([patch[b] for b in names]).astype(dt), window=window)
            for i in range(n, grid.rows * grid.per_row):   # no patch from Earth Engine here: nodata
                window = rasterio.windows.Window(grid.origin(i)[1], grid.origin(i)[0], p, p)
                for ds, (_, names, dt, nd) in zip(datasets, maps):
                    ds.write(np.full((len(names), p, p), nd, dt), window=window)
        finally:
            for ds in datasets:
                ds.close()
        targets = [out.map] if classification else []
        targets += [out.probabilities if classification else out.map] if value_bands else []
        for (path, _, dt, _), target in zip(maps, targets):
            _write_cog(path, target, "MODE" if dt.startswith("uint") else "AVERAGE")
            written.append(target)
        if classification and out.categories:   # the class names where GDAL and QGIS look for them
            pam = os.path.join(folder, "categories.aux.xml")
            with open(pam, "w") as f:
                f.write(categories_xml(classes))
            _put(pam, out.categories)
            written.append(out.categories)
        png = os.path.join(folder, "quicklook.png")
        if quicklook(maps[0][0], png, classes=classes if classification else (), title=os.path.basename(out.map)):
            _put(png, out.quicklook)
            written.append(out.quicklook)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return written


def quicklook(tiff: str, png: str, *, classes: Sequence[str] = (), title: str = "") -> bool:
    """Draw the GeoTIFF `tiff`'s first band into `png` (at most QUICKLOOK_PIXELS on its long side): class ids in
    the colours of its colour table with a legend of `classes`, or values with a colour bar. False (and no file)
    when matplotlib is not installed (it comes with the `profile` extra)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import rasterio
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    with rasterio.open(tiff) as src:
        scale = max(1, math.ceil(max(src.width, src.height) / QUICKLOOK_PIXELS))
        shape = (max(1, src.height // scale), max(1, src.width // scale))
        band = src.read(1, out_shape=shape, masked=True)
        bounds = src.bounds
    fig, ax = plt.subplots(figsize=(8, 8 * shape[0] / shape[1] + 0.6))
    extent = (bounds.left, bounds.right, bounds.bottom, bounds.top)
    if classes:
        palette = colours(len(classes))
        cmap = ListedColormap([tuple(v / 255 for v in c) for c in palette]).with_extremes(bad=(0, 0, 0, 0))
        ax.imshow(band, cmap=cmap, vmin=-0.5, vmax=len(classes) - 0.5, interpolation="nearest", extent=extent)
        ax.legend(handles=[Patch(color=tuple(v / 255 for v in c), label=name) for c, name in zip(palette, classes)],
                  loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    else:
        image = ax.imshow(band, cmap="viridis", interpolation="nearest", extent=extent)
        fig.colorbar(image, ax=ax, fraction=0.046)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return True


def class_names(job) -> tuple[str, ...]:
    """One name per class: the run's `class_names` when it has one per model output, else `class <i>`."""
    names = tuple(job.loaded.spec.class_names) if job.loaded.spec else ()
    return names if len(names) == job.geometry.channels else tuple(f"class {i}" for i in range(job.geometry.channels))


def write_maps(job) -> list[str]:
    """Write the map of the whole export of `job` (`harness.predict.job.Job`; `write`: every output shard must be
    complete) and return the lines to say: each file, and how to open it."""
    grid = Grid.from_mixer(job.shards.mixer, job.geometry.patch)
    classification = job.task == CLASSIFICATION
    written = write(job.outputs, grid, job.maps, classification=classification, bands=job.band_names,
                    classes=class_names(job) if classification else ())
    lines = []
    for path in written:
        what = ("PNG quick-look" if path == job.maps.quicklook else
                "the class names for GDAL and QGIS (category names and a raster attribute table)"
                if path == job.maps.categories else
                f"Cloud-Optimized GeoTIFF, {grid.width} x {grid.height} pixels, {grid.crs}, " +
                ("class ids with a colour table" if classification and path == job.maps.map else
                 "one float32 band per " + ("class" if classification else "output")))
        lines.append(f"  {os.path.basename(path)}: {what}")
    if job.maps.quicklook not in written:
        lines.append("  (no PNG quick-look: matplotlib is not installed; it comes with the `profile` extra)")
    return lines


def describe_maps(folder: str) -> list[dict]:
    """`describe_map` of each map of a predict output folder (its GeoTIFFs), the map first."""
    import tensorflow as tf

    names = [n for n in tf.io.gfile.listdir(folder) if n.endswith(SUFFIX) and not n.startswith(".")]
    return [describe_map(os.path.join(folder, n)) for n in sorted(names, key=lambda n: (len(n), n))]  # map first


def describe_map(path: str) -> dict:
    """One GeoTIFF's size, CRS, bands and overviews; a class map's pixels per class, read tile by tile (a gs://
    file is copied to a local temporary file first: GDAL reads gs:// only with its own credentials)."""
    import rasterio
    import tensorflow as tf

    local, folder = path, None
    if not os.path.exists(path):
        folder = tempfile.mkdtemp(prefix="harness-inspect-")
        local = os.path.join(folder, os.path.basename(path))
        tf.io.gfile.copy(path, local)
    try:
        with rasterio.open(local) as src:
            out = {"file": path, "width": src.width, "height": src.height, "crs": src.crs.to_string() if src.crs
                   else None, "bands": list(src.descriptions), "dtype": src.dtypes[0],
                   "overviews": src.overviews(1)}
            names = src.tags().get("CLASS_NAMES")
            if names is not None and src.count == 1 and src.dtypes[0].startswith("uint"):
                names = names.split(",")
                counts = np.zeros(int(src.nodata) + 1, np.int64)
                for _, window in src.block_windows(1):
                    counts += np.bincount(src.read(1, window=window).ravel(), minlength=len(counts))
                out["class_counts"] = {n: int(c) for n, c in zip(names, counts)}
                out["nodata_pixels"], out["nodata"] = int(counts[int(src.nodata)]), int(src.nodata)
        return out
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


# --- an input export drawn (`harness inspect --quicklook`) ---------------------------------------------------
def _export_values(feature, dtype_bytes: bool) -> np.ndarray:
    """A feature's values as float32 (a bytes band: its uint8 values)."""
    if dtype_bytes:
        return np.frombuffer(feature.bytes_list.value[0], np.uint8).astype(np.float32)
    if feature.float_list.value:
        return np.asarray(feature.float_list.value, np.float32)
    return np.asarray(feature.int64_list.value, np.float32)


def export_quicklook(shards, mixer, spec, bands: Sequence[str], out_png: str, *,
                     max_pixels: int = QUICKLOOK_PIXELS) -> dict:
    """Draw the image export of `shards` (in order) and its `mixer` into `out_png` (local or gs://): its patches
    placed by the mixer (patch i at grid row i // patchesPerRow, column i % patchesPerRow, each cropped to its
    central P x P as the map is), three bands as red, green and blue (or one as grey), each stretched between its
    2nd and 98th percentile (STRETCH_PERCENTILES), at most `max_pixels` on the long side (`harness inspect EXPORT
    --quicklook OUT.png`). Memory: the picture alone (at most max_pixels^2 x 3 float32, 12 MiB at 1024), whatever
    the export's size: each patch is read once, subsampled onto it, and dropped; time grows with its bytes.

    Args:
      spec: the export's `DataSpec` (where each channel is stored: `channel_source`, array bands and collapsed
        bands alike; its kernel margin k: each stored plane holds (P+k)^2 values, the central P x P is drawn).
      bands: one or three channel names as the spec names them (`B4`, or `ndvi[3]`: a plane of an array band),
        drawn as grey or as red, green, blue.
    Returns:
      {"path", "width", "height" (the picture's pixels), "scale" (export pixels per picture pixel), "bands",
       "patches", "stretch": {band: [low, high]}}.
    Raises:
      ConfigError: not 1 or 3 bands; a band the records lack (naming the record); values of the wrong length.
    """
    import tensorflow as tf
    import matplotlib

    if len(bands) not in (1, 3):
        raise ConfigError(f"a quick-look draws 1 band (grey) or 3 (red, green, blue), got {list(bands)}")
    width_p, height_p = mixer.patch_dimensions
    per_row, total = mixer.patches_per_row, mixer.total_patches
    rows = math.ceil(total / per_row)
    width, height = per_row * width_p, rows * height_p
    scale = max(1, math.ceil(max(width, height) / max_pixels))
    canvas = np.full((math.ceil(height / scale), math.ceil(width / scale), len(bands)), np.nan, np.float32)
    k = spec.kernel_margin
    side_w, side_h, half = width_p + k, height_p + k, k // 2
    planes = [spec.channel_source(b) for b in bands]
    i = -1
    for shard in shards:
        for raw in tf.data.TFRecordDataset(shard.path, compression_type=shard.compression):
            i += 1
            if i >= total:
                raise ConfigError(f"{shard.path}: more records than the mixer's totalPatches {total} "
                                  f"({mixer.path})")
            feature = tf.train.Example.FromString(raw.numpy()).features.feature
            r0, c0 = (i // per_row) * height_p, (i % per_row) * width_p
            ys = np.arange(math.ceil(r0 / scale), math.ceil((r0 + height_p) / scale))
            xs = np.arange(math.ceil(c0 / scale), math.ceil((c0 + width_p) / scale))
            for j, (name, plane) in enumerate(planes):
                if name not in feature:
                    raise ConfigError(f"{shard.path}, record {i}: no feature {name!r} for {bands[j]!r} (the "
                                      f"export has {sorted(feature)[:12]})")
                values = _export_values(feature[name], bool(feature[name].bytes_list.value))
                if values.size % (side_w * side_h) or plane >= values.size // (side_w * side_h):
                    raise ConfigError(f"{shard.path}, record {i}: band {name!r} holds {values.size} values, not "
                                      f"a multiple of {side_h}x{side_w} with plane {plane}")
                patch = values.reshape(-1, side_h, side_w)[plane, half:half + height_p, half:half + width_p]
                canvas[np.ix_(ys, xs, [j])] = patch[np.ix_(ys * scale - r0, xs * scale - c0)][..., None]
    stretch = {}
    for j, name in enumerate(bands):
        low, high = (np.nanpercentile(canvas[..., j], STRETCH_PERCENTILES) if np.isfinite(canvas[..., j]).any()
                     else (0.0, 1.0))
        stretch[name] = [float(low), float(high)]
        canvas[..., j] = np.clip((canvas[..., j] - low) / max(high - low, 1e-12), 0, 1)
    picture = np.nan_to_num(canvas, nan=1.0)   # where no patch was written: white
    matplotlib.use("Agg")  # files only, no display
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    plt.imsave(buffer, np.repeat(picture, 3, axis=-1) if len(bands) == 1 else picture, format="png")   # 8-bit, RGB
    with tf.io.gfile.GFile(out_png, "wb") as f:
        f.write(buffer.getvalue())
    return {"path": out_png, "width": picture.shape[1], "height": picture.shape[0], "scale": scale,
            "bands": list(bands), "patches": i + 1, "stretch": stretch}


def quicklook_bands(channels: Sequence[str]) -> list[str]:
    """The bands a quick-look draws when none are named: red, green, blue by Earth Engine's usual names
    (Sentinel-2 B4, B3, B2; Landsat SR_B4, SR_B3, SR_B2; `red`, `green`, `blue` in a name) where all three are
    there, else the first three channels, else the first."""
    lower = {c.lower(): c for c in channels}
    for trio in (("b4", "b3", "b2"), ("sr_b4", "sr_b3", "sr_b2")):
        if all(t in lower for t in trio):
            return [lower[t] for t in trio]
    named = [next((c for c in channels if colour in c.lower()), None) for colour in ("red", "green", "blue")]
    if all(named):
        return named
    return list(channels[:3]) if len(channels) >= 3 else list(channels[:1])


def describe_quicklook(result: dict) -> str:
    """The line `harness inspect` prints of a quick-look."""
    stretch = ", ".join(f"{b} {lo:.4g}..{hi:.4g}" for b, (lo, hi) in result["stretch"].items())
    return (f"quick-look: {result['path']}: {result['width']} x {result['height']} pixels ({result['scale']} export "
            f"pixel(s) per pixel, {result['patches']} patches), {', '.join(result['bands'])} "
            f"{'as red, green, blue' if len(result['bands']) == 3 else 'as grey'}, stretched 2-98% ({stretch})")
