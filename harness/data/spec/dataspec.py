"""The feature spec's type, `DataSpec`: which features are inputs and label, how they are stored, and what the
model receives.

One source of truth for shapes: the pipeline parses by it, the model is built from `input_shape`/`label_shape`,
`harness.data.spec.validate.validate_spec` checks the shards against it before training, and `harness inspect`
prints one ready to use. Storage facts (docs/GEE_FORMAT.md): one feature per band, keyed by band name, in arbitrary
order; numbers are float lists (int64 and bytes lists exist too); an image band is a flat row-major list of S*S
values where S = patchDimensions + kernel margin; labels are stored as floats and are cast after parsing.
"""
from __future__ import annotations

import collections
import dataclasses
import difflib
import math
import numbers
import re
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from harness.choices import DATA_KINDS, TASKS
from harness.data.export.records import BYTES, FLOAT, FeatureInfo
from harness.data.spec.config import (_CONFIG_KEYS, DTYPES, _band_groups, _choice, _collapsed, _count, _depths,
                                      _dtypes, _fills, _flag, _got, _label, _names, _number)
from harness.errors import SpecError

IMAGE, TABLE = DATA_KINDS
DICT, TIME = "dict", "time"
CLASSIFICATION, REGRESSION = TASKS

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
        `harness.data.spec.labels.IGNORED` (-1) for classification, NaN for regression, and left out of the loss and of
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


def input_fill(spec: DataSpec, mean) -> dict[str, float]:
    """channel -> its sampled mean (`harness.train.model.builtin.band_moments`: `[channels]`, per band position of
    a time axis, or `{group: [channels]}`), the value `spec.input_nodata` inputs are delivered as."""
    if isinstance(mean, Mapping):
        return {c: float(mean[g][i]) for g, chans in spec.band_groups.items() for i, c in enumerate(chans)}
    if spec.band_groups:  # time: one mean per band position over the steps
        return {c: float(mean[i]) for chans in spec.band_groups.values() for i, c in enumerate(chans)}
    return {c: float(mean[i]) for i, c in enumerate(spec.channels)}
