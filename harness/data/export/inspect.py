"""`harness inspect PATH...`: schema, implied patch shape, per-shard record counts and compression, and a config.

Reads the first records of the first non-empty shard for the schema, the first record of every other shard to
report schema differences, and counts every shard through the cached index (harness.data.export.index).
"""
from __future__ import annotations

import logging
from typing import Optional

import yaml

from harness.data.export import records
from harness.data.spec import dataspec as spec_lib, infer as infer_lib
from harness.data.export.records import BYTES
from harness.data.export.shards import Mixer, check_mixer
from harness.data.export.source import open_shards
from harness.errors import MixerError, SpecError

log = logging.getLogger(__name__)


def _patch_text(info: records.FeatureInfo, mixer: Optional[Mixer], margin: Optional[int],
                image_side: Optional[int]) -> str:
    """The patch a value count implies: 65536 -> 256x256 (+ the margin split off by the mixer or --kernel-margin).

    `image_side`: the stored patch side of the inferred image spec; a feature of another size (a short bytes id,
    an array property) gets no patch. 0 for a table export (no patches); None when no spec could be inferred
    (numeric features are then read as square patches, bytes strings are not).
    """
    n = info.nbytes if info.dtype == BYTES and info.length == 1 else info.length
    if info.sequence:
        return f"feature list of {n} steps"
    planes = n // image_side ** 2 if image_side and n % image_side ** 2 == 0 else 1
    side = infer_lib._square(n // planes)
    if not side or n < 4 or (image_side is not None and side != image_side) or \
            (image_side is None and info.dtype == BYTES):
        return ""
    text = f"{side}x{side}"
    if planes > 1:
        text = f"{planes} x {text} (an array band of depth {planes}, or {planes} collapsed bands)"
    if mixer is not None:
        p = mixer.patch_dimensions[0]
        text += f" = {p}x{p} + margin {side - p}" if side != p else f" (mixer patchDimensions {p}x{p})"
    elif margin:
        text += f" = {side - margin}x{side - margin} + margin {margin}"
    return text


def report(paths, *, mixer_path: Optional[str] = None, kernel_margin: Optional[int] = None,
           records_to_read: int = 8, infer: bool = True) -> dict:
    """Everything `inspect` prints, as a JSON-ready dict (features, shards, mixer, warnings, config).
    `infer=False`: no spec is inferred (config None): a folder of predictions is not an export to train on."""
    data = open_shards([paths] if isinstance(paths, str) else list(paths), mixer=mixer_path)  # gs://: one listing
    shards, stats, mixer = list(data.shards), list(data.stats), data.mixer
    schema = infer_lib.read_schema(shards, records_to_read, read=data.first_examples)
    warnings = []
    first = {shard.path: {k: (v.dtype, v.length) for k, v in records.schema_of(example).items()}
             for shard, example in data.heads() if example is not None}   # one parallel pass over the shards
    reference = next(iter(first.items()), (None, {}))
    for path, sch in first.items():
        if sch != reference[1]:
            diff = sorted(set(sch.items()) ^ set(reference[1].items()))
            warnings.append(f"schema of {path} differs from {reference[0]}: {diff[:6]}")
    total = sum(st.records for st in stats)
    if mixer is not None:
        try:
            check_mixer(mixer, [st.records for st in stats], per_pixel=any(i.sequence for i in schema.values()))
        except MixerError as e:
            warnings.append(str(e))
    empty = [s.path for s, st in zip(shards, stats) if st.records == 0]
    if empty:
        warnings.append(f"{len(empty)} zero-record shard(s): {', '.join(empty)}")
    config, groups, image_side = None, {}, None
    try:
        if not infer:
            raise _NotInferred
        spec = infer_lib.infer_spec(shards, mixer=mixer, kernel_margin=kernel_margin, schema=schema)
        config = {"data": spec.to_config()}
        groups = infer_lib.guess_band_groups(spec.bands)
        image_side = spec.stored_size if spec.kind == spec_lib.IMAGE else 0
    except _NotInferred:
        pass
    except SpecError as e:
        warnings.append(f"no config inferred: {e}")
    return {
        "features": [{"name": n, "dtype": i.dtype, "values": i.length,
                      **({"bytes": i.nbytes} if i.dtype == BYTES else {}),
                      "patch": _patch_text(i, mixer, kernel_margin, image_side)} for n, i in schema.items()],
        "shards": [{"path": s.path, "index": s.index, "records": st.records, "bytes": st.bytes,
                    "compression": s.compression or "NONE"} for s, st in zip(shards, stats)],
        "total_records": total,
        "mixer": None if mixer is None else {"path": mixer.path, "patchDimensions": list(mixer.patch_dimensions),
                                             "patchesPerRow": mixer.patches_per_row,
                                             "totalPatches": mixer.total_patches},
        "band_groups": {g: list(b) for g, b in groups.items()},
        "warnings": warnings,
        "config": config,
    }


class _NotInferred(Exception):
    pass


def format_text(rep: dict) -> str:
    lines = ["features (first records):", f"  {'name':<28} {'dtype':<7} {'values':>8}  patch"]
    for f in rep["features"]:
        values = f"{f['values']}" + (f" ({f['bytes']} B)" if "bytes" in f else "")
        lines.append(f"  {f['name']:<28} {f['dtype']:<7} {values:>8}  {f['patch']}".rstrip())
    if rep["mixer"]:
        m = rep["mixer"]
        lines.append(f"mixer: {m['path']} patchDimensions {m['patchDimensions']} patchesPerRow "
                     f"{m['patchesPerRow']} totalPatches {m['totalPatches']}")
    lines.append("shards:")
    for s in rep["shards"]:
        lines.append(f"  {s['records']:>9} records  {s['compression']:<5} {s['path']}")
    lines.append(f"  {rep['total_records']:>9} records in {len(rep['shards'])} shard(s)")
    if rep["band_groups"]:
        lines.append("band groups detected (add `band_groups:` to the config to deliver them as separate inputs):")
        for g, b in rep["band_groups"].items():
            lines.append(f"  {g}: {b}")
    for w in rep["warnings"]:
        lines.append(f"warning: {w}")
    if rep["config"]:
        lines.append("config:")
        lines.append(yaml.safe_dump(rep["config"], sort_keys=False, default_flow_style=None).rstrip())
    return "\n".join(lines)
