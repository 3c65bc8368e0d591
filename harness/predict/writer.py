"""Write predictions as Earth Engine takes them back (docs/GEE_FORMAT.md, "Predictions back"), and the output
folder's rules: one output per input shard (`output_indices`), the run's manifest (`MANIFEST`), another run's
files refused or, with --overwrite, removed (`prepare_output`).

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
import json
import os
from typing import Iterable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from harness.distribute.context import WorkerContext
from harness.errors import OutputExistsError

MANIFEST = "predict.json"   # written by every predicting worker (`prepare_output`)


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


def output_indices(shards) -> list[int]:
    """Output index per input shard: the input's own index when every shard has one, else its position."""
    own = [s.index for s in shards]
    return own if None not in own and len(set(own)) == len(own) else list(range(len(shards)))


def prepare_output(job, mine: range, context: WorkerContext) -> None:
    """For `job` (`harness.predict.job.Job`): refuse another run's files (unless --overwrite), then write the
    manifest (every worker, the same bytes) and, on the chief, the mixer copy. With --overwrite, each worker
    removes its own outputs and the chief the files that are not this run's.

    Raises:
      OutputExistsError: naming the folder and what differs or which files are foreign.
    """
    out, options = job.options.output, job.options
    tf.io.gfile.makedirs(out)
    manifest, path = job.manifest(), os.path.join(out, MANIFEST)
    ours = {MANIFEST, *(os.path.basename(p) for p in (*job.outputs, job.mixer_copy, job.merged_csv,
                                                      *(job.maps.all() if job.maps else ())))}
    listed = tf.io.gfile.listdir(out)
    names = [n for n in listed if not is_temporary(n)]
    my_outputs = {os.path.basename(job.outputs[i]) for i in mine}
    for n in listed:  # half files of this worker's shards, left by a killed run: redone below
        if is_temporary(n) and final_name(n) in my_outputs:
            tf.io.gfile.remove(os.path.join(out, n))
    previous = None
    if MANIFEST in names:
        with tf.io.gfile.GFile(path) as f:
            previous = json.load(f)
    foreign = sorted(n for n in names if n not in ours)
    if previous is None:
        foreign = sorted(names)
    if not options.overwrite:
        if previous is not None and previous != manifest:
            differ = sorted(k for k in manifest if manifest[k] != previous.get(k))
            raise OutputExistsError(f"{out} holds the predictions of another run ({', '.join(differ)} differ, see "
                                    f"{path}): give a new --output, or --overwrite to replace them")
        if foreign:
            raise OutputExistsError(f"{out} is not empty ({', '.join(foreign[:5])}"
                                    f"{', ...' if len(foreign) > 5 else ''}) and holds no predictions of this run: "
                                    "give an empty or new --output, or --overwrite")
    else:
        for i in mine:
            if tf.io.gfile.exists(job.outputs[i]):
                tf.io.gfile.remove(job.outputs[i])
        if context.is_chief:
            for n in foreign if previous is not None else [n for n in names if n != MANIFEST]:
                if not tf.io.gfile.isdir(os.path.join(out, n)) and os.path.join(out, n) not in job.outputs:
                    tf.io.gfile.remove(os.path.join(out, n))
    write_text(path, json.dumps(manifest, sort_keys=True))
    if context.is_chief and job.image and job.shards.mixer is not None:
        with tf.io.gfile.GFile(job.shards.mixer.path) as f:
            write_text(job.mixer_copy, f.read())
