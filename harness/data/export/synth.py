"""Write synthetic exports laid out exactly as Earth Engine writes them (docs/GEE_FORMAT.md).

Image export: shards `<prefix>-00000.tfrecord.gz` ... (GZIP unless uncompressed: `.tfrecord`), one
tf.train.Example per patch, one feature per band holding a flat row-major list of S*S values (S = P + k, the
kernel margin k overlapping the neighbouring patches, k/2 per side), patches row-major over a grid
`patchesPerRow` wide, split in order across the shards (earlier shards full, the last ones smaller), plus
`<prefix>-mixer.json`. The label is a float list (as Earth Engine stores class ids).
Table export: `<prefix>.tfrecord.gz` (or `<prefix>-0000i.tfrecord.gz` when split), one Example per row, each band
a float_list of one value.

The bands are smooth random fields of the pixel position on the export's grid (so overlapping margins agree
between neighbours), and the label is the argmax over classes of a fixed linear function of the bands at each
pixel: learnable from the bands alone, by a 1x1 convolution as by a small U-Net. With `regression=True` the label
is instead the value of a fixed linear function of the bands (the first class's weights): a float per pixel or row.
"""
from __future__ import annotations

import json
import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from harness.choices import DTYPES
from harness.data.export.records import BYTES, FLOAT, INT64
from harness.errors import ConfigError

_COMPONENTS = 3  # sinusoids per band


class _Field:
    """Smooth band values at global pixel positions, and the classes they imply.

    `label_channel`: the index of the one channel the label depends on (its value cut into `classes` bins of
    equal probability, or, for regression, the value itself); None: every channel (a linear function's argmax).
    """

    def __init__(self, rng: np.random.Generator, bands: int, classes: int, wavelength: float,
                 label_channel: Optional[int] = None):
        self.freq = rng.normal(size=(bands, _COMPONENTS, 2)) / wavelength * 2 * math.pi
        self.phase = rng.uniform(0, 2 * math.pi, size=(bands, _COMPONENTS))
        self.amp = rng.uniform(0.5, 1.0, size=(bands, _COMPONENTS))
        self.weights = rng.normal(size=(classes, bands))
        self.label_channel = label_channel
        if label_channel is not None:
            self.weights = np.zeros((classes, bands))
            self.weights[0, label_channel] = 1.0
            sample = self.values(*rng.uniform(0, 4096, size=(2, 8192)))[:, label_channel]
            self.cuts = np.quantile(sample, np.arange(1, classes) / classes)

    def values(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Band values in about [-1.5, 1.5], shape rows.shape + (bands,)."""
        pos = np.stack([rows, cols], axis=-1).astype(np.float64)  # [..., 2]
        angle = np.einsum("...d,bcd->...bc", pos, self.freq) + self.phase
        return (np.sin(angle) * self.amp).sum(-1) / math.sqrt(_COMPONENTS)

    def classes(self, values: np.ndarray) -> np.ndarray:
        if self.label_channel is not None:
            return np.digitize(values[..., self.label_channel], self.cuts)
        return np.argmax(values @ self.weights.T, axis=-1)

    def target(self, values: np.ndarray, regression: bool) -> np.ndarray:
        """The label: class ids, or (regression) the first class's linear score, float32."""
        return (values @ self.weights[0] if regression else self.classes(values)).astype(np.float32)


def _store(values: np.ndarray, dtype: str) -> tf.train.Feature:
    """One band (any shape) as Earth Engine stores it: float reflectance-like, int64 DN-like, or uint8 bytes."""
    flat = values.reshape(-1)
    if dtype == FLOAT:
        return tf.train.Feature(float_list=tf.train.FloatList(value=(0.15 + 0.1 * flat).astype(np.float32)))
    if dtype == INT64:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=_raw(flat, INT64).astype(np.int64)))
    if dtype == BYTES:
        raw = _raw(flat, BYTES).astype(np.uint8).tobytes()
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw]))
    raise ConfigError(f"dtype must be float, int64 or bytes, got {dtype!r}")


def channels(bands: Sequence[str], depths: Mapping[str, int]) -> list[str]:
    """The channels an export of `bands` holds (`band[i]` for each plane of an array band), as DataSpec names
    them."""
    return [c for b in bands for c in ([b] if depths.get(b, 1) == 1 else [f"{b}[{i}]" for i in range(depths[b])])]


def _label_channel(label_from: Optional[str], names: Sequence[str]) -> Optional[int]:
    if label_from is None:
        return None
    if label_from not in names:
        raise ConfigError(f"label_from {label_from!r} is not one of the channels {list(names)}")
    return list(names).index(label_from)


def _planes(values: np.ndarray, idx: Sequence[int]) -> np.ndarray:
    """[..., channels] -> the planes `idx` first ([D, ...]): Earth Engine's CHW order for 3D tensors."""
    return np.moveaxis(values[..., list(idx)], -1, 0)


def _check(*, shards: int, records: int, bands: Sequence[str], label: Optional[str], classes: int,
           dtypes: Sequence[str], dtype: str, depths: Mapping[str, int] = {}) -> None:
    """Refuse arguments that would write a broken export, before any file is written."""
    if shards < 1 or records < shards:
        raise ConfigError(f"need records >= shards >= 1, got {records} records for {shards} shards")
    if isinstance(bands, str) or not bands:
        raise ConfigError(f"need a non-empty list of band names, got {bands!r}")
    if len(set(bands)) != len(bands) or label in bands:
        raise ConfigError(f"band and label names must be distinct, got bands {list(bands)} and label {label!r}")
    if classes < 1:
        raise ConfigError(f"need classes >= 1, got {classes}")
    if dtype not in dtypes:
        raise ConfigError(f"dtype must be one of {', '.join(dtypes)}, got {dtype!r}")
    for b, d in depths.items():
        if b not in bands or isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ConfigError(f"depths: {b!r}: {d!r}: a band's depth is a positive integer (bands {list(bands)})")


def _margin(patch_size: int, kernel_size: int) -> int:
    """The kernel margin k stored around a P x P patch: kernelSize 0 or 1 (Earth Engine's default [1, 1]) store
    none; otherwise kernelSize must be even (k/2 per side; docs/GEE_FORMAT.md)."""
    if patch_size < 1:
        raise ConfigError(f"patch size must be >= 1, got {patch_size}")
    if kernel_size < 0 or (kernel_size > 1 and kernel_size % 2):
        raise ConfigError(f"kernel size must be 0, 1 (no margin) or even (k/2 pixels per side), got {kernel_size}")
    return 0 if kernel_size == 1 else kernel_size


def _split(records: int, shards: int) -> list[int]:
    return [records // shards + (1 if i < records % shards else 0) for i in range(shards)]


def _write(path: str, examples, compressed: bool) -> None:
    with tf.io.TFRecordWriter(path, "GZIP" if compressed else "") as w:
        for ex in examples:
            w.write(ex.SerializeToString())


def write_image_export(out_dir: str, *, prefix: str = "export", shards: int = 4, records: int = 16,
                       bands: Sequence[str] = ("B2", "B3", "B4", "B8"), label: Optional[str] = "landcover",
                       classes: int = 4, patch_size: int = 64, kernel_size: int = 0, dtype: str = FLOAT,
                       compressed: bool = True, seed: int = 0, regression: bool = False,
                       depths: Mapping[str, int] = {}, collapse: bool = False, sequence: bool = False,
                       label_from: Optional[str] = None, mixer: bool = True, field: Optional["_Field"] = None
                       ) -> list[str]:
    """Write an image export of `records` patches over `shards` shards, with its mixer.

    Earth Engine's layout options (TfRecordImageExportOptions; docs/GEE_FORMAT.md):
      depths: `tensorDepths`: band -> D, an array band (e.g. a time series by `toArrayPerBand()`) stored as D
        planes, CHW (a flat list of D*S*S values, the depth outermost).
      collapse: `collapseBands`: every band, then the label, in one feature named after the first band (D planes
        for an array band), the values promoted to the widest type (bytes -> int64 -> float: the float label
        makes it float).
      sequence: `sequenceData`: one tf.train.SequenceExample per pixel, pixels row-major within a patch, then
        patches in order; bands of depth 1 (and the label) in the context, array bands as feature lists of one
        value per step (kernel margin 0).
      mixer: False writes no `<prefix>-mixer.json`, as Earth Engine does when `maxMaskedRatio` drops patches.
      label_from: the one channel (`band` or `band[i]`) the label depends on, cut into `classes` bins of equal
        probability (a label only the right plane in the right place can predict); default every channel.

    Args:
      patch_size: P (patchDimensions), pixels.
      kernel_size: k, the kernel margin: each stored band holds (P+k)^2 values; 0 or 1 (Earth Engine's default
        kernelSize) store no margin, otherwise k must be even.
      dtype: band storage, "float" | "int64" | "bytes" (label always float, as Earth Engine writes it).
      label: label band name, or None for no label.
      regression: a continuous label (a linear function of the bands) instead of class ids.
      field: the bands' field and class rule to sample (`write_scene`'s, which its points share); None: drawn from
        `seed`.

    Returns:
      the shard paths in order, then the mixer path.

    Raises:
      ConfigError: before writing anything, if patch_size < 1, kernel_size is negative or odd above 1, shards < 1,
        records < shards, bands is empty or repeats a name (or the label's), classes < 1, or for an unknown dtype.
    """
    _check(shards=shards, records=records, bands=bands, label=label, classes=classes, dtypes=DTYPES,
           dtype=dtype, depths=depths)
    kernel_size = _margin(patch_size, kernel_size)
    if sequence and (collapse or kernel_size):
        raise ConfigError("sequence (one SequenceExample per pixel) takes no collapse and no kernel margin")
    tf.io.gfile.makedirs(out_dir)
    rng = np.random.default_rng(seed)
    names = channels(bands, depths)
    field = field or _Field(rng, len(names), classes, wavelength=max(8.0, patch_size / 2),
                            label_channel=_label_channel(label_from, names))
    per_row = max(1, math.ceil(math.sqrt(records)))
    side, half = patch_size + kernel_size, kernel_size // 2
    local = np.arange(side) - half
    ext = ".tfrecord.gz" if compressed else ".tfrecord"
    planes, at = {}, 0
    for b in bands:
        planes[b] = list(range(at, at + depths.get(b, 1)))
        at += depths.get(b, 1)

    def example(i: int):
        row, col = divmod(i, per_row)
        rows, cols = np.meshgrid(row * patch_size + local, col * patch_size + local, indexing="ij")
        values = field.values(rows, cols)  # [S, S, channels]
        cls = field.target(values, regression) if label else None  # [S, S]
        if sequence:
            return [_pixel(values[r, c], cls[r, c] if label else None, bands, planes, label, dtype)
                    for r in range(side) for c in range(side)]
        if collapse:
            stack = _planes(values, range(len(names)))
            feature = _store(stack, dtype)
            if label:
                stack = np.concatenate([0.15 + 0.1 * stack if dtype == FLOAT else stack, cls[None]])
                feature = tf.train.Feature(float_list=tf.train.FloatList(value=_promoted(stack, dtype, len(names))))
            return [tf.train.Example(features=tf.train.Features(feature={bands[0]: feature}))]
        feats = {b: _store(_planes(values, planes[b]), dtype) for b in bands}
        if label:
            feats[label] = tf.train.Feature(float_list=tf.train.FloatList(value=cls.reshape(-1)))
        return [tf.train.Example(features=tf.train.Features(feature=feats))]

    paths, start = [], 0
    for s, n in enumerate(_split(records, shards)):
        path = os.path.join(out_dir, f"{prefix}-{s:05d}{ext}")
        _write(path, (ex for i in range(start, start + n) for ex in example(i)), compressed)
        paths.append(path)
        start += n
    if not mixer:
        return paths
    res = 10.0 / 111320  # ~10 m in degrees
    mixer = {"projection": {"crs": "EPSG:4326", "affine": {"doubleMatrix": [res, 0.0, 89.39, 0.0, -res, 27.45]}},
             "patchDimensions": [patch_size, patch_size], "patchesPerRow": per_row, "totalPatches": records}
    mixer_path = os.path.join(out_dir, f"{prefix}-mixer.json")
    with tf.io.gfile.GFile(mixer_path, "w") as f:
        json.dump(mixer, f)
    return paths + [mixer_path]


def _promoted(stack: np.ndarray, dtype: str, bands: int) -> np.ndarray:
    """Collapsed bands and a float label as one float list: the bands as `_store` writes them (int64 and bytes
    values promoted to float), then the label's plane."""
    if dtype == FLOAT:
        return stack.reshape(-1).astype(np.float32)
    flat = [np.asarray(_raw(stack[:bands], dtype), np.float32), stack[bands:].reshape(-1).astype(np.float32)]
    return np.concatenate(flat)


def _raw(values: np.ndarray, dtype: str) -> np.ndarray:
    """The numbers `_store` writes for int64 and bytes bands."""
    flat = values.reshape(-1)
    if dtype == INT64:
        return np.round(1500 + 1000 * flat)
    return np.clip(np.round(128 + 80 * flat), 0, 255)


def _pixel(values: np.ndarray, target, bands: Sequence[str], planes: Mapping[str, list], label: Optional[str],
           dtype: str) -> tf.train.SequenceExample:
    """One pixel as Earth Engine's sequenceData writes it: bands of depth 1 and the label in the context, array
    bands as feature lists of one value per step."""
    context, lists = {}, {}
    for b in bands:
        if len(planes[b]) == 1:
            context[b] = _store(values[planes[b]], dtype)
        else:
            lists[b] = tf.train.FeatureList(feature=[_store(values[p:p + 1], dtype) for p in planes[b]])
    if label:
        context[label] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(target)]))
    return tf.train.SequenceExample(context=tf.train.Features(feature=context),
                                    feature_lists=tf.train.FeatureLists(feature_list=lists))


def write_table_export(out_dir: str, *, prefix: str = "export", shards: int = 1, records: int = 256,
                       bands: Sequence[str] = ("B2", "B3", "B4", "B8"), label: Optional[str] = "class",
                       classes: int = 4, dtype: str = FLOAT, compressed: bool = True, seed: int = 0,
                       regression: bool = False, depths: Mapping[str, int] = {},
                       label_from: Optional[str] = None) -> list[str]:
    """Write a table export (points): one Example per row, each band one value (an array property of depth D:
    D values, flattened as Earth Engine writes them), label a float class id (or, with `regression`, a linear
    function of the bands; `label_from`: of that one channel, as write_image_export's).

    One file `<prefix>.tfrecord.gz` as Earth Engine writes table exports; `<prefix>-0000i...` when shards > 1.

    Returns:
      the shard paths in order.

    Raises:
      ConfigError: before writing anything, if shards < 1, records < shards, bands is empty or repeats a name (or
        the label's), classes < 1, or dtype is not float or int64 (table bands are numbers).
    """
    _check(shards=shards, records=records, bands=bands, label=label, classes=classes, dtypes=(FLOAT, INT64),
           dtype=dtype, depths=depths)
    tf.io.gfile.makedirs(out_dir)
    rng = np.random.default_rng(seed)
    names = channels(bands, depths)
    field = _Field(rng, len(names), classes, wavelength=50.0, label_channel=_label_channel(label_from, names))
    points = rng.uniform(0, 1000, size=(records, 2))
    values = field.values(points[:, 0], points[:, 1])  # [records, channels]
    return _write_rows(out_dir, prefix, values, field.target(values, regression), bands=bands, label=label,
                       dtype=dtype, depths=depths, shards=shards, compressed=compressed)


def _write_rows(out_dir: str, prefix: str, values: np.ndarray, cls: np.ndarray, *, bands: Sequence[str],
                label: Optional[str], dtype: str, depths: Mapping[str, int], shards: int, compressed: bool
                ) -> list[str]:
    """A table export of rows `values` [records, channels] with label `cls` [records]: `write_table_export`'s
    files."""
    records = len(values)
    tf.io.gfile.makedirs(out_dir)
    ext = ".tfrecord.gz" if compressed else ".tfrecord"
    first = np.cumsum([0] + [depths.get(b, 1) for b in bands])

    def example(i: int) -> tf.train.Example:
        feats = {b: _store(values[i, first[j]:first[j + 1]], dtype) for j, b in enumerate(bands)}
        if label:
            feats[label] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(cls[i])]))
        return tf.train.Example(features=tf.train.Features(feature=feats))

    paths, start = [], 0
    sizes = _split(records, shards)
    for s, n in enumerate(sizes):
        name = f"{prefix}{ext}" if shards == 1 else f"{prefix}-{s:05d}{ext}"
        path = os.path.join(out_dir, name)
        _write(path, (example(i) for i in range(start, start + n)), compressed)
        paths.append(path)
        start += n
    return paths


# The ACES exports' layout (the README's quick start reads them): 8 bands of a dry- and a wet-season composite,
# 5 land-cover classes; points in three splits, one file each as Earth Engine names a table export; the image as one
# file whose mixer is `<prefix>.json` (as the ACES authors renamed it).
ACES_BANDS = ("blue_before", "blue_during", "green_before", "green_during", "nir_before", "nir_during", "red_before",
              "red_during")
SCENE_SPLITS = {"training": 3000, "validation": 500, "testing": 500}


def write_scene(out_dir: str, *, bands: Sequence[str] = ACES_BANDS, classes: int = 5,
                splits: Mapping[str, int] = SCENE_SPLITS, patch_size: int = 64, patches: int = 4, seed: int = 0,
                points_folder: str = "gee-aces-points", image_folder: str = "gee-aces-image",
                image_prefix: str = "image_2021") -> dict:
    """Stand-ins for a points export and the image it was sampled from, under one class rule: the image export
    (`patches` patches of `patch_size`, float, GZIP, one file and its mixer `<image_prefix>.json`) and, from
    distinct pixels of that image, one table export per split (`<split>.tfrecord.gz`, the bands' values at the
    pixel and its class): a model trained on the points maps the image. Laid out as the ACES exports the README's
    quick start reads (`out_dir/gee-aces-points/`, `out_dir/gee-aces-image/`).

    Returns:
      {"points": {split: path}, "image": [shard path, mixer path]}.
    Raises:
      ConfigError: before writing anything, as `write_image_export` and `write_table_export` do, when the
        splits ask for more points than the image has pixels, or when any file it would write exists (the real
        exports it stands in for are never overwritten).
    """
    total, pixels_in_image = sum(splits.values()), patches * patch_size * patch_size
    _check(shards=1, records=1, bands=bands, label="class", classes=classes, dtypes=(FLOAT,), dtype=FLOAT)
    if not splits or min(splits.values()) < 1:
        raise ConfigError(f"every split needs at least one point, got {dict(splits)}")
    if patch_size < 1 or patches < 1 or total > pixels_in_image:
        raise ConfigError(f"{total} points asked of {patches} patch(es) of {patch_size}x{patch_size} pixels "
                          f"({pixels_in_image} pixels)")
    image_dir = os.path.join(out_dir, image_folder)
    targets = [os.path.join(out_dir, points_folder, f"{split}.tfrecord.gz") for split in splits]
    targets += [os.path.join(image_dir, f"{image_prefix}.tfrecord.gz"), os.path.join(image_dir, f"{image_prefix}.json")]
    found = [t for t in targets if tf.io.gfile.exists(t)]
    if found:   # the stand-ins go where the real exports are read from: never over them
        raise ConfigError(f"{found[0]} exists{f' (and {len(found) - 1} more)' if len(found) > 1 else ''}: the "
                          "stand-ins never overwrite an export; write them into another folder, or remove these")
    per_row = max(1, math.ceil(math.sqrt(patches)))
    rng = np.random.default_rng(seed)
    field = _Field(rng, len(bands), classes, wavelength=max(8.0, patch_size / 2))
    image = write_image_export(image_dir, prefix=image_prefix, shards=1, records=patches, bands=bands, label=None,
                               classes=classes, patch_size=patch_size, field=field)
    named = [os.path.join(image_dir, f"{image_prefix}.tfrecord.gz"), os.path.join(image_dir, f"{image_prefix}.json")]
    for old, new in zip(image, named):
        tf.io.gfile.rename(old, new, overwrite=True)
    # distinct pixels of the image's patches (the grid's full rows and columns: where patches were written)
    pixels = rng.choice(pixels_in_image, size=total, replace=False)
    rows, cols = _pixel_positions(pixels, per_row, patch_size)
    values = field.values(rows, cols)
    labels = field.target(values, False)
    paths, start = {}, 0
    for split, n in splits.items():
        paths[split] = _write_rows(os.path.join(out_dir, points_folder), split, values[start:start + n],
                                   labels[start:start + n], bands=bands, label="class", dtype=FLOAT, depths={},
                                   shards=1, compressed=True)[0]
        start += n
    return {"points": paths, "image": named}


def _pixel_positions(pixels: np.ndarray, per_row: int, patch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel indices counted patch by patch (patches row-major over the grid, pixels row-major within a patch) as
    global (row, col) positions on the grid, as `write_image_export` places its patches."""
    patch, within = np.divmod(pixels, patch_size * patch_size)
    prow, pcol = np.divmod(patch, per_row)
    r, c = np.divmod(within, patch_size)
    return prow * patch_size + r, pcol * patch_size + c
