"""File/record sharding: harness/distribute/sharding.py, read with real tf.data as the input pipeline does."""
import collections
import os
import tempfile

import pytest
from hypothesis import assume, given, settings, strategies as st

import harness  # noqa: F401  (Keras 2 before TensorFlow)
import tensorflow as tf

from harness.distribute.sharding import FILE, RECORD, assign_files, assign_nonempty
from harness.errors import ClusterConfigError, ShardDiscoveryError


def _write(folder: str, counts: list[int]) -> list[str]:
    """One uncompressed TFRecord file per count; every record is its own global id ("7")."""
    paths, next_id = [], 0
    for i, n in enumerate(counts):
        paths.append(os.path.join(folder, f"part-{i:05d}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as w:
            for _ in range(n):
                w.write(str(next_id).encode())
                next_id += 1
    return paths


def _read(paths: list[str], counts: list[int], workers: int, worker: int, skip_empty: bool):
    """Worker `worker`'s records, read exactly as the input pipeline reads them."""
    share = (assign_nonempty(list(zip(paths, counts)), workers, worker, warn=False) if skip_empty
             else assign_files(paths, workers, worker, warn=False))
    ds = tf.data.TFRecordDataset(list(share.files))
    if share.policy == RECORD:
        ds = ds.shard(workers, worker)
    return share, [int(r) for r in ds.as_numpy_iterator()]


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=8), workers=st.integers(1, 6),
       skip_empty=st.booleans())
def test_every_record_is_read_exactly_once_per_epoch(counts, workers, skip_empty):
    assume(any(counts) or not skip_empty)  # all empty: assign_nonempty raises (tested below)
    with tempfile.TemporaryDirectory() as folder:
        paths = _write(folder, counts)
        by_path = dict(zip(paths, counts))
        opened = sum(n > 0 for n in counts) if skip_empty else len(paths)
        seen = collections.Counter()
        for w in range(workers):
            share, ids = _read(paths, counts, workers, w, skip_empty)
            assert share.policy == (FILE if opened >= workers else RECORD)
            assert len(ids) == share.records(by_path)
            seen.update(ids)
    assert seen == collections.Counter(range(sum(counts)))


def test_describe_names_the_policy():
    assert "sharding by file, reads 2 whole files" in assign_files(list("abcd"), 2, 1).describe()
    assert "keeps one record in 3, from record 2" in assign_files(["a"], 3, 2, warn=False).describe()


@pytest.mark.parametrize("files, n, i", [([], 1, 0), (["a"], 0, 0), (["a"], 2, 2), (["a"], 2, -1)])
def test_bad_arguments(files, n, i):
    with pytest.raises((ClusterConfigError, ShardDiscoveryError)):
        assign_files(files, n, i)


def test_assign_nonempty_skips_zero_record_files():
    share = assign_nonempty([("a", 3), ("e", 0), ("b", 1), ("c", 2)], 3, 1)
    assert (share.files, share.policy) == (("b",), FILE)
    with pytest.raises(ShardDiscoveryError, match="no files"):
        assign_nonempty([("e", 0)], 1, 0)
