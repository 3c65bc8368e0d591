"""Find the shards of an export (folder, glob or paths; local or gs://), in order, with their compression and mixer.

Naming conventions recognised (see docs/GEE_FORMAT.md, "Files"):
  - Earth Engine: `<prefix>-00000.tfrecord.gz`, `<prefix>-00001.tfrecord.gz`, ... (uncompressed: `.tfrecord`);
  - TFDS / Beam: `<prefix>-00000-of-00012` with any extension (`data_tfrecord-00003-of-00012.gz`);
  - other indexed names: `<prefix>-00003.tfrecords` (a dash and at least 5 digits);
  - plain names without an index (`training.tfrecord.gz`): one shard per prefix.
Shards are ordered by (folder, prefix) and then by numeric index, never by name or mtime. Compression is sniffed
from each file's first bytes, never from the name: a valid uncompressed record header (see `is_record_header`)
means uncompressed, else `1f 8b` means GZIP (a gs:// shard that `source.open_shards` counts takes its export's
first shard's, which its count verifies: a sniff is a request there).

One export per folder: a folder holding several prefixes (`training.tfrecord.gz` beside `validation.tfrecord.gz`)
is refused, so that splits never leak into each other; a glob or a list naming several prefixes is a deliberate
merge and only logged.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import os
import posixpath
import re
import struct
from typing import Callable, Iterable, Optional, Sequence, Union

import tensorflow as tf

from harness.data.export import gcs
from harness.errors import (CompressionMismatchError, MissingShardError, MixerError, ShardConflictError,
                            ShardDiscoveryError)

log = logging.getLogger(__name__)

GZIP = "GZIP"
NONE = ""
GZIP_MAGIC = b"\x1f\x8b"
RECORD_HEADER_BYTES = 12  # uint64 little-endian length + uint32 masked CRC32C of those 8 bytes
# TFRecordDataset's read buffer (bytes): a local file's; a gs:// object's, where each fill of the buffer is one media
# request straight into it, as importing harness sets GCS_READ_CACHE_BLOCK_SIZE_MB=0 (harness/__init__.py).
READ_BUFFER_BYTES = 4 * 1024 * 1024
READ_BUFFER_BYTES_REMOTE = 16 * 1024 * 1024
_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected
_CRC_MASK_DELTA = 0xA282EAD8


def read_buffer_bytes(paths: Union[str, Iterable[str]]) -> int:
    """The `buffer_size` (bytes) that TFRecordDataset reads `paths` (one path or several) with:
    READ_BUFFER_BYTES_REMOTE (16 MiB) where any is a gs:// object, else READ_BUFFER_BYTES (4 MiB).

    Why 16 MiB in one request: TensorFlow's GCS file system reads one media request per fill of the reader's
    buffer once its own per-file block is off (GCS_READ_CACHE_BLOCK_SIZE_MB=0, which harness sets); a bigger
    buffer means fewer requests (each a round trip to the bucket), and 16 MiB is gcsfuse's and Apache Beam's read
    block. Measured (benchmarks/gcs_read.py, ~15 MB GZIP shards, the client on one core): bucket / local 0.83
    [0.72-0.92] over 7 runs with no block and 16 MiB buffers, 0.76 [0.74-0.80] with TensorFlow's block at 16 MiB under 4 MiB
    buffers, whose per-file block is allocated, zero-filled and copied once more.
    """
    paths = [paths] if isinstance(paths, str) else paths
    return READ_BUFFER_BYTES_REMOTE if any(map(gcs.is_gcs, paths)) else READ_BUFFER_BYTES

_TFDS = re.compile(r"^(?P<prefix>.+?)-(?P<index>\d+)-of-(?P<total>\d+)(?P<ext>(\.[A-Za-z0-9]+)*)$")
# A 5-digit (or longer) index after a dash, as Earth Engine writes it; `image_2021` is a plain name, not shard 2021.
_INDEXED = re.compile(r"^(?P<prefix>.+?)-(?P<index>\d{5,})(?P<ext>(\.[A-Za-z]+[A-Za-z0-9]*)*)$")
_PLAIN = re.compile(r"^(?P<prefix>.+?)(?P<ext>(\.[A-Za-z]+[A-Za-z0-9]*)*)$")
# Files in a folder that are not shards (sidecars, docs, checksums; the maps and pages predict and report write).
_NOT_SHARD = re.compile(r"(\.json|\.md|\.txt|\.pbtxt|\.csv|\.yaml|\.yml|\.crc|\.lock|\.index|\.tiff?|\.png|"
                        r"\.jpe?g|\.xml|\.html|/\.[^/]*)$",
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
    """An image export's `<prefix>-mixer.json` (docs/GEE_FORMAT.md, "mixer.json").

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
            obj = json.loads(read_whole(path))
        except (tf.errors.NotFoundError, FileNotFoundError) as e:
            raise MixerError(f"{path}: mixer file not found") from e
        except ValueError as e:
            raise MixerError(f"{path}: not valid JSON ({e})") from e
        try:
            dims = tuple(int(v) for v in obj["patchDimensions"])
            if len(dims) != 2:
                raise MixerError(f"patchDimensions has {len(dims)} values, expected 2")
            return cls(path, dims, int(obj["patchesPerRow"]), int(obj["totalPatches"]), obj.get("projection", {}))
        except (KeyError, TypeError, ValueError) as e:
            raise MixerError(f"{path}: not an Earth Engine mixer (needs patchDimensions, patchesPerRow, "
                             f"totalPatches): {e!r}") from e


def normalise_path(path: str) -> str:
    """Windows separators to `/` (Earth Engine and gs:// paths use `/`; TF on Linux would read `\\` literally)."""
    return str(path).replace("\\", "/")


def masked_crc32c(data: bytes) -> int:
    """The masked CRC32C that TFRecord framing stores after the length and after the data.

    TFRecord format (https://www.tensorflow.org/tutorials/load_data/tfrecord#tfrecords_format_details):
    `uint64 length, uint32 masked_crc32_of_length, byte data[length], uint32 masked_crc32_of_data`, with
    `masked_crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8` (mod 2**32) and CRC32C the Castagnoli CRC
    (reflected polynomial 0x82F63B78). Bitwise pure Python: meant for the 8 length bytes of a header, not for data.
    """
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_CRC32C_POLY if crc & 1 else 0)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def is_record_header(head: bytes) -> bool:
    """True when `head` starts with a valid TFRecord record header: 8 length bytes and their masked CRC32C."""
    if len(head) < RECORD_HEADER_BYTES:
        return False
    (stored,) = struct.unpack("<I", head[8:RECORD_HEADER_BYTES])
    return stored == masked_crc32c(head[:8])


def read_head(path: str, n: int) -> bytes:
    """The first `n` bytes of a file (fewer for a shorter one), local or `gs://`, in one read of `n` bytes: one
    range request on `gs://` whatever `n` (measured on the tests' bucket bed, 12 bytes to 4 MB), where a
    `tf.io.gfile.GFile` reads through a 512 KiB buffer (a 512 KiB request to sniff 12 bytes, issue 62) and a seek
    costs a request of its own (TensorFlow's stream reads the byte before the new position). TensorFlow's own
    buffered stream (the one GFile wraps) is asked for a buffer of `n` bytes; where this TensorFlow has none, GFile.

    Raises:
      tf.errors.NotFoundError: no such file."""
    try:
        from tensorflow.python.lib.io import _pywrap_file_io
        stream = _pywrap_file_io.BufferedInputStream(path, max(1, n))
    except (ImportError, AttributeError, TypeError):
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read(n)
    return stream.read(n)


WHOLE_READ_BYTES = 1 << 16   # `read_whole`'s first read: a mixer.json is a few hundred bytes


def read_whole(path: str) -> bytes:
    """A small file's bytes, local or `gs://`: one `read_head` of WHOLE_READ_BYTES, one request on gs:// where
    `tf.io.gfile.GFile(...).read()` makes two (a stat for the size, then the read); a longer file is read again
    with twice the bytes until it ends inside what was read.

    Raises:
      tf.errors.NotFoundError: no such file."""
    n = WHOLE_READ_BYTES
    while True:
        data = read_head(path, n)
        if len(data) < n:
            return data
        n *= 2


def sniff_compression(path: str) -> str:
    """Return `""` when the file starts with a valid uncompressed record header, else `"GZIP"` when it starts with
    the gzip magic `1f 8b`, else `""` (also for empty files).

    The header check comes first because an uncompressed file whose first record is 35615 (0x8b1f) bytes long
    also starts with `1f 8b`; a gzip header passing the 32-bit CRC check by chance is negligible.
    """
    head = read_head(path, RECORD_HEADER_BYTES)
    if is_record_header(head):
        return NONE
    return GZIP if head[:2] == GZIP_MAGIC else NONE


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


FOLDER, GLOB, PATH = "folder", "glob", "path"


def _expand(source: str, listed: Optional[gcs.Listings] = None) -> tuple[list[str], str]:
    """Paths for one source and its kind: FOLDER, GLOB or PATH (a folder must hold one complete export). A gs://
    source is listed through the JSON API (`_expand_listed`: one request per 1000 objects, each object's size and
    time kept in `listed`) where it can be; else, as for a local one, through `tf.io.gfile`."""
    source = normalise_path(source)
    if listed is not None and gcs.is_gcs(source):
        try:
            got = _expand_listed(source, listed)
        except gcs.ListingUnavailable:
            got = None      # counted and logged by gcs: TensorFlow's way below
        if got is not None:
            return got
    if _GLOB_CHARS.search(source):
        found = sorted(normalise_path(p) for p in tf.io.gfile.glob(source))
        matched = found
        found = [p for p in found if not _NOT_SHARD.search(p) and not tf.io.gfile.isdir(p)]
        return _globbed(source, found, lambda: [p for p in matched if tf.io.gfile.isdir(p)]), GLOB
    if tf.io.gfile.isdir(source):
        names = sorted(tf.io.gfile.listdir(source))
        remote = "://" in source   # a bucket's listing marks its folders with a trailing "/": no stat per object
        found = [posixpath.join(source.rstrip("/"), n.rstrip("/")) for n in names if not (remote and n.endswith("/"))]
        found = [p for p in found if not _NOT_SHARD.search(p) and (remote or not tf.io.gfile.isdir(p))]
        return _folder(source, names, found), FOLDER
    if not tf.io.gfile.exists(source):
        raise ShardDiscoveryError(f"{source!r} does not exist")
    return [source], PATH


def _globbed(source: str, found: list[str], folders: Callable[[], list[str]]) -> list[str]:
    """`found` (the files a glob matched), or ShardDiscoveryError naming what it matched instead (`folders()`)."""
    if not found:
        folders = folders()
        if folders:
            raise ShardDiscoveryError(f"{source!r} matches only folders ({', '.join(folders[:3])}"
                                      f"{', ...' if len(folders) > 3 else ''}): add the file pattern, e.g. "
                                      f"{source.rstrip('/')}/*")
        raise ShardDiscoveryError(f"no file matches {source!r}")
    return found


def _folder(source: str, names: list[str], found: list[str]) -> list[str]:
    """`found` (a folder's shards), or ShardDiscoveryError naming what the folder holds (`names`, folders with a
    trailing `/`) when it holds none or several exports."""
    if not found:
        held = f"it holds {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}" if names else "it is empty"
        raise ShardDiscoveryError(
            f"folder {source!r} holds no TFRecord shards ({held}): a shard is any other file, as Earth Engine "
            "names them <prefix>-00000.tfrecord.gz (or <prefix>.tfrecord.gz, <name>-00000-of-00004); sidecars, "
            "docs, maps and hidden files (.json .md .txt .csv .yaml .tif .png .html, .name) are not shards")
    _check_one_export(source, found)  # training beside validation in one folder would be merged
    return found


def _glob_match(pattern: str, path: str) -> bool:
    """`path` matches `pattern` as TensorFlow's glob matches it (`fnmatch` with FNM_PATHNAME: no wildcard matches
    a `/`), compared one path component at a time."""
    parts, names = pattern.split("/"), path.split("/")
    return len(parts) == len(names) and all(fnmatch.fnmatchcase(n, p) for n, p in zip(names, parts))


def _folders_of(paths: Iterable[str]) -> set[str]:
    """Every folder above the objects `paths` (`gs://b/x/y/z` -> `gs://b/x`, `gs://b/x/y`; a `DIR/` marker names
    `DIR`), without a trailing `/`."""
    out = set()
    for path in paths:
        bucket_end = path.index("/", len("gs://")) if "/" in path[len("gs://"):] else len(path)
        parts = path[bucket_end + 1:].rstrip("/").split("/")
        top = path.endswith("/")
        for i in range(1, len(parts) + top):
            out.add(path[:bucket_end] + "/" + "/".join(parts[:i]))
    return out


def _expand_listed(source: str, listed: gcs.Listings) -> Optional[tuple[list[str], str]]:
    """`_expand` of a gs:// source from the JSON API's listings (`gcs.list_objects`), which give every object's
    size and time (kept in `listed`), so no object is stat'ed: a folder is one listing of its level (a page per
    1000 objects); a glob one listing of every object under its part before the first wildcard; a path that is
    no folder one object lookup. None where TensorFlow's way must decide (a glob with a `\\` escape).

    Raises:
      gcs.ListingUnavailable: the API cannot list (the caller goes TensorFlow's way).
      ShardDiscoveryError: as `_expand`.
    """
    wild = _GLOB_CHARS.search(source)
    if wild:
        if "\\" in source:
            return None
        fixed = source[:wild.start()]
        objects, _ = gcs.list_objects(fixed, recursive=True)
        listed.add(fixed, True, objects)
        folders = _folders_of(o.path for o in objects)
        files = sorted(o.path for o in objects if not o.path.endswith("/") and o.path not in folders
                       and _glob_match(source, o.path))
        found = [p for p in files if not _NOT_SHARD.search(p)]
        return _globbed(source, found, lambda: sorted(f for f in folders if _glob_match(source, f))), GLOB
    bucket_only = "/" not in source[len("gs://"):].rstrip("/")
    folder = source.rstrip("/") + "/"
    objects, subfolders = gcs.list_objects(folder)
    listed.add(folder, False, objects)
    items = [o.path for o in objects if o.path != folder]               # the folder's own `DIR/` marker left out
    if items or subfolders or len(items) < len(objects) or bucket_only:
        names = sorted([p[len(folder):] for p in items] + [f[len(folder):] for f in subfolders])
        return _folder(source, names, [p for p in items if not _NOT_SHARD.search(p)]), FOLDER
    found = gcs.stat_object(source)
    if found is None:
        raise ShardDiscoveryError(f"{source!r} does not exist")
    listed.objects[source] = found
    return [source], PATH


def _same_file_key(path: str) -> str:
    """Identity of a file: the normalised real path for local files (symbolic links resolved), the string itself
    for `gs://` and other URLs."""
    return path if "://" in path else normalise_path(os.path.realpath(path))


def _check_one_export(folder: str, paths: list[str]) -> None:
    """Raise ShardDiscoveryError when a folder's files belong to more than one prefix (training beside validation:
    merging them would leak one split into another)."""
    by_prefix: dict[str, list[str]] = {}
    for path in paths:
        by_prefix.setdefault(parse_name(path)[0], []).append(path)
    if len(by_prefix) < 2:
        return
    listed = "; ".join(f"{posixpath.basename(p)} ({len(files)} file{'s' if len(files) > 1 else ''})"
                       for p, files in sorted(by_prefix.items()))
    first, files = sorted(by_prefix.items())[0]
    ext = _PLAIN.match(posixpath.basename(files[0])).group("ext")
    raise ShardDiscoveryError(f"folder {folder!r} holds {len(by_prefix)} exports, not one: {listed}; pass one of "
                              f"them as a glob, e.g. '{folder.rstrip('/')}/{posixpath.basename(first)}*{ext}' "
                              "(a glob or a list naming several is read as one merged dataset)")


def _check_sequence(prefix: str, indices: list[int], total: Optional[int], *, from_zero: bool,
                    to_total: bool) -> None:
    """Raise MissingShardError for a gap in the indices (from 0 when `from_zero`, up to total-1 when `to_total`)."""
    start = 0 if from_zero else min(indices)
    end = total - 1 if (total is not None and to_total) else max(indices)
    if total is not None and max(indices) >= total:
        raise MissingShardError(f"{prefix}: shard index {max(indices)} is beyond its declared count of {total}")
    missing = sorted(set(range(start, end + 1)) - set(indices))
    if missing:
        shown = ", ".join(f"{i:05d}" for i in missing[:10]) + (" ..." if len(missing) > 10 else "")
        declared = f" (names declare -of-{total:05d})" if total is not None and to_total else ""
        raise MissingShardError(f"{prefix}: shard index {shown} missing ({len(missing)} of {end - start + 1} "
                                f"between {start:05d} and {end:05d}){declared}; found {len(indices)} shards")


def _check_conflicts(prefix: str, items: list[tuple[str, Optional[int], Optional[int]]]) -> None:
    """Raise ShardConflictError when one prefix mixes `-of-N` totals or holds one index in two files."""
    totals: dict[int, list[str]] = {}
    for path, _, total in items:
        if total is not None:
            totals.setdefault(total, []).append(path)
    if len(totals) > 1:
        listed = ", ".join(f"-of-{t:05d} ({len(paths)} files)" for t, paths in sorted(totals.items()))
        raise ShardConflictError(f"{prefix}: shard names declare conflicting totals: {listed}; two shard sets share "
                                 "this prefix; pass one set, e.g. a glob ending in -of-NNNNN*")
    by_index: dict[int, list[str]] = {}
    for path, index, _ in items:
        if index is not None:
            by_index.setdefault(index, []).append(path)
    dups = {i: paths for i, paths in sorted(by_index.items()) if len(paths) > 1}
    if dups:
        i, paths = next(iter(dups.items()))
        raise ShardConflictError(f"{prefix}: shard index {i:05d} is held by {len(paths)} files ({', '.join(paths)})"
                                 f"{f' and {len(dups) - 1} more indices are duplicated' if len(dups) > 1 else ''}; "
                                 "keep one file per index")


def discover_shards(sources: Union[str, Sequence[str]], *, compression: Optional[str] = None,
                    listed: Optional[gcs.Listings] = None,
                    remembered: Optional[Callable[[Sequence[Shard]], Sequence[Optional[str]]]] = None) -> list[Shard]:
    """List the shards named by a folder, a glob, a path, or a sequence of them, in shard order: `find_shards`,
    then `with_compression` (each shard's first bytes sniffed, unless `remembered`).

    Args:
      sources: folder(s), glob(s) or file path(s), local or `gs://`; `\\` separators are accepted. A folder must
        hold one export (one prefix); a glob or list naming several prefixes merges them, with a warning.
      compression: None to sniff each file (the default); `"GZIP"` or `""` to declare it, in which case a file
        whose bytes disagree raises CompressionMismatchError.
      listed: filled with the gs:// objects the listings found, with their sizes and times (`find_shards`).
      remembered: given the shards found (compression None), the compression known of each ("GZIP", "", or None
        to sniff it): what the record index remembers (`source.open_shards`).

    Returns:
      Shards ordered by (prefix, numeric index). The same file named twice (also as `dir` and `./dir`, or by a
      relative and an absolute path) is kept once, at its first position, with a warning.

    Raises:
      ShardDiscoveryError: if a source matches nothing or does not exist, or a folder holds several
        prefixes (exports).
      ShardConflictError: if names of one prefix declare different `-of-N` totals, or two files hold one index.
      MissingShardError: if an index is missing: a gap between the lowest and highest index found, any index
        from 0 when the source is a folder, any index below a declared `-of-N` count when the source is a folder
        or glob, or an index at or beyond `-of-N`.
      CompressionMismatchError: if `compression` is given and a file's first bytes say otherwise.
      CredentialsError, BucketError: a source is on gs:// and no Google Cloud credentials are found, or its
        bucket does not answer, does not exist or refuses them (`harness.data.export.gcs.check`).
    """
    found = find_shards(sources, listed=listed)
    return with_compression(found, declared=compression, known=remembered(found) if remembered else ())


def find_shards(sources: Union[str, Sequence[str]], *, listed: Optional[gcs.Listings] = None) -> list[Shard]:
    """`discover_shards` without reading a byte of any shard: the shards in order, each `compression` None.

    A gs:// source is listed through the JSON API (`gcs.list_objects`: one request per 1000 objects of a folder;
    a glob lists every object under its part before the first wildcard; a file named alone is one lookup): no
    per-object stat or folder test. `listed` (when given) is filled with those objects, sizes and times included,
    for `index.identities` and `find_mixer`. Where the API cannot list (`gcs.ListingUnavailable`: no token at hand,
    an HTTP error), TensorFlow's listing, globbing and stats, as for a local source.

    Raises:
      the errors of `discover_shards` but CompressionMismatchError.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    listed = gcs.Listings() if listed is None else listed
    gcs.check([str(s) for s in sources])   # credentials and buckets before the first gs:// read, once a process
    groups: dict[str, dict] = {}
    seen: set[str] = set()
    dropped = 0
    for source in sources:
        paths, kind = _expand(str(source), listed)
        for path in paths:
            key = _same_file_key(path)
            if key in seen:
                dropped += 1
                continue
            seen.add(key)
            prefix, index, total = parse_name(path)
            g = groups.setdefault(_same_file_key(prefix), {"prefix": prefix, "items": [], "kinds": set()})
            g["items"].append((path, index, total))
            g["kinds"].add(kind)
    if dropped:
        log.warning("%d duplicate path(s) dropped: the same file was named more than once", dropped)
    if len(groups) > 1:
        log.warning("merging %d exports into one dataset: %s (pass one prefix, e.g. as a glob, to read one alone)",
                    len(groups), ", ".join(f"{g['prefix']} ({len(g['items'])} file{'s' if len(g['items']) > 1 else ''})"
                              for g in groups.values()))
    shards = []
    for key in sorted(groups):
        g = groups[key]
        _check_conflicts(g["prefix"], g["items"])
        indices = [i for _, i, _ in g["items"] if i is not None]
        total = next((t for _, _, t in g["items"] if t is not None), None)
        if indices:
            _check_sequence(g["prefix"], indices, total, from_zero=FOLDER in g["kinds"],
                            to_total=bool(g["kinds"] & {FOLDER, GLOB}))
        for path, index, _ in sorted(g["items"], key=lambda it: (it[1] is not None, it[1] or 0, it[0])):
            shards.append(Shard(path, g["prefix"], index, None))
    return shards


def with_compression(shards: Sequence[Shard], *, declared: Optional[str] = None,
                     known: Sequence[Optional[str]] = ()) -> list[Shard]:
    """`shards` with their `compression` set: `known[i]` where given (what the record index remembers of that
    file's identity: `index.compressions`), else sniffed from the file's first 12 bytes (`sniff_compression`, one
    request each on gs://, SNIFFERS at once).

    Raises:
      CompressionMismatchError: `declared` ("GZIP" or "") is given and a file's compression is the other.
    """
    known = list(known) or [None] * len(shards)
    todo = [i for i, c in enumerate(known) if c is None]
    sniffed = dict(zip(todo, _sniff_all([shards[i].path for i in todo], declared)))
    out = []
    for i, s in enumerate(shards):
        c = sniffed[i] if i in sniffed else known[i]
        if declared is not None and declared != c:
            raise CompressionMismatchError(_mismatch_message(s.path, declared, c))
        out.append(dataclasses.replace(s, compression=c))
    return out


SNIFFERS = 16   # files whose first bytes are read at once (`_sniff_all`): on gs:// each is a round trip


def _sniff_all(paths: Sequence[str], declared: Optional[str]) -> list[str]:
    """`_compression_of` each path, SNIFFERS at once on threads (file reads only, no TensorFlow op: safe from
    several threads), in order; the first path in order that fails raises."""
    if len(paths) < 2:
        return [_compression_of(p, declared) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(SNIFFERS, len(paths))) as pool:
        futures = [pool.submit(_compression_of, p, declared) for p in paths]
        return [f.result() for f in futures]


def _compression_of(path: str, declared: Optional[str]) -> str:
    sniffed = sniff_compression(path)
    if declared is not None and declared != sniffed:
        raise CompressionMismatchError(_mismatch_message(path, declared, sniffed))
    return sniffed


def _mismatch_message(path: str, declared: str, sniffed: str) -> str:
    said = "GZIP" if declared == GZIP else "uncompressed"
    found = ("GZIP (starts with 1f 8b)" if sniffed == GZIP
             else "not GZIP (a valid uncompressed record header, or no 1f 8b magic)")
    return f"{path}: declared {said} but the file is {found}; omit the compression to sniff it per file"


def check_compression(shard: Shard) -> None:
    """Raise CompressionMismatchError when `shard.compression` disagrees with the file's first bytes."""
    sniffed = sniff_compression(shard.path)
    if sniffed != shard.compression:
        raise CompressionMismatchError(_mismatch_message(shard.path, shard.compression, sniffed))


def _mixer_candidates(prefix: str) -> Iterable[str]:
    yield f"{prefix}-mixer.json"
    yield f"{prefix}.json"  # renamed by hand, as the ACES image export of the test data (tests/shared_data.py)


def find_mixer(shards: Sequence[Shard], mixer_path: Optional[str] = None,
               listed: Optional[gcs.Listings] = None) -> Optional[Mixer]:
    """Return the export's mixer: `mixer_path` when given, else `<prefix>-mixer.json` (or `<prefix>.json` holding
    patchDimensions) beside the first shard group that has one; None for tables and mixer-less image exports.
    A candidate that the discovery's listings covered (`listed`, `gcs.Listings.covers`) is looked up there, not
    asked for (two requests each on gs://).

    Raises:
      MixerError: if `mixer_path` is given but missing or malformed, or if a `<prefix>-mixer.json` is malformed.
    """
    if mixer_path:
        return Mixer.read(mixer_path)
    for prefix in dict.fromkeys(s.prefix for s in shards):
        for i, candidate in enumerate(_mixer_candidates(prefix)):
            if listed is not None and listed.covers(candidate):
                if candidate not in listed.objects:
                    continue
            elif not tf.io.gfile.exists(candidate):
                continue
            try:
                return Mixer.read(candidate)
            except MixerError:
                if i == 0:  # a file named -mixer.json must be a mixer; a plain .json may be anything
                    raise
                log.debug("%s is not a mixer", candidate)
    return None


def check_mixer(mixer: Mixer, record_counts: Sequence[int], *, per_pixel: bool = False) -> None:
    """Raise MixerError when the mixer's totalPatches differs from the records counted in the shards (with
    `per_pixel`, Earth Engine's sequenceData: one record per pixel, totalPatches x P x P records)."""
    total = sum(record_counts)
    p_w, p_h = mixer.patch_dimensions
    expected = mixer.total_patches * (p_w * p_h if per_pixel else 1)
    if expected != total:
        what = f" x {p_w}x{p_h} pixels = {expected}" if per_pixel else ""
        raise MixerError(f"{mixer.path}: totalPatches {mixer.total_patches}{what} but the shards hold {total} "
                         "records (a shard lost or added?)")
