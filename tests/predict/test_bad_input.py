"""Bad input is a named error before any prediction is written: the mixer's totalPatches against the records, a
patch size that disagrees with the mixer plus margin, bands missing from the export, a model of the wrong size,
an output folder holding other files; and a worker killed mid-run leaves no half file, the re-run completing
with files identical to an uninterrupted run. Only the killed worker is a child process: the other runs and the
CLI's one line run in this one (`predict_support.cli_in_process`: what `harness predict` runs)."""
import hashlib
import json
import os
import signal
import subprocess
import time

import pytest
from predict_support import BANDS, band_picker, cli_in_process, copy_export, harness_cmd
from harness.data.export import synth
from harness.distribute.context import WorkerContext
from harness.errors import MissingFeatureError, MixerError, ModelMismatchError, OutputExistsError, SpecError
from harness.predict.job import run
from harness.predict.options import PredictOptions


def _run(model, data, out, **kw):
    options = PredictOptions(model=str(model), data=(str(data),), output=str(out), task="regression", **kw)
    return run(options, context=WorkerContext.single(), say=lambda line: None)


def test_total_patches_disagreeing_with_the_records(margin_export, b3_model, tmp_path):
    data = copy_export(margin_export, tmp_path / "data", mixer_changes={"totalPatches": 22})
    with pytest.raises(MixerError, match=r"scene-mixer.json: totalPatches 22 but the shards hold 23 records"):
        _run(b3_model, data, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dims, error, match", [
    ([15, 15], ModelMismatchError, r"20x20 for patchDimensions 15x15 imply an odd kernel margin 5"),
    ([24, 24], SpecError, r"patchDimensions 24 and stored side 20 imply a kernel margin of -4"),
])
def test_patch_size_disagreeing_with_the_mixer_plus_margin(margin_export, b3_model, tmp_path, dims, error, match):
    data = copy_export(margin_export, tmp_path / "data", mixer_changes={"patchDimensions": dims})
    with pytest.raises(error, match=match):
        _run(b3_model, data, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_band_missing_from_the_export(margin_export, b3_model, tmp_path):
    with pytest.raises(MissingFeatureError, match=r"scene-00000.tfrecord.gz: band 'B8A' of the model is absent "
                                                  r"from the export; closest available key: 'B8'"):
        _run(b3_model, margin_export, tmp_path / "out", bands=("B2", "B3", "B4", "B8A"))


def test_a_shard_whose_patches_have_another_size(margin_export, b3_model, tmp_path):
    data = tmp_path / "data"
    copy_export(margin_export, data)
    synth.write_image_export(str(tmp_path / "other"), prefix="scene", shards=1, records=5, bands=BANDS, label=None,
                             patch_size=16, kernel_size=8, seed=3)
    os.replace(tmp_path / "other" / "scene-00000.tfrecord.gz", data / "scene-00002.tfrecord.gz")
    with pytest.raises(SpecError, match=r"scene-00002.tfrecord.gz: record 0: band 'B2': expected 400 values "
                                        r"\(20x20 patch: P=16 \+ margin 4\), found 576 values"):
        _run(b3_model, data, tmp_path / "out")


@pytest.mark.parametrize("crop, side, bands, match", [
    (1, None, 4, r"returns \[1, 18, 18, 1\]; expected \[batch, 20, 20\(, outputs\)\].*or \[batch, 16, 16"),
    (0, 24, 4, r"the model takes 24x24 patches; .* stores 20x20 \(P=16 \+ kernel margin 4\), cropped 16x16"),
    (0, None, 3, r"the model takes 3 bands, .* gives 4"),
])
def test_a_model_of_the_wrong_size(margin_export, tmp_path, crop, side, bands, match):
    model = band_picker(tmp_path / "m.keras", [[0, 1, 0, 0][:bands]], side=side, crop=crop)
    with pytest.raises(ModelMismatchError, match=match):
        _run(model, margin_export, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_model_of_the_cropped_size_is_fed_the_cropped_patch(margin_export, tmp_path):
    """A model built for P x P patches gets the central crop and its output is not cropped again."""
    import numpy as np
    from predict_support import K, P, read_outputs, stored_bands

    model = band_picker(tmp_path / "m.keras", [[0, 0, 1, 0]], side=P)
    rows = read_outputs(_run(model, margin_export, tmp_path / "out")["outputs"])
    a = K // 2
    np.testing.assert_array_equal(np.stack([r["prediction"].reshape(P, P) for r in rows]),
                                  stored_bands(margin_export, "B4")[:, a:a + P, a:a + P])


def test_a_non_empty_output_is_refused(margin_export, b3_model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match=r"out is not empty \(notes.txt\)"):
        _run(b3_model, margin_export, out)
    assert sorted(os.listdir(out)) == ["notes.txt"]
    _run(b3_model, margin_export, out, overwrite=True)
    assert "notes.txt" not in os.listdir(out) and len(list(out.glob("*.tfrecord"))) == 5


def test_another_runs_output_is_refused(margin_export, b3_model, tmp_path):
    out = tmp_path / "out"
    _run(b3_model, margin_export, out)
    with pytest.raises(OutputExistsError, match=r"holds the predictions of another run \(options differ"):
        _run(b3_model, margin_export, out, batch_size=3)
    again = _run(b3_model, margin_export, out)  # the same run: every file complete, nothing redone
    assert again["written"] == [] and len(again["skipped"]) == 5
    redone = _run(b3_model, margin_export, out, batch_size=3, overwrite=True)
    assert len(redone["written"]) == 5


def _digests(out):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.tfrecord"))}


def _half(out):
    return [n for n in os.listdir(out) if n.startswith(".big-") and ".tmp-" in n] if out.exists() else []


def test_a_killed_worker_leaves_no_half_file_and_the_rerun_completes_identically(b3_model, tmp_path):
    data = tmp_path / "data"
    synth.write_image_export(str(data), prefix="big", shards=5, records=100, bands=BANDS, label=None,
                             patch_size=120, kernel_size=8, seed=4)
    reference, out = tmp_path / "reference", tmp_path / "out"
    predict = ["predict", "--model", b3_model, "--data", data, "--batch-size", 1, "--task", "regression"]
    cli_in_process(*predict, "--output", reference)     # the files of an uninterrupted run
    proc = subprocess.Popen(harness_cmd(*predict, "--output", out), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (_half(out) and (out / "big-00001.tfrecord").exists()) and time.monotonic() < deadline:
            time.sleep(0.005)  # kill while the third file is being written
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    finals = _digests(out)
    assert 0 < len(finals) < 5, f"the kill came too late to test anything: {sorted(finals)}"
    assert all(finals[name] == _digests(reference)[name] for name in finals)  # every final name is whole
    assert _half(out)  # the file being written when the kill came is still under its temporary name
    r = cli_in_process(*predict, "--output", out)
    assert r.stdout.count("complete, skipped") == len(finals)
    assert _digests(out) == _digests(reference) and not _half(out)
    manifest = json.loads((out / "predict.json").read_text())
    assert manifest["outputs"] == [f"big-{i:05d}.tfrecord" for i in range(5)]


def test_the_cli_prints_the_named_error_in_one_line(margin_export, b3_model, tmp_path):
    data = copy_export(margin_export, tmp_path / "data", mixer_changes={"totalPatches": 24})
    r = cli_in_process("predict", "--model", b3_model, "--data", data, "--output", tmp_path / "out", ok=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "harness predict: MixerError: " in r.stderr and "totalPatches 24 but the shards hold 23" in r.stderr
