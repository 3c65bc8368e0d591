"""`harness plan` as a real subprocess on small TFRecord files."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> pathlib.Path:
    """Four uncompressed shards of 100, 100, 100 and 96 records, named as Earth Engine names them."""
    import harness  # noqa: F401
    import tensorflow as tf
    folder = tmp_path_factory.mktemp("export")
    for i, n in enumerate([100, 100, 100, 96]):
        with tf.io.TFRecordWriter(str(folder / f"export-{i:05d}.tfrecord")) as w:
            for r in range(n):
                w.write(b"%d" % r)
    return folder


def _plan(export, tmp_path, *flags) -> subprocess.CompletedProcess:
    env = dict(os.environ, HARNESS_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "harness.cli", "plan", str(export), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_plan_json(export, tmp_path):
    proc = _plan(export, tmp_path, "--workers", "4", "--per-replica-batch-size", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert (plan["policy"], plan["global_batch_size"], plan["steps_per_epoch"]) == ("file", 16, 24)
    assert [w["dropped"] for w in plan["per_worker"]] == [4, 4, 4, 0]
    assert [pathlib.Path(w["files"][0]).name for w in plan["per_worker"]] == [
        f"export-{i:05d}.tfrecord" for i in range(4)]


def test_plan_zero_steps_is_a_clear_error(export, tmp_path):
    proc = _plan(export, tmp_path, "--workers", "2", "--global-batch-size", "1000")
    assert proc.returncode == 2
    assert "BatchSizeError" in proc.stderr and "per-worker batch 500" in proc.stderr
