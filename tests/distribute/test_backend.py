"""The training backend (harness/distribute/backend.py): tf.distribute's answers in-process; Horovod's are
exercised by real ranks in test_horovod_backend.py."""
import pytest

from harness.distribute import mpi
from harness.distribute.backend import HorovodBackend, TrainingBackend, make_backend
from harness.distribute.plan import make_plan
from harness.errors import ClusterConfigError, ConfigError


@pytest.fixture(scope="module")
def mirrored():
    from harness.distribute.strategy import make_strategy
    return make_strategy("mirrored", num_cpu_replicas=2)


def test_tf_backend_answers(mirrored):
    backend = make_backend("tf", distribution=mirrored)
    assert type(backend) is TrainingBackend and backend.is_writer and backend.context.replicas_in_sync == 2
    plan = make_plan([("a", 100)], workers=1, replicas_per_worker=2, per_replica_batch_size=8)
    assert backend.loss_divisor(plan) == 16  # the global batch: the optimizer sums the replicas' gradients
    tape = object()
    assert backend.gradient_tape(tape) is tape and backend.ranks_summed == 1 and backend.sum_over_ranks(3.0) == 3.0
    assert backend.epoch_end_callbacks(None) == []
    assert isinstance(backend.control_plane(), mpi.LocalControlPlane)  # one worker: local collectives
    assert backend.gather_ranks({"rank": 0}) is None and backend.describe() is None
    assert backend.broadcast_backup(None, 40) == 40


def test_distributed_dataset_from_the_function(mirrored):
    import tensorflow as tf

    backend = make_backend("tf", distribution=mirrored)
    seen = []

    def fn(ctx):
        seen.append((ctx.input_pipeline_id, ctx.num_input_pipelines))
        return tf.data.Dataset.range(8).batch(2)

    batch = next(iter(backend.distribute(fn)))
    assert seen == [(0, 1)] and len(backend.strategy.experimental_local_results(batch)) == 2


def test_horovod_loss_divisor_is_the_per_rank_batch():
    plan = make_plan([("a", 100), ("b", 100)], workers=2, replicas_per_worker=1, per_replica_batch_size=8)
    backend = HorovodBackend.__new__(HorovodBackend)  # no hvd.init() in the test process
    assert backend.loss_divisor(plan) == 8 and plan.global_batch_size == 16


def test_refusals(mirrored):
    with pytest.raises(ConfigError, match="backend must be one of"):
        make_backend("mpi", distribution=mirrored)
    with pytest.raises(ClusterConfigError, match="backend horovod, but the distribution given is mirrored"):
        make_backend("horovod", distribution=mirrored)


@pytest.mark.parametrize("environ, launcher", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "16"}, "openmpi"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "pmi"),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4"}, "srun"),
])
def test_tf_backend_refuses_to_be_one_of_several_launched_copies(environ, launcher):
    """mpirun/MPIJob/srun with the tf backend trained N independent copies, each its own chief (issue 11, 2)."""
    from harness.distribute.backend import refuse_independent_copies

    with pytest.raises(ClusterConfigError, match=f"started by {launcher}") as e:
        refuse_independent_copies(environ)
    assert "--backend horovod" in str(e.value) and "TF_CONFIG" in str(e.value)
    tf_config = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'
    refuse_independent_copies({**environ, "TF_CONFIG": tf_config})  # a real multi-worker cluster: allowed
    # An sbatch script itself (no srun step) is one process, whatever the allocation's task count.
    refuse_independent_copies({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})


def test_strategy_built_before_tf_config_is_refused(mirrored, monkeypatch):
    """A strategy built before TF_CONFIG was set trains alone while TF_CONFIG names 2 workers (issue 11, 13)."""
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["localhost:1", "localhost:2"]}, '
                                    '"task": {"type": "worker", "index": 0}}')
    with pytest.raises(ClusterConfigError, match=r"the strategy has 1 worker\(s\) \(mirrored\) but TF_CONFIG "
                                                 r"names 2"):
        make_backend("tf", distribution=mirrored)


class _Gathered(TrainingBackend):
    """A backend whose all-gather returns the given rows (this worker's row replaced by its own values)."""

    def __init__(self, context, rows):
        super().__init__(None, context)
        self.rows = rows

    def allgather(self, values):
        import numpy as np
        rows = np.array(self.rows, np.float64)
        rows[self.context.rank] = values
        return rows


def _context(rank, workers=2):
    from harness.distribute.context import Backend, WorkerContext
    return WorkerContext(rank, workers, 0, 1, "worker", rank, Backend.MULTI_WORKER)


def test_workers_that_resume_from_other_steps_are_named():
    from harness.distribute.backend import check_same_step
    check_same_step(_Gathered(_context(0), [[16], [16]]), 16)
    with pytest.raises(ClusterConfigError, match=r"\(worker 0 at step 16, worker 1 at step 0\)"):
        check_same_step(_Gathered(_context(1), [[16], [16]]), 0)


def test_ranks_whose_weights_differ_are_named():
    from harness.distribute.backend import check_same_weights
    a, b = "ab" * 32, "cd" * 32
    check_same_weights(_Gathered(_context(1), [[int(a[:12], 16)], [0]]), a)
    with pytest.raises(ClusterConfigError, match=r"rank\(s\) \[1\] differ from rank 0"):
        check_same_weights(_Gathered(_context(1), [[int(a[:12], 16)], [0]]), b)


def test_an_unreadable_backup_is_named_and_horovod_ranks_that_read_none_are_not_compared():
    from harness.distribute.backend import check_same_step
    with pytest.raises(ClusterConfigError, match=r"\(worker 0: unreadable backup, worker 1 at step 16\)"):
        check_same_step(_Gathered(_context(1), [[-1], [16]]), 16)
    check_same_step(_Gathered(_context(0), [[16], [-2]]), 16)  # Horovod: rank 1 gets rank 0's state by broadcast


def test_mpirun_with_the_tf_backend_is_refused_on_every_rank(tmp_path):
    """Real `mpirun -np 2 harness train` without --backend horovod: each rank would train its own copy as chief.
    Both ranks refuse at once, exit 2, naming the launcher and both ways out (issue 11, item 2)."""
    import os
    import subprocess
    import sys

    from harness.data.export import synth

    synth.write_table_export(str(tmp_path / "d"), prefix="t", shards=2, records=64, seed=0)
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    # mpirun kills every other rank as soon as one exits non-zero: on loaded cores rank 1 was killed before it got to
    # its own refusal. Each rank's refusal and exit status is what is tested, so each is let end on its own and
    # says its status (mpirun itself then exits 0).
    train = [sys.executable, "-m", "harness.cli", "train", "--data", str(tmp_path / "d"), "--output",
             str(tmp_path / "out")]
    cmd = ["mpirun", *root, "-mca", "orte_abort_on_non_zero_status", "0", "-np", "2", "sh", "-c",
           '"$@"; echo "rank $OMPI_COMM_WORLD_RANK exit $?"', "sh", *train]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    text = r.stdout + r.stderr
    for rank in (0, 1):
        assert f"rank {rank} exit 2" in text, text[-3000:]
        assert f"this process is rank {rank} of 2 started by openmpi" in text, text[-3000:]
    assert "--backend horovod" in text and "Traceback" not in text and not (tmp_path / "out").exists()


def test_single_device_runs_under_the_default_strategy():
    """One device, one worker: TensorFlow's default strategy (as Keras fit), whose datasets stay plain tf.data
    ones and whose steps pay no distributed-values layer; everything the loop and `bench train` ask of a strategy
    still answers."""
    import tensorflow as tf

    from harness.train.loop.synthetic import Shapes, synthetic_batches
    from harness.distribute.strategy import replica_devices, strategy_name

    backend = make_backend("tf", strategy="single")
    strategy = backend.strategy
    assert strategy is tf.distribute.get_strategy() and strategy_name(strategy) == "default strategy"
    assert strategy.num_replicas_in_sync == backend.context.replicas_in_sync == 1
    assert backend.context.backend.value == "single"
    assert replica_devices(strategy) == (("/gpu:0",) if tf.config.list_logical_devices("GPU") else ("/cpu:0",))
    ds = backend.distribute(lambda ctx: tf.data.Dataset.range(6).batch(2))
    assert isinstance(ds, tf.data.Dataset) and [b.numpy().tolist() for b in ds] == [[0, 1], [2, 3], [4, 5]]
    assert float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.5)), axis=None)) == 2.5
    x, y = next(synthetic_batches(strategy, Shapes("image", (4, 4, 3), 5), per_replica_batch=2))
    assert x.shape == (2, 4, 4, 3) and y.shape == (2, 4, 4) and int(tf.reduce_max(y)) < 5


def test_single_inside_another_strategys_scope_is_refused(mirrored):
    from harness.distribute.strategy import make_strategy

    with mirrored[0].scope(), pytest.raises(ClusterConfigError, match="inside the scope of MirroredStrategy"):
        make_strategy("single")
