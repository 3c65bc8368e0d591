"""The round trip (issue 15's first proof): a model that returns one input band gives back exactly that band,
cropped by k/2 per side, one Example per patch in input order, under 1, 2 and 3 real worker processes, and the
files are byte-identical whatever the number of workers."""
import hashlib
import re
import shlex

import numpy as np
import pytest
from predict_support import K, P, RECORDS, band_picker, harness_cmd, read_outputs, run_cli, stored_bands

from harness.data.export import inspect as inspect_lib
from harness.distribute.context import WorkerContext
from harness.predict.job import run
from harness.predict.options import PredictOptions


def _digests(out):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.tfrecord"))}


def _expected_b3(export):
    a = K // 2
    return stored_bands(export, "B3")[:, a:a + P, a:a + P]


@pytest.fixture(scope="module")
def one_worker(margin_export, b3_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("rt") / "out"
    lines = []
    result = run(PredictOptions(model=str(b3_model), data=(str(margin_export),), output=str(out), batch_size=2,
                                task="regression"), context=WorkerContext.single(), say=lines.append)
    return out, result, lines


def test_one_worker_returns_the_band_cropped_in_order(one_worker, margin_export):
    out, result, _ = one_worker
    rows = read_outputs(result["outputs"])
    assert len(rows) == RECORDS
    assert all(set(r) == {"prediction"} and r["prediction"].size == P * P for r in rows)
    got = np.stack([r["prediction"].reshape(P, P) for r in rows]).astype(np.float32)
    np.testing.assert_array_equal(got, _expected_b3(margin_export))
    assert [p.name for p in sorted(out.glob("*.tfrecord"))] == [f"scene-{i:05d}.tfrecord" for i in range(5)]


def test_upload_commands_copy_the_files_then_upload_them_in_order_mixer_last(one_worker):
    """Local outputs: `gcloud storage cp` of the files in order with the mixer last, then `earthengine upload
    image` of those copies in the same order (the CLI's own rules: tests/predict/test_upload.py)."""
    out, result, lines = one_worker
    cmds = [shlex.split(l) for l in lines if l.startswith(("gcloud storage cp", "earthengine upload"))]
    assert [c[:3] for c in cmds] == [["gcloud", "storage", "cp"], ["earthengine", "upload", "image"]]
    copied, staging = cmds[0][3:-1], cmds[0][-1]
    assert staging == "gs://BUCKET/PATH/" and result["upload"] == lines[-2:]
    assert copied[-1].endswith("scene-mixer.json") and copied[:-1] == result["outputs"]
    assert copied[:-1] == sorted(copied[:-1])
    assert all(__import__("os").path.exists(f) for f in copied)
    assert cmds[1][3] == "--asset_id=projects/my-project/assets/predictions"
    assert cmds[1][4:] == [staging + __import__("os").path.basename(f) for f in copied]


def test_inspect_reads_the_output_as_an_export_of_the_same_grid(one_worker, margin_export):
    out, _, _ = one_worker
    rep = inspect_lib.report([str(out)])
    src = inspect_lib.report([str(margin_export)])
    assert rep["mixer"]["totalPatches"] == src["mixer"]["totalPatches"] == RECORDS
    assert rep["mixer"]["patchDimensions"] == src["mixer"]["patchDimensions"] == [P, P]
    assert rep["config"]["data"]["patch_size"] == P and rep["config"]["data"]["kernel_margin"] == 0
    assert [s["records"] for s in rep["shards"]] == [s["records"] for s in src["shards"]] == [5, 5, 5, 4, 4]


@pytest.mark.parametrize("launcher, workers", [("local", 1), ("local", 3), ("mpi", 2)])
def test_workers_write_identical_files(launcher, workers, one_worker, margin_export, b3_model, tmp_path):
    """Real processes: `harness launch local` (TF_CONFIG) and `harness launch mpi` (mpirun's rank variables); each
    launcher once with several workers, and 1, 2 and 3 workers each once (2 local workers, once a case of its own,
    split the shards as 2 ranks of mpi-2 do: `contiguous_runs` of the same counts)."""
    out = tmp_path / "out"
    predict = harness_cmd("predict", "--model", b3_model, "--data", margin_export, "--output", out,
                          "--batch-size", 2, "--task", "regression")
    count = ["--workers", workers] if launcher == "local" else ["--np", workers]
    r = run_cli("launch", launcher, *count, "--timeout", 240, "--", *predict)
    assert _digests(out) == _digests(one_worker[0]) and len(_digests(out)) == 5
    shares = re.findall(r"worker (\d+)/(\d+): input shards (\S+)", r.stdout)
    assert sorted(int(w) for w, n, _ in shares) == list(range(workers))
    assert all(int(n) == workers for _, n, _ in shares)
    assert r.stdout.count("earthengine upload image") == 1  # the chief's lines
    assert r.stdout.count("gcloud storage cp") == 1


def test_classes_and_probabilities(margin_export, tmp_path):
    """Two output channels (B2, B3): class = 1 where B3 > B2, int64; probabilities = their softmax, float."""
    model = band_picker(tmp_path / "two.keras", [[1, 0, 0, 0], [0, 1, 0, 0]])
    result = run(PredictOptions(model=str(model), data=(str(margin_export),), output=str(tmp_path / "out"),
                                probabilities=True, output_bands=("landcover", "p_low", "p_high")),
                 context=WorkerContext.single(), say=lambda line: None)
    rows = read_outputs(result["outputs"])
    a = K // 2
    b2 = stored_bands(margin_export, "B2")[:, a:a + P, a:a + P]
    b3 = stored_bands(margin_export, "B3")[:, a:a + P, a:a + P]
    classes = np.stack([r["landcover"].reshape(P, P) for r in rows])
    assert classes.dtype == np.int64
    np.testing.assert_array_equal(classes, (b3 > b2).astype(np.int64))
    high = np.stack([r["p_high"].reshape(P, P) for r in rows])
    np.testing.assert_allclose(high, 1 / (1 + np.exp(b2 - b3)), rtol=1e-5)
    assert set(rows[0]) == {"landcover", "p_low", "p_high"}


def test_a_zero_record_shard_gets_an_empty_file_left_out_of_the_upload(margin_export, b3_model, tmp_path):
    import tensorflow as tf
    from predict_support import copy_export

    data = copy_export(margin_export, tmp_path / "data")
    with tf.io.TFRecordWriter(str(data / "scene-00005.tfrecord.gz"), "GZIP"):
        pass
    lines = []
    result = run(PredictOptions(model=str(b3_model), data=(str(data),), output=str(tmp_path / "out"),
                                task="regression"), context=WorkerContext.single(), say=lines.append)
    assert len(result["outputs"]) == 6 and (tmp_path / "out" / "scene-00005.tfrecord").stat().st_size == 0
    assert len(read_outputs(result["outputs"])) == RECORDS
    copy = shlex.split(next(l for l in lines if l.startswith("gcloud storage cp")))
    assert copy[3:-2] == result["outputs"][:5] and copy[-2].endswith("scene-mixer.json")   # no empty scene-00005
