"""A spec inferred from the records (`infer_spec`, `read_schema`, the `guess_*` rules), and refined by what the
`data:` config or the flags declare (`refine`)."""
from __future__ import annotations

import collections
import logging
import math
from typing import Mapping, Optional, Sequence

from harness.data.export import records
from harness.data.export.records import BYTES, EMPTY, FLOAT, INT64, FeatureInfo
from harness.data.export.shards import Mixer, Shard
from harness.data.spec.config import DTYPES, _choice, _collapsed, _depths, _dtypes, _label
from harness.data.spec.dataspec import IMAGE, TABLE, DataSpec, _closest
from harness.errors import MissingFeatureError, SpecError

log = logging.getLogger(__name__)

# Names Earth Engine users give the label, most likely first (checked case-insensitively).
LABEL_NAMES = ("label", "labels", "class", "classes", "landcover", "land_cover", "lc", "target", "y")


def _square(n: int) -> Optional[int]:
    r = math.isqrt(n)
    return r if r * r == n else None


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
