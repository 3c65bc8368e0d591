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


def test_uneven_files_warning_prints_a_reshard_line_that_fixes_it(tmp_path):
    """3 files of 40 records over 2 workers: the plan warns (33% dropped) and prints the `harness reshard` line;
    that line, run exactly as printed in the installed environment, gives a plan without the warning."""
    import shlex

    from harness.data.export import synth

    data = tmp_path / "uneven"
    synth.write_table_export(str(data), prefix="t", shards=3, records=120, seed=0)
    first = _plan(data, tmp_path, "--workers", "2", "--global-batch-size", "8")
    assert first.returncode == 0, first.stderr
    warning = next(line for line in first.stdout.splitlines() if line.startswith("warning:"))
    assert "40 of 120 records (33%) are read and dropped every epoch" in warning
    line = warning.split("equal shards: ", 1)[1]
    assert line == shlex.join(["harness", "reshard", str(data), "--output", f"{data}-resharded", "--workers", "2"])
    env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
               HARNESS_CACHE_DIR=str(tmp_path))
    done = subprocess.run(line, shell=True, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    fixed = _plan(pathlib.Path(f"{data}-resharded"), tmp_path, "--workers", "2", "--global-batch-size", "8")
    assert fixed.returncode == 0 and "warning" not in fixed.stdout, fixed.stdout + fixed.stderr
    assert "   0      1        60         0" in fixed.stdout  # 60 records each: 15 steps of 4 per worker
