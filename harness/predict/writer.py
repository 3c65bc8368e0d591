"""Write predictions as Earth Engine takes them back (docs/GEE_FORMAT.md, "Predictions back").

Image: one `tf.train.Example` per input patch, in input order, each band a flat row-major list of exactly P*P
values: class ids as an int64 list, probabilities and regression values as float lists. Table: one row per input
record with the kept properties then the predictions, as CSV or TFRecord.

Every file is written under a temporary name beside its final one (`.<name>.tmp-<pid>`: a dot file, which no
shard discovery lists) and renamed when complete, so a final name always holds a whole file. Examples are
serialized deterministically (sorted keys), so two runs write byte-identical files.
"""
from __future__ import annotations

import contextlib
import csv
import io
import os
from typing import Iterable, Iterator, Sequence

import numpy as np
import tensorflow as tf


def temporary_name(path: str) -> str:
    """The name `path` is written under until it is complete."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.tmp-{os.getpid()}")


def is_temporary(name: str) -> bool:
    return name.startswith(".") and ".tmp-" in name


def final_name(temporary: str) -> str:
    """The final file name a temporary name stands for (`.<name>.tmp-<pid>` -> `<name>`)."""
    return temporary[1:].rsplit(".tmp-", 1)[0]


@contextlib.contextmanager
def atomic(path: str) -> Iterator[str]:
    """Yield a temporary path to write; rename it to `path` when the block ends without error, else remove it."""
    tmp = temporary_name(path)
    try:
        yield tmp
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise


def write_text(path: str, text: str) -> None:
    with atomic(path) as tmp, tf.io.gfile.GFile(tmp, "w") as f:
        f.write(text)


def feature(values: np.ndarray) -> tf.train.Feature:
    """A flat list of values: int64 list for integers, float list for floats, bytes list for strings."""
    flat = np.asarray(values).reshape(-1)
    if flat.dtype.kind in "iu":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=flat.astype(np.int64).tolist()))
    if flat.dtype.kind == "f":
        return tf.train.Feature(float_list=tf.train.FloatList(value=flat.astype(np.float32).tolist()))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v if isinstance(v, bytes) else str(v).encode()
                                                                 for v in flat]))


def serialize(bands: dict[str, np.ndarray]) -> bytes:
    """One Example of `bands` (name -> values), serialized with sorted keys (byte-identical across runs)."""
    example = tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in bands.items()}))
    return example.SerializeToString(deterministic=True)


def write_tfrecord(path: str, examples: Iterable[bytes]) -> int:
    """Write serialized examples (uncompressed TFRecord) atomically; returns how many."""
    n = 0
    with atomic(path) as tmp, tf.io.TFRecordWriter(tmp) as w:
        for record in examples:
            w.write(record)
            n += 1
    return n


def _cell(value) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, (float, np.floating)):
        return format(float(np.float32(value)), ".9g")  # float32 values round-trip exactly
    return str(int(value)) if isinstance(value, (int, np.integer)) else str(value)


def write_csv(path: str, columns: Sequence[str], rows: Iterable[Sequence]) -> int:
    """Write a header and rows atomically; returns the rows written."""
    n = 0
    with atomic(path) as tmp, tf.io.gfile.GFile(tmp, "w") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(columns)
        for row in rows:
            out.writerow([_cell(v) for v in row])
            n += 1
    return n


def concatenate_csv(path: str, parts: Sequence[str]) -> int:
    """One CSV of the parts in order (the header once); returns the rows written."""
    buffer, n = io.StringIO(), 0
    for i, part in enumerate(parts):
        with tf.io.gfile.GFile(part) as f:
            lines = f.read().splitlines(keepends=True)
        buffer.writelines(lines if i == 0 else lines[1:])
        n += len(lines) - 1
    write_text(path, buffer.getvalue())
    return n
