"""File caches with real processes (issue 11.5): a fill killed mid-way is cleared and the re-run reads every record
once; a cache being filled by a live process is refused by name, and that process finishes unharmed. A finished
cache is read back in this process (`_read_back`): only the fills are processes of their own."""
import json
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading

import pytest

from harness.data.input import filecache, pipeline as P, stages
from harness.data.export import shards as S, synth
from harness.data.spec import infer as SP
from harness.errors import CacheInUseError

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "fill_cache.py"
ROOT = pathlib.Path(__file__).resolve().parents[3]
RECORDS = 256            # 32 cache elements of 8: the fill is partial when a reader holds at record 20
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """4 shards x 64 rows; their band values tell the records apart."""
    folder = tmp_path_factory.mktemp("points")
    synth.write_table_export(str(folder), prefix="points", shards=4, records=RECORDS, seed=7)
    return folder


@pytest.fixture(scope="module")
def every_id(export):
    found = S.discover_shards(str(export))
    ds = P.build_dataset(found, SP.infer_spec(found), stages.PipelineOptions(per_replica_batch_size=1, training=False,
                                                                        cache="none"))
    ids = sorted([float(v) for v in x[0]] for x, _ in ds)
    assert len(set(map(tuple, ids))) == RECORDS
    return ids


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


class _Filler:
    """fill_cache.py --hold N in its own session; its stdout lines arrive on a queue."""

    def __init__(self, export, cache_dir, hold: int):
        self.proc = subprocess.Popen([sys.executable, str(SCRIPT), str(export), str(cache_dir), "--hold", str(hold)],
                                     env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, prefix: str) -> str:
        while True:
            try:
                line = self.lines.get(timeout=TIMEOUT_S)
            except queue.Empty:
                pytest.fail(f"no {prefix!r} line within {TIMEOUT_S} s:\n{''.join(self.seen)[-3000:]}")
            if line is None:
                pytest.fail(f"exited ({self.proc.wait()}) before {prefix!r}:\n{''.join(self.seen)[-3000:]}")
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def _run_fill(export, cache_dir) -> list:
    done = subprocess.run([sys.executable, str(SCRIPT), str(export), str(cache_dir)], env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])["ids"]


def _read_back(export, cache_dir, monkeypatch) -> list:
    """The band values of every record read through the file cache in `cache_dir`, in this process, as
    fill_cache.py reads them (the same read batches: the same cache)."""
    monkeypatch.setattr(stages, "READ_BATCH_MAX", 8)
    found = S.discover_shards(str(export))
    ds = P.build_dataset(found, SP.infer_spec(found), stages.PipelineOptions(
        per_replica_batch_size=1, training=False, cache="file", cache_dir=str(cache_dir)))
    return [[float(v) for v in x[0]] for x, _ in ds]


def test_rerun_after_a_fill_killed_midway_reads_every_record_once(export, every_id, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    filler = _Filler(export, cache, hold=20)
    try:
        filler.wait_for("HOLDING")
        assert list(cache.glob("harness-*_0.lockfile")), "the fill should be under way"
    finally:
        filler.kill()
    assert filler.proc.returncode == -signal.SIGKILL
    assert list(cache.glob("harness-*_0.lockfile"))  # what the killed run left

    ids = _run_fill(export, cache)
    assert sorted(ids) == every_id  # every record exactly once
    assert len(list(cache.glob("harness-*.index"))) == 1 and not list(cache.glob("harness-*.lockfile"))
    assert sorted(_read_back(export, cache, monkeypatch)) == every_id  # and the finished cache reads back whole


def test_a_cache_being_filled_by_a_live_process_is_refused_by_name(export, every_id, tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "READ_BATCH_MAX", 8)  # as fill_cache.py: the same parse order, the same cache
    cache = tmp_path / "cache"
    filler = _Filler(export, cache, hold=20)
    try:
        filler.wait_for("HOLDING")
        found = S.discover_shards(str(export))
        with pytest.raises(CacheInUseError, match=rf"file cache {cache}/harness-\S+ is being filled by pid "
                                                  rf"{filler.proc.pid} on host "):
            P.build_dataset(found, SP.infer_spec(found), stages.PipelineOptions(
                per_replica_batch_size=1, training=False, cache="file", cache_dir=str(cache)))
        filler.proc.stdin.write("\n")
        filler.proc.stdin.flush()
        result = json.loads(filler.wait_for("RESULT ").split("RESULT ", 1)[1])
        assert filler.proc.wait(TIMEOUT_S) == 0
    finally:
        filler.kill()
    assert sorted(result["ids"]) == every_id  # the owner was unharmed
    assert filecache.complete(str(next(cache.glob("harness-*.index")))[:-len(".index")])
    assert sorted(_read_back(export, cache, monkeypatch)) == every_id  # complete: anyone reads it


def test_the_cache_name_takes_the_identities_discovery_took(export, tmp_path, monkeypatch):
    """`cache_name` digests each assigned file's identity: from `ShardSet.identities` (on gs:// from the listing),
    not a stat per file (a request each on gs://); the name is the one the stats give."""
    import dataclasses

    from harness.data.export import index
    from harness.data.export.source import open_shards

    train = open_shards([str(export)])
    spec = SP.infer_spec(list(train.shards), read=train.first_examples)
    options = stages.PipelineOptions(per_replica_batch_size=1, training=False, cache="file",
                                     cache_dir=str(tmp_path), validate=False)
    stated = P.plan_pipeline(dataclasses.replace(train, identities=()), spec, options).cache.path
    monkeypatch.setattr(index, "file_identity", lambda path: pytest.fail(f"{path} stat'ed"))
    assert P.plan_pipeline(train, spec, options).cache.path == stated
