"""`harness train --backend horovod` with real processes on CPU: horovodrun --gloo and mpirun, 2 ranks.

Every launch runs in its own process group under a timeout that kills the group and fails the test (a hang in a
collective must not hang the suite). The ranks run tests/distribute/scripts/hvd_train.py (the job as the CLI runs
it, printing each rank's final weights and writes) or hvd_mpi_threads.py (MPI beside Horovod's thread, then
hvd_loss_scale.py's step). In-process tests cover the pieces that need no second process: GPU pinning, the
sharding check, Horovod ranks' backups, options.
"""
import gzip
import json
import os
import pathlib
import sys
from types import SimpleNamespace

import numpy as np
import procs
import pytest

from harness.distribute import horovod, mpi
from harness.distribute.context import Backend, WorkerContext
from harness.distribute.plan import make_plan
from harness.distribute.sharding import ShardAssignment, assign_files
from harness.errors import ClusterConfigError, ConfigError

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"
BIN = pathlib.Path(sys.executable).parent
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
           PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
ROOT = ["--allow-run-as-root"] if os.geteuid() == 0 else []
MPIRUN = ["mpirun", *ROOT, "-bind-to", "none", "-map-by", "slot", "-x", "TF_USE_LEGACY_KERAS",
          "-x", "TF_CPP_MIN_LOG_LEVEL"]


def horovodrun(np_: int, *cmd) -> list:
    return [*procs.HOROVODRUN, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", *cmd]


def run(cmd: list, timeout: float = 180) -> str:
    return procs.run(cmd, env=ENV, timeout=timeout)


tagged, results = procs.tagged, procs.results


def train(launcher: list, data, output, *flags, ranks=2, timeout=180, env=None) -> dict:
    """Run hvd_train.py under `launcher` (with `env` added); each rank's result line is read from its own file (a
    long line on the launcher's shared stdout can be cut by another rank's output)."""
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        cmd = launcher + ["-x", "HARNESS_TEST_RESULTS"] if launcher[0] == "mpirun" else launcher
        procs.run(cmd + [sys.executable, SCRIPTS / "hvd_train.py", "--backend", "horovod", "--data", data,
                         "--output", output, *flags], env=dict(ENV, HARNESS_TEST_RESULTS=folder, **(env or {})),
                  timeout=timeout)
        out = "".join(p.read_text() for p in sorted(pathlib.Path(folder).glob("rank*.txt")))
    return results(out, "HVD_TRAIN", ranks)


def check_ranks(by_rank: dict, files: list[str], models=(1,)) -> None:
    """Disjoint files covering all; identical final weights; rank 0 alone wrote (its model saves one of `models`:
    the final model, and the best ones under --monitor); the same steps everywhere."""
    ranks = sorted(by_rank)
    stats = by_rank[0]["summary"]["ranks"]
    assert [s["rank"] for s in stats] == ranks
    per_rank = [set(s["files"]) for s in stats]
    assert sum(len(f) for f in per_rank) == len(set().union(*per_rank)), per_rank  # disjoint
    assert set().union(*per_rank) == set(files)
    digests = {r["sha256"] for r in by_rank.values()} | {s["weights_sha256"] for s in stats}
    assert len(digests) == 1, digests
    w0 = np.array(by_rank[0]["weights"])
    for r in ranks[1:]:
        np.testing.assert_array_equal(np.array(by_rank[r]["weights"]), w0)
        assert by_rank[r]["writes"] == {"backup": 0, "model": 0, "files": []}, by_rank[r]["writes"]
        assert by_rank[r]["summary"]["model"] is None
    epochs = len(by_rank[0]["summary"]["history"])
    assert by_rank[0]["writes"]["model"] in models, by_rank[0]["writes"]
    assert by_rank[0]["writes"] == {"backup": epochs, "model": by_rank[0]["writes"]["model"],
                                    "files": ["summary.json"]}
    # Metrics are reduced over the ranks: every rank reports the same history.
    histories = [[{k: h[k] for k in ("loss", "val_loss", "val_accuracy") if k in h} for h in r["summary"]["history"]]
                 for r in by_rank.values()]
    assert all(h == histories[0] for h in histories), histories
    finals = {r["summary"]["final_step"] for r in by_rank.values()}
    iterations = {r["summary"]["optimizer_iterations"] for r in by_rank.values()}
    assert len(finals) == 1 and finals == iterations, (finals, iterations)


# --- real processes --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image_export(tmp_path_factory):
    from harness.data.export import synth
    folder = tmp_path_factory.mktemp("image")
    paths = synth.write_image_export(str(folder / "train"), shards=4, records=32, patch_size=16, seed=1)
    synth.write_image_export(str(folder / "val"), prefix="val", shards=2, records=16, patch_size=16, seed=2)
    return folder, [p for p in paths if p.endswith(".tfrecord.gz")]


def test_horovodrun_gloo_trains_in_sync_and_stops_early_alike(image_export, tmp_path):
    """The run, of 5 epochs, stops early: --min-delta 1.0 on mean IoU, so only epoch 1 improves and both ranks stop
    after epoch 2 (the metric is summed over the ranks, so they decide alike), and rank 0 alone writes
    best/model.keras. A resume from rank 0's backup under horovodrun --gloo (rank 0 alone restores; every rank
    continues from its step with its optimizer state and ends with the same weights): tests/launch/
    test_fault_tolerance.py's horovodrun runs."""
    folder, files = image_export
    data, out = folder / "train", tmp_path / "run"
    by_rank = train(horovodrun(2), data, out, "--epochs", "5", "--per-replica-batch-size", "4",
                    "--check-sharding", "--validation-data", folder / "val", "--steps-per-loop", "3",
                    "--monitor", "val_mean_iou", "--early-stopping", "1", "--min-delta", "1.0")
    check_ranks(by_rank, files, models=(2,))  # best + final, rank 0 only
    for r in by_rank.values():
        assert [h["epoch"] for h in r["summary"]["history"]] == [1, 2]
        assert r["summary"]["best"]["epoch"] == 1
    assert by_rank[0]["summary"]["best"]["model"] == str(out / "best" / "model.keras")
    assert by_rank[1]["summary"]["best"]["model"] is None
    assert (out / "best" / "model.keras").is_file()
    # Training and validation shards discovered, counted and checked once each per rank; each plan assigns
    # files once per rank (2 ranks x 2 plans), and the pipelines take those assignments.
    for r in by_rank.values():
        assert r["calls"] == {"discover_shards": 2, "find_mixer": 2, "record_stats": 2, "validate_spec": 2,
                              "assign_nonempty": 4}, r["calls"]
    summary = by_rank[0]["summary"]
    # `harness plan --workers 2 --replicas-per-worker 1 --per-replica-batch-size 4` numbers: one replica per rank
    counts = [(f, 8) for f in files]
    assert summary["plan"] == make_plan(counts, workers=2, replicas_per_worker=1, per_replica_batch_size=4).to_dict()
    assert summary["plan"]["global_batch_size"] == 8 and summary["final_step"] == 8
    assert all(np.isfinite(h["loss"]) and 0 <= h["val_accuracy"] <= 1 for h in summary["history"])
    assert {"backup", "model.keras", "summary.json"} <= set(os.listdir(out))  # rank 0 wrote them
    assert json.loads((out / "summary.json").read_text())["final_step"] == 8


# mixed_float16 under mpirun with the mpi4py control plane: the validation test at the end of this file (its run
# under mpirun trains in mixed_float16 with --check-sharding).


def test_mpirun_refuses_mpi_without_thread_multiple():
    """MPI4PY_RC_THREAD_LEVEL=serialized overrides mpi4py.rc: MPI then grants 'serialized', under which Horovod's
    thread and the control plane calling MPI at once is undefined (Horovod only warns). A rank refuses it by name
    before Horovod starts (on an MPI that grants 'multiple': the next test). One rank: each checks its own grant,
    before it meets any other."""
    script = [sys.executable, SCRIPTS / "hvd_mpi_threads.py", "init"]
    refused = results(procs.run(MPIRUN + ["-np", "1", "-x", "MPI4PY_RC_THREAD_LEVEL"] + script,
                                env=dict(ENV, MPI4PY_RC_THREAD_LEVEL="serialized"), timeout=120), "HVD_THREADS", 1)
    for r in refused.values():
        assert "MPI granted thread level 'serialized'" in r.get("error", ""), r
        assert "MPI4PY_RC_THREAD_LEVEL=serialized is set" in r["error"]


@pytest.fixture(scope="module")
def threads_run() -> dict:
    """2 ranks of hvd_mpi_threads.py under mpirun: its 300 rounds, then hvd_loss_scale.py's step at a fixed scale
    of 8 (one mpirun, one TensorFlow import per rank, for both tests)."""
    return results(run(MPIRUN + ["-np", "2", sys.executable, SCRIPTS / "hvd_mpi_threads.py", "stress", "300", "8"],
                       timeout=240), "HVD_THREADS", 2)


def test_mpirun_control_plane_collectives_beside_horovod_thread(threads_run):
    """MPI grants 'multiple' (mpi4py's default request) and the plane is a duplicate of COMM_WORLD; 300 rounds of
    its pickled-object collectives on the main thread while another thread runs Horovod all-reduces through the MPI
    controller, then an uneven exit: every value arrives right, both ranks exit 0."""
    by_rank = threads_run
    for r in by_rank.values():
        assert (r["level"], r["plane"], r["own_comm"], r["congruent"]) == ("multiple", "MPIControlPlane", True, True)
        assert r["rounds"] == 300
        assert r["wrong"] == [], r["wrong"]
        assert r["allreduces"] > 0 and r["allreduces_right"] == r["allreduces"], r


def test_loss_scale_applied_once_under_horovod(threads_run):
    """Kernel [[0, 0]], x = 1, label 0, SGD lr 1, fixed scale 8 → [[0.5, -0.5]] on both ranks (see
    tests/train/model/test_precision.py); scaled twice or never unscaled would multiply or divide it by 8, dividing by
    the global batch instead of the rank's would halve it. Under mpirun (no middleman per rank, as horovodrun
    spawns), in the ranks of the control plane's test after their rounds; Horovod's Gloo controller under
    mixed_float16: tests/train/loop/test_keras_kinds.py's overflow test."""
    assert sorted(threads_run) == [0, 1]
    for r in (x["loss_scale"] for x in threads_run.values()):
        assert r["scaled"] and r["size"] == 2
        assert r["loss"] == pytest.approx(np.log(2.0), rel=1e-3)
        np.testing.assert_allclose(r["kernel"], [[0.5, -0.5]], rtol=1e-3)


# --- in-process -------------------------------------------------------------------------------------------------------
class FakeConfig:
    """`tf.config` with `n` GPUs, recording what was pinned."""

    def __init__(self, n):
        self.gpus = [SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(n)]
        self.visible, self.growth = None, []
        self.experimental = SimpleNamespace(set_memory_growth=lambda d, on: self.growth.append((d.name, on)))

    def list_physical_devices(self, kind):
        return self.gpus if kind == "GPU" else []

    def set_visible_devices(self, device, kind):
        self.visible = (device.name, kind)


def test_pin_gpu_by_local_rank():
    config = FakeConfig(4)
    assert horovod.pin_gpu(2, config=config) == "/physical_device:GPU:2"
    assert config.visible == ("/physical_device:GPU:2", "GPU")
    assert config.growth == [("/physical_device:GPU:2", True)]
    assert horovod.pin_gpu(3, config=FakeConfig(0)) is None  # CPU-only host: nothing to pin


def test_pin_gpu_refuses_local_rank_beyond_gpus():
    with pytest.raises(ClusterConfigError, match=r"local rank 2 >= 2 visible GPUs"):
        horovod.pin_gpu(2, config=FakeConfig(2))


FILES = [f"f{i}" for i in range(5)]


def test_sharding_errors_accept_the_real_assignments():
    for n in (1, 2, 5, 7):  # 7 > 5 files: record sharding
        assert mpi.sharding_errors([assign_files(FILES, n, r, warn=False) for r in range(n)], FILES) == []


def test_sharding_errors_name_overlaps_gaps_and_misnumbered_ranks():
    by_local_rank = [assign_files(FILES, 2, 0, warn=False)] * 2  # two hosts, each rank local rank 0
    problems = mpi.sharding_errors(by_local_rank, FILES)
    assert "rank 1 reads as input pipeline 0 of 2, expected 1 of 2" in problems
    assert "f0 is read by ranks 0 and 1" in problems and any("read by no rank" in p for p in problems)
    stray = [ShardAssignment(("f0", "f1", "f2", "x"), "file", 0, 2), ShardAssignment(("f3", "f4"), "file", 1, 2)]
    assert mpi.sharding_errors(stray, FILES) == ["rank 0 reads x, which is not among the 5 files of rank 0"]
    partial = [ShardAssignment(("f0",), "record", r, 7) for r in range(7)]
    assert any("expected all 5" in p for p in mpi.sharding_errors(partial, FILES))


def test_check_sharding_raises_on_a_bad_gather():
    class Plane(mpi.LocalControlPlane):
        def allgather(self, obj):  # as if another rank had read the same files
            return [obj, obj]

    mine = assign_files(FILES, 2, 0, warn=False)
    with pytest.raises(ClusterConfigError, match="sharding self-check failed on 2 ranks"):
        mpi.check_sharding(Plane(), mine, FILES)
    assert mpi.check_sharding(mpi.LocalControlPlane(), assign_files(FILES, 1, 0), FILES)[0].files == tuple(FILES)


def test_launched_by_mpi_reads_the_launcher_table():
    assert mpi.launched_by_mpi({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
    assert mpi.launched_by_mpi({"PMI_RANK": "0", "PMI_SIZE": "4"})
    assert not mpi.launched_by_mpi({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"})  # horovodrun --gloo
    assert not mpi.launched_by_mpi({})


def test_non_chief_horovod_rank_neither_writes_nor_restores(tmp_path):
    import tf_keras as keras
    from harness.train.lifecycle import backup as backups

    def backup(rank, folder):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
        opt = keras.optimizers.Adam()
        opt.build(model.trainable_variables)
        ctx = WorkerContext(rank, 2, rank, 1, "worker", rank, Backend.HOROVOD)
        return backups.Backup(str(folder), ctx, model=model, optimizer=opt), model, ctx

    chief, model0, ctx0 = backup(0, tmp_path / "out")
    chief.save(4)
    assert backups.save_model(model0, str(tmp_path / "out"), ctx0).endswith("model.keras")
    other, model1, ctx1 = backup(1, tmp_path / "out")
    assert other.restore() == 0  # rank 0's state arrives by broadcast
    other.save(4)
    assert backups.save_model(model1, str(tmp_path / "elsewhere"), ctx1) is None
    other.close()
    assert not (tmp_path / "elsewhere").exists()
    assert sorted(os.listdir(tmp_path / "out" / "backup")) == ["checkpoint", "ckpt-4.data-00000-of-00001",
                                                               "ckpt-4.index"]
    # What the broadcast sends is the same list on a rank that restored and on one that did not.
    restored, _, _ = backup(0, tmp_path / "out")
    assert restored.restore() == 4
    signature = [(tuple(v.shape), v.dtype) for v in restored.variables()]
    assert signature == [(tuple(v.shape), v.dtype) for v in other.variables()]
    first = restored.variables()[:2]
    assert first[0] is restored.step and first[1] is restored.checkpoint.save_counter


def test_backend_option_and_flags():
    from harness.cli import build_parser
    from harness.commands.train import options_from_args
    from harness.train.options import TrainOptions

    args = build_parser().parse_args(["train", "--data", "x", "--backend", "horovod", "--check-sharding"])
    options, _ = options_from_args(args)
    assert options.backend == "horovod" and options.check_sharding
    assert TrainOptions(data=("x",)).backend == "tf"
    with pytest.raises(ConfigError, match="backend must be one of"):
        TrainOptions(data=("x",), backend="mpi")
    with pytest.raises(ConfigError, match="one replica per process"):
        TrainOptions(data=("x",), backend="horovod", cpu_replicas=2)


# A user model file with dropout and a custom per-example loss on 2 Horovod ranks (horovodrun --gloo, the ACES points):
# tests/train/model/test_user.py::test_user_model_and_loss_on_aces_points_two_horovod_ranks (identical final weights
# on both ranks, validation accuracy above the majority share); every rank reporting the same history:
# `check_ranks` here.


@pytest.fixture(scope="module")
def uneven_images(tmp_path_factory):
    """4 GZIP files of 20/20/20/16 patches of 16x16 (the last cut after its 16th record, the mixer's total
    with it); returns the folder and the files."""
    from harness.data.export import synth
    folder = tmp_path_factory.mktemp("uneven")
    paths = synth.write_image_export(str(folder), shards=4, records=80, patch_size=16, seed=3)
    files = [p for p in paths if p.endswith(".tfrecord.gz")]
    with gzip.open(files[-1], "rb") as f:
        raw = f.read()
    offset = 0
    for _ in range(16):  # TFRecord framing: u64 length, u32 crc, data, u32 crc
        offset += 16 + int.from_bytes(raw[offset:offset + 8], "little")
    with gzip.open(files[-1], "wb") as f:
        f.write(raw[:offset])
    mixer = folder / "export-mixer.json"
    mixer.write_text(json.dumps(dict(json.loads(mixer.read_text()), totalPatches=76)))
    return folder, files


def test_mpirun_mixed_float16_ranks_take_equal_steps_score_each_validation_record_once_meet_after_chiefs_writes(
        uneven_images, tmp_path_factory, tmp_path):
    """Under mpirun the ranks take the mpi4py control plane, not Horovod's, and train in mixed_float16 in sync.

    Uneven training files, per-rank batch 4: rank 0 (files 0 and 2: 40 patches) could take 10 steps, rank 1
    (files 1 and 3: 36) only 9; both take 9 and report what they drop, with 5 steps per call (calls of 5 and 4).
    Two ranks: the rule is the same for any number (4 ranks over 2 hosts: tests/cluster/test_horovod_hosts.py).
    Under mpirun: horovodrun spawns a Python middleman per rank (a run cost ~4 CPU-s more under it); Gloo's runs:
    the first test.

    39 validation patches in 3 files (rank 0 reads 2: 26 patches, rank 1 reads 1: 13), 4 per rank per step:
    equal steps would score 3 batches per rank (24 patches); every patch is scored once, and every rank reports
    the same metrics (issue 19, item 6).

    Under Horovod's stall inspector set to shut the job down after 2 s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS,
    horovod/horovod#2315; Horovod 0.28.1 inspects under its MPI controller only: horovodrun --gloo never warned
    with ranks 6 s apart), a rank 0 that spends 0.6 s per validation batch (its 7 batches) and 5 s saving the
    best model at the first epoch's end: rank 1 waited 4 s in the metrics' sum, then up to 5 s in the next epoch's
    first all-reduce, and the job was killed as a lost peer. The ranks now agree at every validation step whether
    any has data, and meet on the control plane after the chief's writes."""
    from harness.data.export import synth
    folder, files = uneven_images
    val = tmp_path_factory.mktemp("val13")
    synth.write_image_export(str(val), prefix="val", shards=3, records=39, patch_size=16, seed=5)
    slow = {"HARNESS_TEST_EVAL_SLEEP_S": "0.6", "HARNESS_TEST_SLOW_BATCHES": "7", "HARNESS_TEST_SAVE_SLEEP_S": "5",
            "HARNESS_TEST_SLOW_RANK": "0",
            "HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"}
    launcher = MPIRUN + ["-np", "2"] + [a for k in slow for a in ("-x", k)]
    by_rank = train(launcher, folder, tmp_path / "run", "--epochs", "2", "--per-replica-batch-size", "4",
                    "--steps-per-loop", "5", "--validation-data", val, "--monitor", "val_loss", "--precision",
                    "mixed_float16", "--check-sharding", "--model", f"{SCRIPTS / 'slow_eval_model.py'}:build",
                    env=slow)
    assert {r["launcher"] for r in by_rank.values()} == {"openmpi"}  # mpi4py plane, not Horovod's
    check_ranks(by_rank, files, models=(2, 3))  # the final model and the best of epoch 1 (and of 2)
    summary = by_rank[0]["summary"]
    stats = summary["ranks"]
    assert [s["records"] for s in stats] == [40, 36]
    assert [s["dropped"] for s in stats] == [4, 0]
    assert [s["steps"] for s in stats] == [2 * 9] * 2   # 2 epochs of 9 steps
    assert {r["summary"]["final_step"] for r in by_rank.values()} == {2 * 9}
    assert summary["policy"] == "mixed_float16"
    assert all(np.isfinite(h["loss"]) for h in summary["history"])
    for r in by_rank.values():
        evaluation = r["summary"]["evaluation"]
        assert evaluation["records_expected"] == 39
        assert evaluation["per_epoch"] == [{"epoch": e, "records": 39, "pixels": 39 * 16 * 16} for e in (1, 2)]
    assert len({r["summary"]["history"][-1]["val_loss"] for r in by_rank.values()}) == 1
    assert (tmp_path / "run" / "best" / "model.keras").is_file()
