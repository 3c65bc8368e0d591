"""`harness reshard`: GZIP shards -> uncompressed shards balanced over a multiple of the workers, order preserved."""
import json
import os

import pytest
import tensorflow as tf

from harness.cli import main as cli_main
from harness.data.export import index as index_lib
from harness.data.export import reshard
from harness.data.export.shards import discover_shards, find_mixer
from harness.distribute.plan import make_plan
from harness.errors import ConfigError


def _records(shards):
    out = []
    for s in shards:
        out += [r.numpy() for r in tf.data.TFRecordDataset(s.path, compression_type=s.compression)]
    return out


def test_reshard_balances_and_keeps_order(image_export, tmp_path, capsys, monkeypatch):
    out = tmp_path / "resharded"
    index_lib.record_stats(discover_shards(str(image_export)))   # the source counted (as a run before would)
    counted = []
    monkeypatch.setattr(index_lib, "count_shards", lambda shards, _real=index_lib.count_shards: (
        counted.extend(s.path for s in shards), _real(shards))[1])
    monkeypatch.setattr(reshard, "READ_BATCH_BYTES", 5000)   # 12x12 patches of 3 bands and a label: 2 a batch
    assert cli_main(["reshard", str(image_export), "--output", str(out), "--workers", "2",
                     "--shards-per-worker", "2"]) == 0
    src, new = discover_shards(str(image_export)), discover_shards(str(out))
    # the new shards' counts and bytes put in the record index as written: none read, and what counting would say
    assert counted == [] and index_lib.record_stats(new) == index_lib.count_shards(new)
    assert [s.compression for s in new] == [""] * 4 and all(p.path.endswith(".tfrecord") for p in new)
    assert _records(new) == _records(src)                         # same records, same order
    index = json.loads((out / "tiny-index.json").read_text())
    assert [e["records"] for e in index["shards"]] == [3, 3, 2, 2]
    assert [e["first_record"] for e in index["shards"]] == [0, 3, 6, 8] and index["records"] == 10
    assert find_mixer(new).total_patches == 10                    # the mixer travels with the shards
    plan = make_plan([(e["path"], e["records"]) for e in index["shards"]], workers=2, replicas_per_worker=1,
                     per_replica_batch_size=1)
    assert plan.records == (5, 5) and plan.dropped == (0, 0)
    assert "10 records from 3 shard(s) -> 4 uncompressed shards of 2/3 records" in capsys.readouterr().out


def test_balanced_sizes_and_bad_counts(image_export, tmp_path):
    assert reshard.balanced_sizes(10, 4) == [3, 3, 2, 2] and sum(reshard.balanced_sizes(7, 7)) == 7
    with pytest.raises(ConfigError, match="cannot fill 12 shards"):
        reshard.reshard([str(image_export)], str(tmp_path / "x"), workers=4, shards_per_worker=3)
    with pytest.raises(ConfigError, match=">= 1"):
        reshard.reshard([str(image_export)], str(tmp_path / "x"), workers=0)
    assert not os.path.exists(tmp_path / "x")
