"""The feature spec: which features are inputs and label, how they are stored, and what the model receives.

One source of truth for shapes: the pipeline parses by it, the model is built from `input_shape`/`label_shape`,
`validate_spec` checks the shards against it before training, and `harness inspect` prints one ready to use.
Storage facts (docs/GEE_FORMAT.md): one feature per band, keyed by band name, in arbitrary order; numbers are
float lists (int64 and bytes lists exist too); an image band is a flat row-major list of S*S values where
S = patchDimensions + kernel margin; labels are stored as floats and are cast after parsing.
"""
from __future__ import annotations

import collections
import dataclasses
import difflib
import logging
import math
import numbers
import re
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from harness.choices import DATA_KINDS, TASKS
from harness.data import records
from harness.data.records import BYTES, EMPTY, FLOAT, INT64, FeatureInfo
from harness.data.shards import Mixer, Shard
from harness.errors import (EmptyFeatureError, FeatureDtypeError, FeatureLengthError, MissingFeatureError,
                            SchemaDriftError, SpecError, SpecMismatchError)

log = logging.getLogger(__name__)

IMAGE, TABLE = DATA_KINDS
DICT, TIME = "dict", "time"
CLASSIFICATION, REGRESSION = TASKS
DTYPES = (FLOAT, INT64, BYTES)
# Names Earth Engine users give the label, most likely first (checked case-insensitively).
LABEL_NAMES = ("label", "labels", "class", "classes", "landcover", "land_cover", "lc", "target", "y")

Shape = tuple[int, ...]
_CHANNEL = re.compile(r"(.+)\[(\d+)\]")  # `ndvi[3]`: plane 3 of the array band ndvi


def _closest(name: str, keys: Sequence[str]) -> Optional[str]:
    """The available key most like `name`: a case-insensitive match first (`Landcover` -> `landcover`)."""
    for k in keys:
        if k.lower() == name.lower():
            return k
    lowered = {k.lower(): k for k in keys}
    m = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[m[0]] if m else None


def _square(n: int) -> Optional[int]:
    r = math.isqrt(n)
    return r if r * r == n else None


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What to read from each record and how to deliver it.

    Attributes:
      kind: "image" (each band a flat list of S*S values; inputs [batch, height, width, bands]) or "table" (each
        band one value; inputs [batch, bands]).
      bands: input feature names, in channel order.
      label: the label feature, or None (an unlabelled spec can be inspected and validated, not trained on).
      dtypes: storage dtype per feature, "float" | "int64" | "bytes" (uint8 raw bytes, one string of S*S bytes per
        band); features not listed are "float", as Earth Engine writes them.
      patch_size: P, the patch side WITHOUT the kernel margin (mixer patchDimensions), pixels; images only.
      kernel_margin: k, extra pixels stored per side pair: the stored patch is (P+k) x (P+k).
      crop_margin: crop the stored patch to its central P x P (rows/cols [k//2, k//2 + P]) after parsing.
      resize: deliver patches resized to resize x resize (bilinear for bands, nearest for the label mask).
      band_groups: group name -> its bands (multi-temporal or multi-sensor inputs), in delivery order; when set,
        `bands` is their concatenation.
      group_delivery: "dict" (one tensor per group) or "time" (groups stacked on axis 1: [batch, time, h, w, c]
        or [batch, time, c]; every group must then have the same number of bands).
      num_classes: number of label classes, when known.
      task: "classification" (label cast to int32) or "regression" (label float32).
      ignore_label: the label value that marks nodata: those pixels (examples) are delivered as
        `harness.data.labels.IGNORED` (-1) for classification, NaN for regression, and left out of the loss and of
        every metric; they are not class ids (the class-id rule lets them pass, the class count ignores them).
      class_names: one name per class, in class-id order (names the per-class metrics), or empty.
      depths: Earth Engine's `tensorDepths`: band -> D, the values per pixel (image) or per row (table) of an
        array band. An image array band is stored CHW ("When exporting images, the data is ordered as channels,
        height, width", Earth Engine's TFRecord guide): a flat list of D*S*S values, the depth outermost. It is
        delivered as D channels named `band[0]` ... `band[D-1]` (`channels`). Bands not listed hold 1 value.
      collapsed: Earth Engine's `collapseBands`: stored feature -> the bands it holds, in their order (each band
        its `depths` deep, CHW as above). Earth Engine names the feature after the first band; which band sits
        where is not written in the records: the list is the user's (or `refine`'s, from --bands), and the label
        may be one of them.
      sequence: Earth Engine's `sequenceData`: each record is a tf.train.SequenceExample of one pixel, bands of
        depth 1 in its context, array bands as its feature lists (one value per step); a table spec.
      input_nodata: an input value that is no measurement: Earth Engine's `defaultValue` (0 unless set), which
        fills masked pixels and pads arrays shorter than their depth. Left out of the band statistics, and
        delivered as `input_fill`.
      input_fill: channel -> the value nodata inputs are delivered as: the channel's mean over its valid values
        in the run's sample (set by the training job; the models' Normalization maps it to 0). Until it is set,
        inputs are delivered as stored.
    """

    kind: str
    bands: tuple[str, ...]
    label: Optional[str] = None
    dtypes: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    patch_size: Optional[int] = None
    kernel_margin: int = 0
    crop_margin: bool = False
    resize: Optional[int] = None
    band_groups: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, hash=False)
    group_delivery: str = DICT
    num_classes: Optional[int] = None
    task: str = CLASSIFICATION
    ignore_label: Optional[float] = None
    class_names: tuple[str, ...] = ()
    depths: Mapping[str, int] = dataclasses.field(default_factory=dict, hash=False)
    collapsed: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, hash=False)
    sequence: bool = False
    input_nodata: Optional[float] = None
    input_fill: Mapping[str, float] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self):
        def fix(name, value):
            object.__setattr__(self, name, value)

        fix("bands", tuple(self.bands))
        fix("class_names", tuple(self.class_names))
        fix("dtypes", dict(self.dtypes))
        fix("band_groups", {str(g): tuple(b) for g, b in dict(self.band_groups).items()})
        fix("depths", {str(b): int(d) for b, d in dict(self.depths).items() if int(d) != 1})
        fix("collapsed", {str(f): tuple(b) for f, b in dict(self.collapsed).items()})
        fix("input_fill", {str(c): float(v) for c, v in dict(self.input_fill).items()})
        if self.group_delivery == TIME and not self.band_groups and self.depths:
            fix("band_groups", self._time_groups())
        if self.band_groups:
            grouped = tuple(c for g in self.band_groups.values() for c in g)
            from_groups = tuple(dict.fromkeys(self.band_of(c) for c in grouped))
            if self.bands and (set(self.bands) != set(from_groups) or len(set(grouped)) != len(grouped)
                               or set(grouped) != {c for b in self.bands for c in self.channels_of(b)}):
                raise SpecError(f"bands {list(self.bands)} differ from the bands of band_groups {list(grouped)}")
            fix("bands", from_groups)
        self._check()

    def _time_groups(self) -> dict[str, tuple[str, ...]]:
        """group_delivery "time" over array bands: step t holds `band[t]` of every band (all of one depth)."""
        depth = {b: self.depth_of(b) for b in self.bands}
        if len(set(depth.values())) != 1:
            raise SpecError(f"group_delivery 'time' over array bands needs every band of one depth, got {depth}: "
                            "drop the bands of another depth (--bands), or deliver the depths as channels")
        steps = next(iter(depth.values()))
        return {f"t{t}": tuple(f"{b}[{t}]" for b in self.bands) for t in range(steps)}

    def _check(self) -> None:
        if self.kind not in (IMAGE, TABLE):
            raise SpecError(f"kind must be 'image' or 'table', got {self.kind!r}")
        if not self.bands:
            raise SpecError("no bands declared")
        dup = [b for b, n in collections.Counter(self.bands).items() if n > 1]
        if dup:
            raise SpecError(f"bands declared twice: {dup}")
        if self.label is not None and self.label in self.bands:
            raise SpecError(f"label {self.label!r} is also declared as a band")
        for name, dt in self.dtypes.items():
            if dt not in DTYPES:
                raise SpecError(f"feature {name!r}: dtype must be one of {DTYPES}, got {dt!r}")
        if self.label is not None and self.dtype_of(self.label) == BYTES:
            raise SpecError(f"label {self.label!r}: a bytes label is not supported (declare float or int64)")
        if self.task not in (CLASSIFICATION, REGRESSION):
            raise SpecError(f"task must be 'classification' or 'regression', got {self.task!r}")
        if self.ignore_label is not None and not (isinstance(self.ignore_label, numbers.Real)
                                                  and not isinstance(self.ignore_label, bool)
                                                  and math.isfinite(self.ignore_label)):
            raise SpecError(f"ignore_label must be a finite number, got {self.ignore_label!r}")
        if self.task == CLASSIFICATION and self.ignore_label is not None and self.ignore_label != round(
                self.ignore_label):
            raise SpecError(f"ignore_label {self.ignore_label!r}: a classification label is an integer; give the "
                            "integer your export writes for nodata")
        if (self.ignore_label is not None and self.label is not None and self.dtype_of(self.label) == FLOAT
                and abs(self.ignore_label) > float(np.finfo(np.float32).max)):
            raise SpecError(f"ignore_label {self.ignore_label!r} is beyond the float32 range of label "
                            f"{self.label!r} (|x| <= {float(np.finfo(np.float32).max):.4g}): no stored label can equal it")
        if self.class_names and self.task != CLASSIFICATION:
            raise SpecError("class_names are for task classification")
        if self.class_names and self.num_classes and len(self.class_names) != self.num_classes:
            raise SpecError(f"class_names has {len(self.class_names)} names for num_classes {self.num_classes}")
        if self.group_delivery not in (DICT, TIME):
            raise SpecError(f"group_delivery must be 'dict' or 'time', got {self.group_delivery!r}")
        if self.group_delivery == TIME and self.band_groups:
            sizes = {g: len(b) for g, b in self.band_groups.items()}
            if len(set(sizes.values())) > 1:
                raise SpecError(f"group_delivery 'time' needs groups of equal size, got {sizes}")
        self._check_layout()
        if self.kind == IMAGE:
            if not self.patch_size or self.patch_size < 1:
                raise SpecError(f"an image spec needs patch_size >= 1, got {self.patch_size!r}")
            if self.kernel_margin < 0:
                raise SpecError(f"kernel_margin must be >= 0, got {self.kernel_margin}")
            if self.resize is not None and self.resize < 1:
                raise SpecError(f"resize must be >= 1, got {self.resize}")
        elif any(self.dtype_of(b) == BYTES for b in self.bands):
            raise SpecError("a table spec takes numeric bands only (float or int64)")

    def _check_layout(self) -> None:
        for band, d in self.depths.items():
            if isinstance(d, bool) or d < 1:
                raise SpecError(f"data.depths.{band}: expected a positive integer, got {d!r}")
        if self.label is not None and self.depth_of(self.label) != 1:
            raise SpecError(f"label {self.label!r} has depth {self.depth_of(self.label)}: a label is one value per "
                            "pixel (row)")
        seen: dict[str, str] = {}
        for feature, names in self.collapsed.items():
            if self.kind != IMAGE:
                raise SpecError("collapsed bands are an image export option (collapseBands)")
            if not names:
                raise SpecError(f"data.collapsed.{feature}: expected the list of bands it holds")
            for b in names:
                if b in seen:
                    raise SpecError(f"band {b!r} is in two collapsed features: {seen[b]!r} and {feature!r}")
                seen[b] = feature
        stored = set(self.collapsed)
        for b in self.bands + ((self.label,) if self.label else ()):
            if b not in seen and b in stored and b not in self.collapsed.get(b, ()):
                raise SpecError(f"{b!r} names a collapsed feature and a band outside it")
        if self.input_nodata is not None and not (isinstance(self.input_nodata, numbers.Real)
                                                  and not isinstance(self.input_nodata, bool)
                                                  and math.isfinite(self.input_nodata)):
            raise SpecError(f"input_nodata must be a finite number, got {self.input_nodata!r}")
        if self.sequence and self.kind != TABLE:
            raise SpecError("sequence (sequenceData: one SequenceExample per pixel) is read as a table: kind table")
        if self.sequence and any(self.dtype_of(f) == BYTES for f in self.features):
            raise SpecError("a sequence spec takes numeric bands only (float or int64)")

    # --- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Mapping) -> "DataSpec":
        """Build a spec from the `data:` section of a YAML run config.

        Keys (all optional except as noted):
          kind: image | table (default: image when patch_size is given, else table)
          bands: [names]                  (required unless band_groups is given)
          label: name
          dtype: float | int64 | bytes    (storage of every band; default float)
          dtypes: {feature: dtype}        (per-feature storage, overrides dtype; the label included)
          patch_size: P                   (images: patchDimensions, without margin)
          kernel_margin: k                (images: stored patch is P + k; default 0)
          crop_margin: bool               (crop to the central P x P; default false)
          resize: R                       (deliver R x R patches)
          band_groups: {group: [bands]}   (named inputs; order kept)
          group_delivery: dict | time     (default dict)
          num_classes: int
          task: classification | regression (default classification)
          ignore_label: number            (the label's nodata value: left out of loss and metrics)
          class_names: [names]            (one per class, in class-id order: names the per-class metrics)
          depths: {band: D}               (tensorDepths: array bands, D values per pixel/row, D channels)
          collapsed: {feature: [bands]}   (collapseBands: the bands one stored feature holds, in order)
          sequence: bool                  (sequenceData: one SequenceExample per pixel; a table)
          input_nodata: number            (defaultValue as nodata: out of the statistics, delivered as the mean)
          input_fill: {channel: number}   (what nodata inputs are delivered as; the training job writes it)

        Raises:
          SpecError: if `config` is not a mapping; for an unknown key (naming the closest known one); for a value
            of the wrong type or out of range (the message names `data.<key>`, the value and what was expected:
            a positive integer for patch_size, resize and num_classes, an integer >= 0 for kernel_margin, a list
            of band names for bands and each band_groups value, true/false for crop_margin, a string for label,
            one of the allowed words for kind, dtype(s), group_delivery and task, a finite number for ignore_label (an
            integer for classification), a list of strings for class_names); or for an inconsistent spec.
        """
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise SpecError(f"data: expected a mapping (bands: [...], label: ..., patch_size: ...), got "
                            f"{_got(config)}")
        for key in config:
            if key not in _CONFIG_KEYS:
                hint = _closest(str(key), sorted(_CONFIG_KEYS))
                raise SpecError(f"unknown data config key {key!r}" + (f" (did you mean {hint!r}?)" if hint else ""))
        groups = _band_groups(config.get("band_groups"))
        bands = _names(config.get("bands"), "bands") if config.get("bands") is not None else ()
        dtype = _choice(config, "dtype", DTYPES, FLOAT)
        dtypes = {b: dtype for b in bands or (b for g in groups.values() for b in g)}
        dtypes.update(_dtypes(config.get("dtypes")))
        patch_size = _count(config, "patch_size", minimum=1)
        kind = _choice(config, "kind", (IMAGE, TABLE), IMAGE if patch_size else TABLE)
        return cls(kind=kind, bands=bands, label=_label(config.get("label")), dtypes=dtypes,
                   patch_size=patch_size, kernel_margin=_count(config, "kernel_margin", minimum=0) or 0,
                   crop_margin=_flag(config, "crop_margin"), resize=_count(config, "resize", minimum=1),
                   band_groups=groups, group_delivery=_choice(config, "group_delivery", (DICT, TIME), DICT),
                   num_classes=_count(config, "num_classes", minimum=1),
                   task=_choice(config, "task", (CLASSIFICATION, REGRESSION), CLASSIFICATION),
                   ignore_label=_number(config, "ignore_label"),
                   class_names=_names(config["class_names"], "class_names", "class") if config.get("class_names") else (),
                   depths=_depths(config.get("depths")), collapsed=_collapsed(config.get("collapsed")),
                   sequence=_flag(config, "sequence"), input_nodata=_number(config, "input_nodata"),
                   input_fill=_fills(config.get("input_fill")))

    def to_config(self) -> dict:
        """The `data:` section that from_config reads back into an equal spec (defaults left out)."""
        out: dict = {"kind": self.kind}
        if self.band_groups:
            out["band_groups"] = {g: list(b) for g, b in self.band_groups.items()}
            out["group_delivery"] = self.group_delivery
        else:
            out["bands"] = list(self.bands)
        if self.label:
            out["label"] = self.label
        stored = {f: self.dtype_of(f) for f in self.features}
        if len(set(stored.values())) == 1:
            out["dtype"] = next(iter(stored.values()))
        else:
            out["dtypes"] = stored
        if self.kind == IMAGE:
            out["patch_size"] = self.patch_size
            out["kernel_margin"] = self.kernel_margin
            if self.crop_margin:
                out["crop_margin"] = True
            if self.resize:
                out["resize"] = self.resize
        if self.num_classes:
            out["num_classes"] = self.num_classes
        if self.task != CLASSIFICATION:
            out["task"] = self.task
        if self.ignore_label is not None:
            out["ignore_label"] = self.ignore_label
        if self.class_names:
            out["class_names"] = list(self.class_names)
        if self.depths:
            out["depths"] = dict(self.depths)
        if self.collapsed:
            out["collapsed"] = {f: list(b) for f, b in self.collapsed.items()}
        if self.sequence:
            out["sequence"] = True
        if self.input_nodata is not None:
            out["input_nodata"] = self.input_nodata
        if self.input_fill:
            out["input_fill"] = dict(self.input_fill)
        return out

    def replace(self, **changes) -> "DataSpec":
        return dataclasses.replace(self, **changes)

    # --- derived facts -----------------------------------------------------------------------------------------
    @property
    def features(self) -> tuple[str, ...]:
        """Every feature read from a record (stored features: a collapsed one once), the bands' then the label's."""
        names = self.bands + ((self.label,) if self.label else ())
        return tuple(dict.fromkeys(self.feature_of(b)[0] for b in names))

    def dtype_of(self, feature: str) -> str:
        """Storage dtype of a stored feature (a band inside a collapsed feature: the feature's)."""
        return self.dtypes.get(feature, self.dtypes.get(self.feature_of(feature)[0], FLOAT))

    def depth_of(self, band: str) -> int:
        """D, the values per pixel (row) of `band`: its tensorDepths entry, else 1."""
        return self.depths.get(band, 1)

    def channels_of(self, band: str) -> tuple[str, ...]:
        """The channels `band` is delivered as: itself, or `band[0]` ... `band[D-1]` for an array band."""
        d = self.depth_of(band)
        return (band,) if d == 1 else tuple(f"{band}[{i}]" for i in range(d))

    @property
    def channels(self) -> tuple[str, ...]:
        """The model's input channels in delivery order (without band groups): every band's `channels_of`."""
        if self.band_groups:
            return tuple(c for g in self.band_groups.values() for c in g)
        return tuple(c for b in self.bands for c in self.channels_of(b))

    def band_of(self, channel: str) -> str:
        """The band a channel name belongs to (`ndvi[3]` -> `ndvi` when ndvi is an array band)."""
        m = _CHANNEL.fullmatch(channel)
        if m and int(m.group(2)) < self.depth_of(m.group(1)):
            return m.group(1)
        return channel

    def feature_of(self, band: str) -> tuple[str, int]:
        """(stored feature, offset): where `band` is stored, and its first value-plane's index in that feature's
        depth axis (0 unless collapsed)."""
        for feature, names in self.collapsed.items():
            if band in names:
                return feature, sum(self.depth_of(b) for b in names[:names.index(band)])
        return band, 0

    def feature_depth(self, feature: str) -> int:
        """Value planes of a stored feature: the sum of its collapsed bands' depths, else its own depth."""
        if feature in self.collapsed:
            return sum(self.depth_of(b) for b in self.collapsed[feature])
        return self.depth_of(feature)

    def channel_source(self, channel: str) -> tuple[str, int]:
        """(stored feature, plane index) of one delivered channel."""
        band = self.band_of(channel)
        feature, offset = self.feature_of(band)
        return feature, offset + (int(_CHANNEL.fullmatch(channel).group(2)) if band != channel else 0)

    def values_of(self, feature: str) -> int:
        """Values a stored feature holds in a record: planes x S*S (images; bytes for a uint8 band), planes
        (tables; the steps of a sequence's feature list)."""
        return self.feature_depth(feature) * self.values_per_feature()

    @property
    def stored_size(self) -> Optional[int]:
        """S = P + k, the side of a stored patch in pixels (images), else None."""
        return self.patch_size + self.kernel_margin if self.kind == IMAGE else None

    @property
    def output_size(self) -> Optional[int]:
        """Side of a delivered patch: resize, else P when cropping, else S (images), else None."""
        if self.kind != IMAGE:
            return None
        return self.resize or self.output_size_before_resize

    @property
    def output_size_before_resize(self) -> Optional[int]:
        """Side of a patch before `resize`: P when cropping, else S (images), else None."""
        if self.kind != IMAGE:
            return None
        return self.patch_size if self.crop_margin else self.stored_size

    def values_per_feature(self) -> int:
        """Values each band (and the label) holds in a record: S*S for images (bytes for a uint8 band), 1 for
        tables."""
        return self.stored_size ** 2 if self.kind == IMAGE else 1

    def is_array(self, feature: str) -> bool:
        """True for a stored feature of several planes (an array band or collapsed bands)."""
        return self.feature_depth(feature) > 1 or feature in self.collapsed

    def _shape(self, channels: int) -> Shape:
        return (self.output_size, self.output_size, channels) if self.kind == IMAGE else (channels,)

    @property
    def input_shape(self) -> Union[Shape, dict[str, Shape]]:
        """Model input shape without the batch axis: (height, width, bands) after crop/resize for images,
        (bands,) for tables; with band groups a dict {group: shape} ("dict") or (time, ...) ("time")."""
        if not self.band_groups:
            return self._shape(len(self.channels))
        if self.group_delivery == TIME:
            first = next(iter(self.band_groups.values()))
            return (len(self.band_groups),) + self._shape(len(first))
        return {g: self._shape(len(b)) for g, b in self.band_groups.items()}

    @property
    def label_shape(self) -> Shape:
        """(height, width) of the label mask for images, () for tables."""
        return (self.output_size, self.output_size) if self.kind == IMAGE else ()


def layout_notes(spec: DataSpec, schema: Mapping[str, FeatureInfo] = {}) -> list[str]:
    """One line per array band or collapsed feature: how its planes reach the model; and the features of the
    records (`schema`) that the spec does not read (said once per run: nothing is left out silently)."""
    out = []
    unread = [f"{n} ({i.dtype}{' feature list' if i.sequence else ''}, {i.length} values)"
              for n, i in schema.items() if n not in spec.features]
    if unread:
        out.append(f"not read (no band or label of the spec; --bands names what to read): {', '.join(unread)}")
    for feature, names in spec.collapsed.items():
        out.append(f"collapsed feature {feature!r} read as {', '.join(names)} (in that order; data.collapsed)")
    arrays = [b for b in spec.bands if spec.depth_of(b) > 1]
    if arrays and not spec.band_groups:
        bands = ", ".join(f"{b} (depth {spec.depth_of(b)})" for b in arrays)
        out.append(f"array band(s) {bands} delivered as one channel per plane (`band[i]`, {len(spec.channels)} "
                   "channels in all); for a time axis [T, ...] give data.group_delivery: time")
    return out


# --- reading the `data:` config section: each value checked for type and range, errors naming `data.<key>` -------
_CONFIG_KEYS = frozenset({"kind", "bands", "label", "dtype", "dtypes", "patch_size", "kernel_margin", "crop_margin",
                          "resize", "band_groups", "group_delivery", "num_classes", "task",
                          "ignore_label", "class_names", "depths", "collapsed", "sequence", "input_nodata",
                          "input_fill"})


def _got(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _count(config: Mapping, key: str, *, minimum: int) -> Optional[int]:
    """config[key] as an int >= minimum, or None when absent or null. YAML `true` is refused: bool is an int."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise SpecError(f"data.{key}: expected {expected}, got {_got(value)}")
    return int(value)


def _number(config: Mapping, key: str) -> Optional[float]:
    """config[key] as a finite int or float, or None when absent or null (YAML `true` is refused)."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise SpecError(f"data.{key}: expected a finite number, got {_got(value)}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _choice(config: Mapping, key: str, allowed: Sequence[str], default: str) -> str:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(f"data.{key}: expected one of {', '.join(allowed)}; got {_got(value)}")
    return value


def _flag(config: Mapping, key: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise SpecError(f"data.{key}: expected true or false, got {_got(value)}")
    return value


def _label(value) -> Optional[str]:
    if value is not None and (not isinstance(value, str) or not value):
        raise SpecError(f"data.label: expected a feature name (a string), got {_got(value)}")
    return value


def _names(value, where: str, what: str = "band") -> tuple[str, ...]:
    """A list of band (or class) names; a bare string is refused rather than split into characters."""
    leaf = where.rpartition(".")[2]
    if isinstance(value, str):
        raise SpecError(f"data.{where}: expected a list of {what} names, got {_got(value)}; write {leaf}: [{value}]")
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"data.{where}: expected a list of {what} names, got {_got(value)}")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name:
            raise SpecError(f"data.{where}[{i}]: expected a {what} name (a string; quote names YAML reads as "
                            f"numbers), got {_got(name)}")
    return tuple(value)


def _mapping(value, key: str, what: str) -> Mapping:
    """A config value that must be a mapping: {} when absent, else SpecError naming `data.<key>` and `what`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"data.{key}: expected a mapping {what}, got {_got(value)}")
    return value


def _band_groups(value) -> dict[str, tuple[str, ...]]:
    value = _mapping(value, "band_groups", "group: [bands]")
    return {str(g): _names(b, f"band_groups.{g}") for g, b in value.items()}


def _depths(value) -> dict[str, int]:
    value = _mapping(value, "depths", "band: depth (tensorDepths)")
    for name, d in value.items():
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
            raise SpecError(f"data.depths.{name}: expected a positive integer, got {_got(d)}")
    return {str(n): int(d) for n, d in value.items()}


def _collapsed(value) -> dict[str, tuple[str, ...]]:
    value = _mapping(value, "collapsed", "feature: [bands] (collapseBands)")
    return {str(f): _names(b, f"collapsed.{f}") for f, b in value.items()}


def _fills(value) -> dict[str, float]:
    value = _mapping(value, "input_fill", "channel: value")
    return {str(c): _number(value, c) for c in value}


def _dtypes(value) -> dict[str, str]:
    value = _mapping(value, "dtypes", "feature: dtype")
    for name, dt in value.items():
        if not isinstance(dt, str) or dt not in DTYPES:
            raise SpecError(f"data.dtypes.{name}: expected one of {', '.join(DTYPES)}; got {_got(dt)}")
    return {str(n): dt for n, dt in value.items()}


def input_fill(spec: DataSpec, mean) -> dict[str, float]:
    """channel -> its sampled mean (`harness.train.model.builtin.band_moments`: `[channels]`, per band position of
    a time axis, or `{group: [channels]}`), the value `spec.input_nodata` inputs are delivered as."""
    if isinstance(mean, Mapping):
        return {c: float(mean[g][i]) for g, chans in spec.band_groups.items() for i, c in enumerate(chans)}
    if spec.band_groups:  # time: one mean per band position over the steps
        return {c: float(mean[i]) for chans in spec.band_groups.values() for i, c in enumerate(chans)}
    return {c: float(mean[i]) for i, c in enumerate(spec.channels)}


# --- inference ---------------------------------------------------------------------------------------------------
def merged_schema(examples) -> dict[str, FeatureInfo]:
    """One schema over several Examples: per feature the first non-empty FeatureInfo (empty if never filled); a
    SequenceExample's feature list: its longest."""
    out: dict[str, FeatureInfo] = {}
    for ex in examples:
        for name, info in records.schema_of(ex).items():
            if name not in out or (out[name].dtype == EMPTY and info.dtype != EMPTY):
                out[name] = info
            elif info.sequence and info.length > out[name].length:  # a feature list: its longest
                out[name] = info
    return dict(sorted(out.items()))


def guess_label(names: Sequence[str]) -> Optional[str]:
    lowered = {n.lower(): n for n in names}
    for candidate in LABEL_NAMES:
        if candidate in lowered:
            return lowered[candidate]
    return None


def guess_band_groups(bands: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Groups from a shared `_suffix` (`red_before ... nir_before`, `red_during ... nir_during`): returned only
    when there are at least two suffixes, each over the same band stems in the same order, and every band fits."""
    groups: dict[str, list[str]] = {}
    for b in bands:
        stem, sep, suffix = b.rpartition("_")
        if not sep or not stem:
            return {}
        groups.setdefault(suffix, []).append(stem)
    stems = [tuple(s) for s in groups.values()]
    if len(groups) < 2 or len(set(stems)) != 1 or len(stems[0]) < 1:
        return {}
    return {g: tuple(f"{s}_{g}" for s in stems[0]) for g in groups}


def _values(info: FeatureInfo) -> int:
    return info.nbytes if info.dtype == BYTES and info.length == 1 else info.length


def _image_side(schema: Mapping[str, FeatureInfo], exclude: Optional[str], *, patch: Optional[int] = None,
                planes: Mapping[str, int] = {}) -> Optional[int]:
    """S, the stored patch side, from the features' value counts: each band holds D*S*S values (D planes: 1, an
    array band's depth, or the bands collapsed into it; Earth Engine lays planes out CHW).

    Candidate sides are the square roots of the counts (of count / D where `planes` declares D) and, with a mixer,
    every S >= patchDimensions `patch` whose S*S divides a count; the side kept fits the most features as one
    plane, then the most as whole planes, then is the smallest. None when no count above 1 is a square (a table).
    """
    counts = {n: _values(i) for n, i in schema.items() if i.dtype != EMPTY and not i.sequence and _values(i) > 0}
    per_plane = {n: c // planes[n] for n, c in counts.items() if n in planes and c % planes[n] == 0}
    if any(_square(c) is None for c in per_plane.values()):
        return None
    if per_plane:
        sides = {_square(c) for c in per_plane.values()}
        return sides.pop() if len(sides) == 1 else None
    plain = collections.Counter(c for n, c in counts.items() if n != exclude)
    if not plain:
        return None
    common, _ = plain.most_common(1)[0]
    candidates = {_square(c) for c in counts.values() if c > 1 and _square(c)}
    if patch:
        candidates |= {s for c in counts.values() for s in range(patch, math.isqrt(c) + 1) if c % (s * s) == 0}
        candidates = {s for s in candidates if s >= patch} or candidates  # else: the mixer disagrees (named later)
    elif not (common > 1 and _square(common)):
        return None  # the most common count is not a patch: a table (an array property may be a square)

    def score(s):
        return (sum(c == s * s for c in counts.values()), sum(c % (s * s) == 0 for c in counts.values()), -s)
    return max(candidates, key=score) if candidates else None


def infer_spec(shards: Sequence[Shard], *, mixer: Optional[Mixer] = None, label: Optional[str] = None,
               kernel_margin: Optional[int] = None, records_to_read: int = 8, group_bands: bool = False,
               schema: Optional[Mapping[str, FeatureInfo]] = None, read=None, declared: Optional[Mapping] = None
               ) -> DataSpec:
    """Infer a spec from the first records of the first non-empty shard.

    Image when some value count is D*S*S with S > 1 (or a mixer is present; `_image_side`): bands are the
    features of D*S*S values, with D > 1 an array band (tensorDepths) of depth D, delivered as D channels; P comes
    from the mixer's patchDimensions, else P = S - kernel_margin (default 0). Table otherwise: bands are the
    numeric features, one of several values an array band of that depth. SequenceExample records (sequenceData):
    a table of context bands and feature-list array bands, each as deep as its longest list in the records read.
    The label is `label`, else the first feature named like one (LABEL_NAMES: label, class, landcover, ...), else
    None. Which bands a collapsed feature holds is not in the records: `declared` (the `data:` config) names them
    (`collapsed`, or `bands` listing more names than stored features, see `refine`), and its `depths` fix the
    planes of each feature.

    Args:
      group_bands: also group bands by suffix (guess_band_groups) into a dict-delivered spec.
      schema: a schema already read (skips reading).
      read: `fn(shard, n) -> [tf.train.Example]`, the first records' reader (`ShardSet.first_examples` reads each
        shard's first records once per run).

    Raises:
      SpecError: if label is not a string, no shard holds a record, or the mixer and the stored side disagree.
      MissingFeatureError: if the label is absent from the records (naming the closest key).
      and the reading errors of records.first_examples.
    """
    label = _label(label)  # a YAML `label: 3` reaches here before from_config
    declared = dict(declared or {})
    collapsed = _collapsed(declared.get("collapsed")) if isinstance(declared.get("collapsed"), Mapping) else {}
    depths = _depths(declared.get("depths")) if isinstance(declared.get("depths"), Mapping) else {}
    inside = {b for names in collapsed.values() for b in names}
    if isinstance(declared.get("bands"), (list, tuple)) and collapsed == {}:
        inside |= {b for b in declared["bands"] if isinstance(b, str)}  # bands no record stores: collapsed ones
    if schema is None:
        schema = read_schema(shards, records_to_read, read=read)
    if label is not None and label not in schema and (label not in inside and not (
            inside - set(schema) and "bands" in declared)):
        hint = _closest(label, list(schema))
        raise MissingFeatureError(f"{shards[0].path}: label {label!r} absent from the records" +
                                  (f"; closest available key: {hint!r}" if hint else f"; keys: {list(schema)}"))
    label = label or guess_label(list(schema))
    sequence = any(i.sequence for i in schema.values())
    planes = {f: sum(depths.get(b, 1) for b in names) for f, names in collapsed.items()}
    planes.update({b: d for b, d in depths.items() if b in schema and b not in collapsed})
    # A label of one value without a mixer is a table's row (its array properties may hold a square count).
    row_label = mixer is None and label in schema and _values(schema[label]) == 1
    side = None if sequence or row_label else _image_side(
        schema, label, patch=mixer.patch_dimensions[0] if mixer else None, planes=planes)
    found_depths: dict[str, int] = {}
    if (mixer is not None and not sequence) or side:  # per-pixel sequences are a table, mixer or not
        if not side:
            raise SpecError(f"{shards[0].path}: a mixer is present but no feature holds a square patch")
        if mixer is not None:
            p_w, p_h = mixer.patch_dimensions
            if p_w != p_h:
                raise SpecError(f"{mixer.path}: non-square patchDimensions {mixer.patch_dimensions} are not supported")
            patch, margin = p_w, side - p_w
            if margin < 0 or (kernel_margin is not None and kernel_margin != margin):
                raise SpecError(f"{mixer.path}: patchDimensions {p_w} and stored side {side} imply a kernel margin "
                                f"of {margin}" + (f", not {kernel_margin}" if kernel_margin is not None else ""))
        else:
            margin = kernel_margin or 0
            patch = side - margin
            if patch < 1:
                raise SpecError(f"kernel margin {margin} leaves no patch in a stored side of {side}")
        plane = side * side
        bands = [n for n, i in schema.items() if n != label and i.dtype != EMPTY and _values(i) % plane == 0
                 and _values(i) >= plane]
        found_depths = {n: _values(schema[n]) // plane for n in bands if _values(schema[n]) != plane}
        if label is not None and label in schema and label not in inside and _values(schema[label]) != plane:
            log.warning("label %r holds %d values, not a %dx%d mask: ignored", label, _values(schema[label]),
                        side, side)
            label = None
        kind = IMAGE
    else:
        bands = [n for n, i in schema.items() if n != label and i.dtype in (FLOAT, INT64) and i.length >= 1]
        found_depths = {n: schema[n].length for n in bands if schema[n].length > 1 or schema[n].sequence}
        patch, margin, kind = None, 0, TABLE
    if not bands:
        raise SpecError(f"{shards[0].path}: no feature usable as a band in {list(schema)}")
    dtypes = {n: schema[n].dtype for n in bands + ([label] if label and label in schema else [])}
    found_depths = {b: d for b, d in found_depths.items() if b not in collapsed}
    groups = guess_band_groups(bands) if group_bands and not found_depths else {}
    return DataSpec(kind=kind, bands=tuple(bands), label=label, dtypes=dtypes, patch_size=patch,
                    kernel_margin=margin, band_groups=groups, depths=found_depths, sequence=sequence)


def read_schema(shards: Sequence[Shard], n: int = 8, *, read=None) -> dict[str, FeatureInfo]:
    """merged_schema of the first `n` records of the first shard holding any (`read`: as infer_spec's).

    Raises:
      SpecError: if every shard is empty; and the errors of records.first_examples.
    """
    for shard in shards:
        examples = (read or records.first_examples)(shard, n)[:n]
        if examples:
            return merged_schema(examples)
    raise SpecError(f"no record in any of the {len(shards)} shard(s): nothing to infer a spec from")


# --- validation --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ValidationReport:
    """Result of validate_spec: shards checked (first record) and zero-record shards skipped (not an error)."""

    checked: tuple[str, ...]
    empty: tuple[str, ...]


def _side_text(n: int) -> str:
    side = _square(n)
    return f" ({n} = {side}x{side})" if side and n > 1 else ""


def check_feature(spec: DataSpec, name: str, schema: Mapping[str, FeatureInfo],
                  where: str) -> Optional[SpecMismatchError]:
    """The mismatch between the declared feature `name` and one record's schema, or None if it matches.

    `where` names the file and record ("path: record 0").
    """
    expected_dtype, n = spec.dtype_of(name), spec.values_of(name)
    role = "label" if name == spec.label else "band"
    if spec.sequence and name in schema and spec.is_array(name):
        return _check_steps(spec, name, schema[name], where)
    if name not in schema:
        hint = _closest(name, list(schema))
        return MissingFeatureError(f"{where}: {role} {name!r} declared but absent; " +
                                   (f"closest available key: {hint!r}" if hint else f"available: {list(schema)}"))
    info = schema[name]
    if info.dtype == EMPTY or info.length == 0 or (info.dtype == BYTES and info.nbytes == 0):
        return EmptyFeatureError(f"{where}: {role} {name!r} is present but holds no values "
                                 f"(expected {expected_dtype}, {n} values)")
    if spec.sequence and info.sequence:
        return FeatureLengthError(f"{where}: {role} {name!r}: expected one value in the SequenceExample's context, "
                                  f"found a feature list of {info.length} steps (declare its depth: "
                                  f"depths: {{{name}: {info.length}}})")
    if info.dtype != expected_dtype:
        note = ""
        if role == "label" and expected_dtype == INT64 and info.dtype == FLOAT:
            note = ("; Earth Engine stores every number as float (class 3 as 3.0): declare the label 'float', "
                    "the harness casts it to int32")
        return FeatureDtypeError(f"{where}: {role} {name!r}: expected dtype {expected_dtype}, found "
                                 f"{info.dtype}{note}")
    found = _values(info)
    if info.dtype == BYTES and info.length != 1:
        return FeatureLengthError(f"{where}: {role} {name!r}: expected one bytes string of {n} bytes, found "
                                  f"{info.length} strings")
    if found != n:
        unit = "bytes" if info.dtype == BYTES else "values"
        planes = spec.feature_depth(name)
        depth = (f" x {planes} planes ({'collapsed ' + ', '.join(spec.collapsed[name]) if name in spec.collapsed else 'depth ' + str(planes)})"
                 if spec.is_array(name) else "")
        if spec.kind == IMAGE:
            declared = f"{n} {unit} ({spec.stored_size}x{spec.stored_size} patch: P={spec.patch_size} + " \
                       f"margin {spec.kernel_margin}{depth})"
        else:
            declared = f"{n} value{'s' if n != 1 else ''} (table{depth})"
        return FeatureLengthError(f"{where}: {role} {name!r}: expected {declared}, found {found} "
                                  f"{unit}{_side_text(found)}")
    return None


def _check_steps(spec: DataSpec, name: str, info: FeatureInfo, where: str) -> Optional[SpecMismatchError]:
    """A sequence record's feature list: one value per step, at most `depth` steps (shorter ones are padded with
    0, Earth Engine's default value, as tensorDepths pads)."""
    depth = spec.feature_depth(name)
    if not info.sequence:
        return FeatureLengthError(f"{where}: band {name!r}: expected a feature list of up to {depth} steps (an "
                                  f"array band of a SequenceExample), found {info.length} value(s) in the context")
    if info.dtype not in (EMPTY, spec.dtype_of(name)) and info.length:
        return FeatureDtypeError(f"{where}: band {name!r}: expected dtype {spec.dtype_of(name)}, found {info.dtype}")
    if info.length > depth:
        return FeatureLengthError(f"{where}: band {name!r}: expected up to {depth} steps (depth {depth}), found "
                                  f"{info.length}: declare depths: {{{name}: {info.length}}}")
    if info.nbytes > 1:
        return FeatureLengthError(f"{where}: band {name!r}: expected one value per step, found {info.nbytes}")
    return None


def validate_spec(spec: DataSpec, shards: Sequence[Shard], *, read=None) -> ValidationReport:
    """Check the spec against the first record of every shard, before any training.

    Also a cheap framing check of each shard (its first record is read with its compression). `read`: the first
    records' reader, as infer_spec's (`ShardSet.first_examples`: each shard's first records read once per run).

    Returns:
      a ValidationReport; zero-record shards are listed there and logged, not an error.

    Raises:
      MissingFeatureError: a declared feature is absent (the message names the closest key: `Landcover` vs
        `landcover`).
      FeatureDtypeError: stored with another dtype (e.g. label declared int64 but stored float).
      FeatureLengthError: another number of values (e.g. 256 values where a 4x4 patch was declared).
      EmptyFeatureError: present but empty.
      SchemaDriftError: a declared feature matches in some shards and not in others (message lists both).
      CompressionMismatchError, NotTFRecordError, TruncatedShardError, NotExampleError: bad shard framing/content.
      SpecError: if every shard is empty.
    """
    problems: dict[str, list[tuple[Shard, SpecMismatchError]]] = {f: [] for f in spec.features}
    good: dict[str, list[tuple[Shard, FeatureInfo]]] = {f: [] for f in spec.features}
    checked, empty = [], []
    for shard in shards:
        examples = (read or records.first_examples)(shard, 1)[:1]
        if not examples:
            empty.append(shard.path)
            continue
        checked.append(shard.path)
        schema = records.schema_of(examples[0])
        for f in spec.features:
            err = check_feature(spec, f, schema, f"{shard.path}: record 0")
            if err is None:
                good[f].append((shard, schema[f]))
            else:
                problems[f].append((shard, err))
    if empty:
        log.warning("%d zero-record shard(s) skipped (counted, not an error): %s", len(empty), ", ".join(empty))
    if not checked:
        raise SpecError(f"all {len(shards)} shard(s) hold zero records")
    for f in spec.features:
        if not problems[f]:
            continue
        shard, err = problems[f][0]
        if not good[f]:
            raise err
        ok = good[f][0][0]
        raise SchemaDriftError(f"shards differ for feature {f!r}: {len(good[f])} shard(s) match the spec (e.g. "
                               f"{ok.path}) but {len(problems[f])} do not; first: {err}")
    return ValidationReport(tuple(checked), tuple(empty))


def _collapse_from_bands(inferred: DataSpec, declared: dict) -> dict:
    """`declared` with `collapsed` added when its `bands` name more bands than the records store: a stored
    feature of D planes (inferred as an array band) listed among the bands, followed by names no record holds,
    is read as Earth Engine's collapseBands feature holding those bands in the order given (and, when D is one
    more than them, the label last: Earth Engine collapses the bands in the image's order, and a label is added
    last by `addBands`; nothing in the records says where it sits, so the config then written says it).

    Raises:
      SpecError: when the names do not add up to the feature's planes.
    """
    bands = declared.get("bands")
    if "collapsed" in declared or not isinstance(bands, (list, tuple)) or inferred.kind != IMAGE:
        return declared
    stored = set(inferred.bands) | set(inferred.dtypes)  # the features the records hold
    absent = [b for b in bands if isinstance(b, str) and b not in stored]
    arrays = [b for b in bands if b in inferred.depths]
    if not absent or not arrays:
        return declared
    if len(arrays) > 1:
        raise SpecError(f"data.bands: {absent} are in no record and {arrays} each hold several planes: say which "
                        "bands each holds with data.collapsed: {feature: [bands]}")
    feature = arrays[0]
    names = [feature] + [b for b in bands[bands.index(feature) + 1:] if b in absent]
    label = declared.get("label", inferred.label)
    depth = inferred.depth_of(feature)
    if len(names) + 1 == depth and label and label not in stored:
        names.append(label)
    if len(names) != depth:
        raise SpecError(f"data.bands: feature {feature!r} holds {depth} planes (collapsed bands) but the bands "
                        f"{names} name {len(names)}" + (f" (label {label!r} is not stored apart either)"
                                                         if label and label not in stored else ""))
    return {**declared, "collapsed": {feature: names}}


def refine(inferred: DataSpec, declared: Mapping) -> DataSpec:
    """The inferred spec refined by what the `data:` config or the flags declare: a declared key replaces the
    inferred value, and what is not declared keeps what inference found.

    - Storage dtypes stay as inferred for every feature kept (declaring `bands` alone on an int64 or bytes export
      does not turn them into floats); a declared `dtype` (every band) or `dtypes` (per feature) wins.
    - The stored patch side S = P + k is a fact of the records: declaring only `kernel_margin: k` gives P = S - k,
      declaring only `patch_size: P` gives k = S - P.
    - Declared `bands` or `band_groups` replace the inferred ones (and the inferred groups).

    Raises:
      SpecError: as `DataSpec.from_config`, or when a declared patch size or margin does not fit the stored side.
    """
    declared = _collapse_from_bands(inferred, dict(declared or {}))
    config = inferred.to_config()
    known = {f: inferred.dtype_of(f) for f in inferred.features}
    if "collapsed" in declared:
        inside = {b for names in _collapsed(declared["collapsed"]).values() for b in names}
        if "bands" not in declared and "band_groups" not in declared:
            label = declared.get("label", inferred.label)
            config["bands"] = [b for f, names in _collapsed(declared["collapsed"]).items() for b in names
                               if b != label] + [b for b in inferred.bands if b not in declared["collapsed"]
                                                 and b not in inside]
            config.pop("band_groups", None)
        config["depths"] = {b: d for b, d in config.get("depths", {}).items() if b not in declared["collapsed"]}
    config.pop("dtype", None)
    config.pop("dtypes", None)
    if "bands" in declared or "band_groups" in declared:
        for key in ("bands", "band_groups", "group_delivery"):
            config.pop(key, None)
    if inferred.kind == IMAGE and inferred.stored_size and declared.get("kind", IMAGE) == IMAGE:
        stored = inferred.stored_size
        k, p = declared.get("kernel_margin"), declared.get("patch_size")
        if isinstance(k, int) and not isinstance(k, bool) and p is None:
            if not 0 <= k < stored:
                raise SpecError(f"data.kernel_margin: {k} does not fit the stored patch side {stored} (patch_size = "
                                f"{stored} - kernel_margin must be >= 1)")
            config["patch_size"] = stored - k
        elif isinstance(p, int) and not isinstance(p, bool) and k is None:
            if not 1 <= p <= stored:
                raise SpecError(f"data.patch_size: {p} does not fit the stored patch side {stored} (kernel_margin = "
                                f"{stored} - patch_size must be >= 0)")
            config["kernel_margin"] = stored - p
    config.update({key: value for key, value in declared.items() if key not in ("dtype", "dtypes")})
    probe = DataSpec.from_config({**config, "dtypes": {}})  # the features the refined spec reads
    dtypes = {f: known[f] for f in probe.features if f in known}
    if "dtype" in declared:
        dtype = _choice(declared, "dtype", DTYPES, FLOAT)
        dtypes.update({b: dtype for b in probe.bands})
    dtypes.update(_dtypes(declared.get("dtypes")))
    return DataSpec.from_config({**config, "dtypes": dtypes})
