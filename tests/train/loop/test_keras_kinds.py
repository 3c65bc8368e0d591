"""Both Keras kinds in the harness's step (harness/keras_kinds.py, harness/train/loop/trainer.py): a float16 overflow in
exactly one replica's, worker's or rank's share skips the update everywhere, with finite weights equal on every worker
and between the kinds; Keras 3's BatchNormalization statistics averaged over the replicas; the first step's loss on 2
replicas equal to one device's for a Keras 3 model.

The multi-worker cases are real processes (tests/train/scripts/overflow_step.py: 2 MultiWorkerMirroredStrategy
workers with a 30 s collective timeout, 2 Horovod ranks over Gloo), one launch each carrying both kinds."""
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import overflow_support
import procs
from harness import keras_kinds
from harness.distribute.backend import TrainingBackend
from harness.distribute.context import WorkerContext
from harness.launch.local import worker_environments

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "overflow_step.py"
BIN = pathlib.Path(sys.executable).parent


def _check(results: list[dict], workers: int) -> None:
    """Per kind: step 1 skipped and step 2 applied on every worker, the scale halved once, both steps counted,
    finite weights equal on every worker; the two kinds' weights equal."""
    by_kind = {}
    for r in results:
        by_kind.setdefault(r["kind"], []).append(r)
    assert sorted(by_kind) == ["keras3", "tf_keras"]
    for kind, rs in by_kind.items():
        assert len(rs) == workers, (kind, rs)
        for r in rs:
            assert r["skipped"] == [1.0, 0.0], (kind, r["skipped"])
            assert r["loss_scale"] == overflow_support.INITIAL_SCALE / 2, kind
            assert r["iterations"] == 2, kind
            assert r["finite"], kind
        assert len({r["digest"] for r in rs}) == 1, f"{kind}: the workers' weights differ"
    for a, b in zip(by_kind["tf_keras"][0]["weights"], by_kind["keras3"][0]["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_overflow_on_one_of_two_replicas_skips_the_step_on_both(cpu_mirrored):
    backend = TrainingBackend(cpu_mirrored, WorkerContext.single(replicas_per_worker=2))
    _check([overflow_support.run(kind, backend) for kind in keras_kinds.KINDS], workers=1)


def test_overflow_on_one_of_two_workers_skips_the_step_on_both(tmp_path):
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    workers = []
    try:
        for log, env in zip(logs, worker_environments(2, base=procs.outer_free())):
            with open(log, "w") as f:
                workers.append(subprocess.Popen([sys.executable, str(SCRIPT), "tf"], env=env, stdout=f,
                                                stderr=subprocess.STDOUT, start_new_session=True))
        for w in workers:
            w.wait(timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("a worker hung:\n" + "\n".join(log.read_text()[-3000:] for log in logs))
    finally:
        procs.kill_groups(*workers)
    out = "\n".join(log.read_text() for log in logs)
    assert [w.returncode for w in workers] == [0, 0], out[-6000:]
    _check(procs.tagged(out, "OVERFLOW"), workers=2)


@pytest.mark.skipif(not shutil.which("horovodrun", path=str(BIN)), reason="no horovodrun (Horovod not installed)")
def test_overflow_on_one_of_two_horovod_ranks_skips_the_step_on_both():
    """Over Gloo. The skip is the harness's all-reduce of the step's finiteness (HorovodBackend), the same whatever
    controller carries it: the MPI controller's case (another ~12 CPU-s launch) was dropped; `harness train
    --backend horovod` under mpirun, mixed_float16 included, is tests/distribute/test_horovod_backend.py's, and
    `harness launch mpi` trains in tests/train/measure/test_tune.py and tests/test_ports_inventory.py."""
    # a collective that waits for a rank that skipped it fails in 30 s (Gloo) instead of hanging
    env = dict(procs.outer_free(), HOROVOD_GLOO_TIMEOUT_SECONDS="30",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    out = procs.run([*procs.HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, SCRIPT,
                     "horovod"], env=env, timeout=180)
    _check(procs.tagged(out, "OVERFLOW"), workers=2)


def test_keras3_batch_norm_statistics_are_averaged_over_the_replicas(cpu_mirrored):
    """Each replica's moving mean comes from its own batch; after `align_model_state` every copy (and what is read
    and saved) is their mean."""
    import keras

    backend = TrainingBackend(cpu_mirrored, WorkerContext.single(replicas_per_worker=2))
    with cpu_mirrored.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization(momentum=0.0)])
    values = cpu_mirrored.experimental_distribute_values_from_function(
        lambda ctx: tf.fill([4, 2], float(ctx.replica_id_in_sync_group + 1)))   # replica 0: ones, replica 1: twos
    cpu_mirrored.run(tf.function(lambda x: model(x, training=True)), args=(values,))
    mean = model.layers[0].moving_mean.value
    assert [float(v[0]) for v in cpu_mirrored.experimental_local_results(mean)] == [1.0, 2.0]   # per replica
    assert backend.epoch_end_callbacks(model), "no epoch-end alignment for Keras 3's per-replica statistics"
    backend.align_model_state(model)
    assert [float(v[0]) for v in cpu_mirrored.experimental_local_results(mean)] == [1.5, 1.5]
    np.testing.assert_allclose(model.get_weights()[2], [1.5, 1.5])


def test_first_step_loss_of_a_keras3_model_on_two_replicas_equals_one_device(cpu_mirrored):
    import keras

    from loop_support import build as build_run

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(16, 3)).astype(np.float32), rng.integers(0, 3, 16).astype(np.int32)
    weights = None
    losses = []
    for strategy in (tf.distribute.OneDeviceStrategy("/cpu:0"), cpu_mirrored):
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="relu",
                                                                            kernel_regularizer=keras.regularizers.L2(0.1)),
                                      keras.layers.Dense(3)])
            if weights is None:
                weights = model.get_weights()
            model.set_weights(weights)
            optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        run = build_run(strategy, model, optimizer, global_batch_size=16)
        ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat())
        batches = iter(ds)
        losses.append([run.train_step(next(batches)) for _ in range(3)])
        if len(losses) == 1:
            after_one = [w.copy() for w in model.get_weights()]
        else:
            for a, b in zip(after_one, model.get_weights()):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
