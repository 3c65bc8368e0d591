"""Find the shards of an export (folder, glob or paths; local or gs://), in order, with their compression and mixer.

Naming conventions recognised (see ../shared/GEE_FORMAT.md, "Files"):
  - Earth Engine: `<prefix>-00000.tfrecord.gz`, `<prefix>-00001.tfrecord.gz`, ... (uncompressed: `.tfrecord`);
  - TFDS / Beam: `<prefix>-00000-of-00012` with any extension (`data_tfrecord-00003-of-00012.gz`);
  - other indexed names: `<prefix>-00003.tfrecords` (a dash and at least 5 digits);
  - plain names without an index (`training.tfrecord.gz`): one shard per prefix.
Shards are ordered by (folder, prefix) and then by numeric index, never by name or mtime. Compression is sniffed
from the first two bytes of each file (`1f 8b` = GZIP), never from the name.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import re
from typing import Iterable, Optional, Sequence, Union

import tensorflow as tf

from harness.errors import CompressionMismatchError, MissingShardError, MixerError, ShardDiscoveryError

log = logging.getLogger(__name__)

GZIP = "GZIP"
NONE = ""
GZIP_MAGIC = b"\x1f\x8b"

_TFDS = re.compile(r"^(?P<prefix>.+?)-(?P<index>\d+)-of-(?P<total>\d+)(?P<ext>(\.[A-Za-z0-9]+)*)$")
# A 5-digit (or longer) index after a dash, as Earth Engine writes it; `image_2021` is a plain name, not shard 2021.
_INDEXED = re.compile(r"^(?P<prefix>.+?)-(?P<index>\d{5,})(?P<ext>(\.[A-Za-z]+[A-Za-z0-9]*)*)$")
_PLAIN = re.compile(r"^(?P<prefix>.+?)(?P<ext>(\.[A-Za-z]+[A-Za-z0-9]*)*)$")
# Files in a folder that are not shards (sidecars, docs, checksums).
_NOT_SHARD = re.compile(r"(\.json|\.md|\.txt|\.pbtxt|\.csv|\.yaml|\.yml|\.crc|\.lock|\.index|/\.[^/]*)$",
                        re.IGNORECASE)
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclasses.dataclass(frozen=True)
class Shard:
    """One TFRecord file of an export.

    Attributes:
      path: normalised path (`/` separators), local or `gs://...`.
      prefix: the path without the shard index and extension (`/data/export` for `/data/export-00003.tfrecord.gz`).
      index: the numeric shard index, or None for a plain name.
      compression: `"GZIP"` or `""`, as `tf.data.TFRecordDataset(compression_type=...)` takes it; sniffed from
        the file's first bytes.
    """

    path: str
    prefix: str
    index: Optional[int]
    compression: str


@dataclasses.dataclass(frozen=True)
class Mixer:
    """An image export's `<prefix>-mixer.json` (GEE_FORMAT.md, "mixer.json").

    Attributes:
      path: where it was read from.
      patch_dimensions: (width, height) of a patch WITHOUT the kernel margin, in pixels.
      patches_per_row: width of the patch grid.
      total_patches: number of Examples across all shards.
      projection: the `projection` object as written (crs and affine).
    """

    path: str
    patch_dimensions: tuple[int, int]
    patches_per_row: int
    total_patches: int
    projection: dict

    @classmethod
    def read(cls, path: str) -> "Mixer":
        """Read and check a mixer file.

        Raises:
          MixerError: if the file is missing, not JSON, or lacks patchDimensions/patchesPerRow/totalPatches.
        """
        path = normalise_path(path)
        try:
            with tf.io.gfile.GFile(path, "r") as f:
                obj = json.load(f)
        except (tf.errors.NotFoundError, FileNotFoundError) as e:
            raise MixerError(f"{path}: mixer file not found") from e
        except ValueError as e:
            raise MixerError(f"{path}: not valid JSON ({e})") from e
        try:
            dims = tuple(int(v) for v in obj["patchDimensions"])
            if len(dims) != 2:
                raise ValueError(f"patchDimensions has {len(dims)} values, expected 2")
            return cls(path, dims, int(obj["patchesPerRow"]), int(obj["totalPatches"]), obj.get("projection", {}))
        except (KeyError, TypeError, ValueError) as e:
            raise MixerError(f"{path}: not an Earth Engine mixer (needs patchDimensions, patchesPerRow, "
                             f"totalPatches): {e!r}") from e


def normalise_path(path: str) -> str:
    """Windows separators to `/` (Earth Engine and gs:// paths use `/`; TF on Linux would read `\\` literally)."""
    return str(path).replace("\\", "/")


def sniff_compression(path: str) -> str:
    """Return `"GZIP"` when the file starts with the gzip magic bytes `1f 8b`, else `""` (also for empty files)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        return GZIP if f.read(2) == GZIP_MAGIC else NONE


def parse_name(path: str) -> tuple[str, Optional[int], Optional[int]]:
    """Split a shard path into (prefix, index, total); index/total are None when the name carries none."""
    folder, name = posixpath.split(path)
    for pattern in (_TFDS, _INDEXED):
        m = pattern.match(name)
        if m:
            total = int(m.group("total")) if "total" in m.groupdict() else None
            return posixpath.join(folder, m.group("prefix")), int(m.group("index")), total
    m = _PLAIN.match(name)
    return posixpath.join(folder, m.group("prefix") if m else name), None, None


def _expand(source: str) -> tuple[list[str], bool]:
    """Paths for one source and whether it was a folder (a folder must hold a complete index sequence)."""
    source = normalise_path(source)
    if _GLOB_CHARS.search(source):
        found = sorted(normalise_path(p) for p in tf.io.gfile.glob(source))
        found = [p for p in found if not _NOT_SHARD.search(p) and not tf.io.gfile.isdir(p)]
        if not found:
            raise ShardDiscoveryError(f"no file matches {source!r}")
        return found, False
    if tf.io.gfile.isdir(source):
        names = sorted(tf.io.gfile.listdir(source))
        found = [posixpath.join(source.rstrip("/"), n.rstrip("/")) for n in names]
        found = [p for p in found if not _NOT_SHARD.search(p) and not tf.io.gfile.isdir(p)]
        if not found:
            raise ShardDiscoveryError(f"folder {source!r} holds no TFRecord shards")
        return found, True
    if not tf.io.gfile.exists(source):
        raise ShardDiscoveryError(f"{source!r} does not exist")
    return [source], False


def _check_sequence(prefix: str, indices: list[int], total: Optional[int], complete: bool) -> None:
    """Raise MissingShardError for a gap in the indices (from 0 when `complete`, up to total-1 when known)."""
    start = 0 if complete else min(indices)
    end = total - 1 if (total is not None and complete) else max(indices)
    if total is not None and max(indices) >= total:
        raise MissingShardError(f"{prefix}: shard index {max(indices)} is beyond its declared count of {total}")
    missing = sorted(set(range(start, end + 1)) - set(indices))
    if missing:
        shown = ", ".join(f"{i:05d}" for i in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise MissingShardError(f"{prefix}: shard index {shown} missing ({len(missing)} of {end - start + 1} "
                                f"between {start:05d} and {end:05d}); found {len(indices)} shards")


def discover_shards(sources: Union[str, Sequence[str]], *, compression: Optional[str] = None) -> list[Shard]:
    """List the shards named by a folder, a glob, a path, or a sequence of them, in shard order.

    Args:
      sources: folder(s), glob(s) or file path(s), local or `gs://`; `\\` separators are accepted.
      compression: None to sniff each file (the default); `"GZIP"` or `""` to declare it, in which case a file
        whose bytes disagree raises CompressionMismatchError.

    Returns:
      Shards ordered by (prefix, numeric index). Duplicates are dropped.

    Raises:
      ShardDiscoveryError: if a source matches nothing or does not exist.
      MissingShardError: if an index is missing: a gap between the lowest and highest index found, any index
        from 0 (to the declared `-of-N` count) when the source is a folder, or an index at or beyond `-of-N`.
      CompressionMismatchError: if `compression` is given and a file's first bytes say otherwise.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    groups: dict[str, dict] = {}
    for source in sources:
        paths, is_folder = _expand(str(source))
        for path in paths:
            prefix, index, total = parse_name(path)
            g = groups.setdefault(prefix, {"paths": {}, "total": total, "complete": False})
            g["paths"][path] = index
            g["complete"] |= is_folder
            if total is not None:
                g["total"] = total
    shards = []
    for prefix in sorted(groups):
        g = groups[prefix]
        indices = [i for i in g["paths"].values() if i is not None]
        if indices:
            _check_sequence(prefix, indices, g["total"], g["complete"])
        for path, index in sorted(g["paths"].items(), key=lambda kv: (kv[1] is not None, kv[1] or 0, kv[0])):
            shards.append(Shard(path, prefix, index, _compression_of(path, compression)))
    return shards


def _compression_of(path: str, declared: Optional[str]) -> str:
    sniffed = sniff_compression(path)
    if declared is not None and declared != sniffed:
        raise CompressionMismatchError(_mismatch_message(path, declared, sniffed))
    return sniffed


def _mismatch_message(path: str, declared: str, sniffed: str) -> str:
    said = "GZIP" if declared == GZIP else "uncompressed"
    found = "GZIP (starts with 1f 8b)" if sniffed == GZIP else "not GZIP (no 1f 8b magic)"
    return f"{path}: declared {said} but the file is {found}; omit the compression to sniff it per file"


def check_compression(shard: Shard) -> None:
    """Raise CompressionMismatchError when `shard.compression` disagrees with the file's first bytes."""
    sniffed = sniff_compression(shard.path)
    if sniffed != shard.compression:
        raise CompressionMismatchError(_mismatch_message(shard.path, shard.compression, sniffed))


def _mixer_candidates(prefix: str) -> Iterable[str]:
    yield f"{prefix}-mixer.json"
    yield f"{prefix}.json"  # renamed by hand, as in ../shared/data/gee-aces-image


def find_mixer(shards: Sequence[Shard], mixer_path: Optional[str] = None) -> Optional[Mixer]:
    """Return the export's mixer: `mixer_path` when given, else `<prefix>-mixer.json` (or `<prefix>.json` holding
    patchDimensions) beside the first shard group that has one; None for tables and mixer-less image exports.

    Raises:
      MixerError: if `mixer_path` is given but missing or malformed, or if a `<prefix>-mixer.json` is malformed.
    """
    if mixer_path:
        return Mixer.read(mixer_path)
    for prefix in dict.fromkeys(s.prefix for s in shards):
        for i, candidate in enumerate(_mixer_candidates(prefix)):
            if not tf.io.gfile.exists(candidate):
                continue
            try:
                return Mixer.read(candidate)
            except MixerError:
                if i == 0:  # a file named -mixer.json must be a mixer; a plain .json may be anything
                    raise
                log.debug("%s is not a mixer", candidate)
    return None


def check_mixer(mixer: Mixer, record_counts: Sequence[int]) -> None:
    """Raise MixerError when the mixer's totalPatches differs from the records counted in the shards."""
    total = sum(record_counts)
    if mixer.total_patches != total:
        raise MixerError(f"{mixer.path}: totalPatches {mixer.total_patches} but the shards hold {total} records "
                         "(a shard lost or added?)")
