"""Every shard's first record checked in one parallel pass (`ShardSet.heads`, `validate.validate_shards`, issue 62):
the same verdicts and the same named errors as one read per shard, the shard and record named."""
import os

import numpy as np
import pytest

from example_records import example, write
from harness.data.export import records
from harness.data.export.source import open_shards
from harness.data.spec import infer, labels, validate
from harness.errors import HarnessError, LabelValueError, SchemaDriftError

SHARDS = 40   # more than records.HEAD_READERS: the interleave holds several cycles


def _export(folder, bad=None, *, empty=(7,)):
    """SHARDS gzip shards of 3 records each (`empty`: none); `bad`: {shard: Example of its record 0}."""
    os.makedirs(folder, exist_ok=True)
    for i in range(SHARDS):
        rows = [] if i in empty else [example(B1=[float(i)], B2=[1.0], cls=[float(i % 3)]) for _ in range(3)]
        if bad and i in bad:
            rows[0] = bad[i]
        write(os.path.join(folder, f"pts-{i:05d}.tfrecord.gz"), rows, gz=True)
    return open_shards([str(folder)])


def test_heads_are_every_shards_record_0_in_order_and_none_for_an_empty_shard(tmp_path):
    train = _export(tmp_path / "a")
    heads = list(train.heads())
    assert [s.path for s, _ in heads] == [s.path for s in train.shards]
    assert [h is None for _, h in heads] == [i == 7 for i in range(SHARDS)]
    assert [h.features.feature["B1"].float_list.value[0] for _, h in heads if h is not None] == \
        [float(i) for i in range(SHARDS) if i != 7]
    spec = infer.infer_spec(list(train.shards), label="cls", read=train.first_examples)
    report = validate.validate_shards(spec, train, labels=True)
    assert report == validate.validate_spec(spec, list(train.shards))   # as one read per shard
    assert len(report.checked) == SHARDS - 1 and report.empty == (train.shards[7].path,)


def test_drift_and_a_bad_label_in_a_late_shard_are_named_as_one_read_per_shard_names_them(tmp_path):
    drift = _export(tmp_path / "d", {31: example(B1=[1], B2=[1.0], cls=[0.0])})   # B1 int64 in shard 31
    spec = infer.infer_spec(list(drift.shards), label="cls", read=drift.first_examples)
    with pytest.raises(SchemaDriftError) as one_pass:
        validate.validate_shards(spec, drift)
    with pytest.raises(SchemaDriftError) as per_shard:
        validate.validate_spec(spec, list(drift.shards))
    assert str(one_pass.value) == str(per_shard.value)
    assert "pts-00031.tfrecord.gz: record 0: band 'B1': expected dtype float, found int64" in str(one_pass.value)

    label = _export(tmp_path / "l", {33: example(B1=[1.0], B2=[1.0], cls=[2.5])})
    spec = infer.infer_spec(list(label.shards), label="cls", read=label.first_examples)
    validate.validate_shards(spec, label)   # the spec holds; the label rule is checked only when asked
    with pytest.raises(LabelValueError, match=r"pts-00033\.tfrecord\.gz: record 0: label 'cls' holds 2\.5: class "
                                              r"ids are integers"):
        validate.validate_shards(spec, label, labels=True)
    with pytest.raises(LabelValueError, match=r"pts-00033\.tfrecord\.gz: record 0"):
        labels.check_first_labels(spec, label.shards)   # the same rule, one read per shard


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_a_shard_damaged_after_it_was_counted_is_named_by_the_one_pass(tmp_path, monkeypatch, damage):
    """Counting read every shard whole; a shard rewritten since (a cut: TensorFlow's inflate ends quietly; bytes
    flipped: a DataLossError mid-pass, traced shard by shard from the first not yet read) is named."""
    train = _export(tmp_path / "c")
    path = train.shards[25].path
    data = open(path, "rb").read()
    open(path, "wb").write(data[:14] if damage == "cut" else data[:12] + bytes(b ^ 0xFF for b in data[12:20])
                           + data[20:])
    spec = infer.infer_spec(list(train.shards), label="cls", read=train.first_examples)
    seen = []
    monkeypatch.setattr(records, "read_records", lambda shard, n, _real=records.read_records: (
        seen.append(shard.path), _real(shard, n))[1])
    with pytest.raises(HarnessError, match=r"pts-00025\.tfrecord\.gz") as raised:
        validate.validate_shards(spec, train)
    if damage == "cut":
        assert "record 0 could not be read, yet the shard was counted with 3 record(s)" in str(raised.value)
    else:
        assert seen and seen[-1] == path and path not in seen[:-1], seen


def _read_heads(monkeypatch) -> list:
    """The shards each later `records.first_records` pass is asked to read (their paths, in order)."""
    asked = []
    monkeypatch.setattr(records, "first_records", lambda shards, _real=records.first_records: (
        asked.extend(s.path for s in shards), _real(shards))[1])
    return asked


def test_a_second_run_reads_no_first_record_of_an_unchanged_shard_and_reads_a_rewritten_one(tmp_path,
                                                                                            monkeypatch):
    """The checks passed are remembered per shard identity (path, size, mtime) and spec in the record index: a
    second run (the shards opened again, as a new process does) reads none of them; a shard rewritten since is read
    and its drift named; another spec, or the label rule asked for the first time, reads every shard again."""
    folder = tmp_path / "r"
    first = _export(folder)
    spec = infer.infer_spec(list(first.shards), label="cls", read=first.first_examples)
    asked = _read_heads(monkeypatch)
    report = validate.validate_shards(spec, first, labels=True)
    assert (len(report.checked), len(report.empty), report.passed_before) == (SHARDS - 1, 1, 0)
    assert len(asked) == SHARDS - 2   # the first shard from the spec's read, the empty one not read

    asked.clear()
    again = open_shards([str(folder)])
    assert again.identities == first.identities
    report = validate.validate_shards(spec, again, labels=True)
    assert (report.checked, report.empty, report.passed_before, asked) == ((), (), SHARDS, [])
    assert validate.validate_shards(spec, again).passed_before == SHARDS   # the label rule's pass covers this one

    rewritten = again.shards[31].path   # B1 stored as int64 now: a new identity (size, mtime)
    write(rewritten, [example(B1=[1], B2=[1.0], cls=[0.0]) for _ in range(3)], gz=True)
    changed = open_shards([str(folder)])
    assert changed.identities[31] != again.identities[31] and changed.identities[30] == again.identities[30]
    with pytest.raises(SchemaDriftError, match=r"shards differ for feature 'B1': 38 shard\(s\) match the spec .*"
                                               r"pts-00031\.tfrecord\.gz: record 0: band 'B1': expected dtype float, "
                                               r"found int64"):
        validate.validate_shards(spec, changed, labels=True)
    assert asked == [rewritten]

    asked.clear()
    narrower = spec.replace(bands=("B1",))   # another spec: another digest, every shard read
    assert validate.check_digest(narrower, True) != validate.check_digest(spec, True)
    with pytest.raises(SchemaDriftError):
        validate.validate_shards(narrower, changed)
    assert len(asked) == SHARDS - 2


@pytest.mark.parametrize("bad", [None, 30, 31])   # none; in the other worker's share (even); in this one's (odd)
def test_split_across_workers_each_reads_its_share_and_a_bad_shard_is_named_on_every_worker(tmp_path, monkeypatch,
                                                                                              bad):
    """Worker 1 of 2 reads the first records of the odd shards and gathers one verdict per worker (the other
    worker's given here as it would arrive); all passed: every shard is remembered as passed. A failure on either
    worker makes this one check every shard and raise the same named error as a check of its own would."""
    from harness.data.export import index

    train = _export(tmp_path / "s", None if bad is None else {bad: example(B1=[1], B2=[1.0], cls=[0.0])})
    spec = infer.infer_spec(list(train.shards), label="cls", read=train.first_examples)
    sent = []

    def gather(values):   # rank 0's verdict: it fails only where the bad shard is in its share (even)
        sent.append(list(values))
        return np.array([[0.0 if bad is not None and bad % 2 == 0 else 1.0], values])

    asked = _read_heads(monkeypatch)
    split = index.Split(rank=1, workers=2, gather=gather)
    if bad is None:
        report = validate.validate_shards(spec, train, labels=True, split=split)
        assert sent == [[1.0]] and report.by_other_workers == 20 and report.passed_before == 0
        assert asked == [s.path for i, s in enumerate(train.shards) if i % 2 == 1 and i != 7]
        assert len(report.checked) == 19 and report.empty == (train.shards[7].path,)   # shard 7: no record
        asked.clear()
        again = open_shards([str(tmp_path / "s")])   # every shard remembered, the other worker's share too
        assert validate.validate_shards(spec, again, labels=True).passed_before == SHARDS and asked == []
        # nothing left to read here: this worker still gathers its verdict once (the other's index may differ)
        assert validate.validate_shards(spec, again, labels=True, split=split).passed_before == SHARDS
        assert sent == [[1.0], [1.0]] and asked == []
        return
    with pytest.raises(SchemaDriftError, match=rf"pts-{bad:05d}\.tfrecord\.gz: record 0: band 'B1': expected dtype "
                                               "float, found int64"):
        validate.validate_shards(spec, train, split=split)
    assert sent == [[0.0 if bad % 2 else 1.0]]
