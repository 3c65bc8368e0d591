"""The lost peer's line from TensorFlow's and Horovod's error texts (harness.train.lifecycle.peers) and the step-progress
watchdog (harness.train.lifecycle.watchdog), on their own; the real faults are tests/distribute/test_peer_faults.py (one host)
and tests/cluster/test_faults.py (the bed)."""
import threading
import time

import pytest
import tensorflow as tf

from harness.distribute import environment
from harness.errors import NonFiniteLossError
from harness.train.lifecycle import peers, watchdog

pytestmark = pytest.mark.waits("the watchdog's bounds: seconds of wall, almost no CPU")

# As TensorFlow 2.18 words them (seen on the bed: a peer killed, a peer's link down)
KILLED = ("Graph execution error:\n\nCollective ops is aborted by: Connection reset by peer\nAdditional GRPC error "
          "information from remote target /job:worker/replica:0/task:2 while calling "
          '/tensorflow.WorkerService/RecvBuf:\n:{"grpc_message":"Connection reset by peer","grpc_status":14}')
HEARTBEAT = ("Collective ops is aborted by: Error reported from /job:worker/task:1: Task /job:worker/replica:0/task:1 "
             "heartbeat timeout. This indicates that the remote task has failed, got preempted, or crashed.")


class Backup:
    chief_dir, saved_step = "/out/backup", 32


def _cluster(n=3, me=0):
    config = environment.read_tf_config({"TF_CONFIG": (
        '{"cluster": {"worker": [%s]}, "task": {"type": "worker", "index": %d}}'
        % (", ".join(f'"10.0.0.{i + 1}:2222"' for i in range(n)), me))})
    return peers.Cluster.from_tf_config(config)


def test_the_task_named_in_the_error_is_the_lost_worker_with_its_host():
    lost = peers.peer_lost(tf.errors.UnavailableError(None, None, KILLED), _cluster(), 40, Backup())
    assert str(lost) == ("worker 2 on 10.0.0.3 is lost (UnavailableError on worker 0 on 10.0.0.1 after step 40: "
                         "Connection reset by peer); a re-run resumes from /out/backup at step 32")
    lost = peers.peer_lost(tf.errors.UnavailableError(None, None, HEARTBEAT), _cluster(me=2), 7, None)
    assert str(lost) == ("worker 1 on 10.0.0.2 is lost (UnavailableError on worker 2 on 10.0.0.3 after step 7: "
                         "Collective ops is aborted by: Error reported from /job:worker/task:1: Task "
                         "/job:worker/replica:0/task:1 heartbeat timeout); no backup written yet: a re-run starts "
                         "at step 0")


def test_an_error_naming_no_task_names_the_one_peer_or_lists_the_peers():
    timeout = tf.errors.DeadlineExceededError(None, None, "Collective ops is aborted by: Deadline Exceeded")
    assert str(peers.peer_lost(timeout, _cluster(2, me=1), 20, Backup())).startswith(
        "worker 0 on 10.0.0.1 is lost (DeadlineExceededError on worker 1 on 10.0.0.2 after step 20: Collective ops")
    assert str(peers.peer_lost(timeout, _cluster(3), 20, Backup())).startswith(
        "a peer (worker 1 on 10.0.0.2, worker 2 on 10.0.0.3) is lost (DeadlineExceededError")


def test_other_errors_are_not_a_lost_peer():
    assert peers.peer_lost(tf.errors.InvalidArgumentError(None, None, "bad shape"), _cluster(), 3, None) is None
    assert peers.peer_lost(ValueError("unavailable"), _cluster(), 3, None) is None
    assert peers.peer_lost(NonFiniteLossError("loss is nan; heartbeat"), _cluster(), 3, None) is None
    # Horovod's shutdown, raised by its ops as an UnknownError
    assert peers.peer_lost(tf.errors.UnknownError(None, None, "Horovod has been shut down. This was caused by an "
                                                               "exception on one of the ranks"), _cluster(2), 3, None)


def test_horovods_shutdown_under_its_stall_inspector_says_a_rank_may_have_stalled(monkeypatch):
    shutdown = tf.errors.UnknownError(None, None, "Horovod has been shut down. This was caused by an exception")
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "2")
    assert str(peers.peer_lost(shutdown, _cluster(2), 3, Backup())) == (
        "worker 1 on 10.0.0.2 is lost, or stalled: HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2 has Horovod's stall "
        "inspector end the job when a rank waits longer than 2 s in a collective (the late ranks are marked \"!\" in "
        "Horovod's lines above) (UnknownError on worker 0 on 10.0.0.1 after step 3: Horovod has been shut down); a "
        "re-run resumes from /out/backup at step 32")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_DISABLE", "1")
    assert "stalled" not in str(peers.peer_lost(shutdown, _cluster(2), 3, Backup()))
    monkeypatch.setenv("HOROVOD_STALL_CHECK_DISABLE", "0")
    reset = tf.errors.UnavailableError(None, None, "Connection reset by peer")
    assert "stalled" not in str(peers.peer_lost(reset, _cluster(2), 3, Backup()))


def test_watchdog_ends_the_run_past_the_bound_and_not_while_idle_or_beaten():
    exits, fired = [], threading.Event()

    def exit(code):
        exits.append(code)
        fired.set()

    dog = watchdog.Watchdog(watchdog.stalled(_cluster(2), Backup(), 0.6), bound_s=0.6, exit=exit, poll_s=0.05)
    try:
        time.sleep(1.0)
        assert not exits   # not armed before the first beat (the first call traces)
        for step in range(1, 6):
            dog.beat(step)
            time.sleep(0.2)
        dog.idle()
        time.sleep(1.0)
        assert not exits   # idle over the epoch-end work
        dog.beat(9)
        t0 = time.monotonic()
        assert fired.wait(5)
        assert 0.6 <= time.monotonic() - t0 < 1.5 and exits == [138]
    finally:
        dog.close()


def test_watchdog_line(capsys):
    dog = watchdog.Watchdog(watchdog.stalled(_cluster(2), Backup(), 0.3), bound_s=0.3, exit=lambda code: None,
                            poll_s=0.05)
    dog.beat(21)
    time.sleep(0.8)
    dog.close()
    line = capsys.readouterr().err.strip()
    assert line.startswith("harness train: StalledWorkerError: no step progress on worker 0 on 10.0.0.1 for 0 s "
                           "after step 21: a peer is lost or stuck, or this worker's own step or input is (peers: "
                           "worker 1 on 10.0.0.2); a re-run resumes from /out/backup at step 32; "
                           "HARNESS_PEER_TIMEOUT_S=0.3 sets the bound"), line
    assert len(line.splitlines()) == 1


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_peer_timeout_is_a_positive_number(value):
    from harness.errors import ClusterConfigError

    assert environment.read_peer_timeout_s({}) == 60
    assert environment.read_peer_timeout_s({"HARNESS_PEER_TIMEOUT_S": "15"}) == 15
    with pytest.raises(ClusterConfigError, match="HARNESS_PEER_TIMEOUT_S"):
        environment.read_peer_timeout_s({"HARNESS_PEER_TIMEOUT_S": value})


def test_gloo_timeout_is_the_worker_wait_where_unset():
    from harness.distribute import horovod

    env = {}
    assert horovod.gloo_timeout(env) == 120 and env == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "120"}
    env = {"HARNESS_WORKER_WAIT_S": "44.5"}
    assert horovod.gloo_timeout(env) == 45
    env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "300", "HARNESS_WORKER_WAIT_S": "10"}
    assert horovod.gloo_timeout(env) == 300   # the user's own Gloo timeout is kept


def test_watchdog_allows_the_longest_call_seen_beyond_the_bound():
    """On a clock the test moves (the thread never polls: `check` is called here), so load cannot move a bound."""
    now = [0.0]
    exits = []

    def dog():
        return watchdog.Watchdog(lambda step, s: "", bound_s=0.5, exit=exits.append, poll_s=3600,
                                 clock=lambda: now[0])
    first = dog()
    try:
        first.beat(1)
        first.beat(2)
        now[0] += 0.5
        assert not first.check()   # at the bound, not past it
        now[0] += 0.01   # two beats at once: no call's length measured, so the bare 0.5 s bound holds
        assert first.check() and exits == [138]
    finally:
        first.close()
    exits.clear()
    second = dog()
    try:
        second.beat(1)
        now[0] += 0.5
        second.beat(2)        # calls of 0.5 s (K slow steps): the bound counts from 0.5 s past the last beat
        now[0] += 0.99        # under 0.5 + 0.5 since the last beat
        assert not second.check() and exits == []
        now[0] += 0.02
        assert second.check() and exits == [138]
        second.idle()         # disarmed over the epoch's end: no bound
        now[0] += 100
        assert not second.check()
    finally:
        second.close()


def _progress(drawn: int, finished: int, in_call: bool = True):
    from harness.train.loop.trainer import StepProgress
    progress = StepProgress()
    progress.in_call = in_call
    progress.drawn.assign(drawn)
    progress.finished.assign(finished)
    return progress


def _line(progress, cluster, capsys) -> str:
    dog = watchdog.Watchdog(watchdog.stalled(cluster, Backup(), 0.3, progress), bound_s=0.3, exit=lambda code: None,
                            poll_s=0.05)
    dog.beat(21)
    time.sleep(0.8)
    dog.close()
    return capsys.readouterr().err.strip()


def test_a_worker_waiting_for_its_own_input_names_itself_the_stuck_one(capsys):
    line = _line(_progress(drawn=21, finished=21), _cluster(2, me=1), capsys)
    assert line == ("harness train: StalledWorkerError: worker 1 on 10.0.0.2 has waited 0 s for the batch after step "
                    "21: its own input is stuck, unless a collective before the step waits for a peer (peers: worker "
                    "0 on 10.0.0.1); a re-run resumes from /out/backup at step 32; HARNESS_PEER_TIMEOUT_S=0.3 sets "
                    "the bound"), line


def test_a_worker_that_has_its_batch_names_the_peer_it_waits_for(capsys):
    line = _line(_progress(drawn=22, finished=21), _cluster(2, me=0), capsys)
    assert line == ("harness train: StalledWorkerError: no step progress on worker 0 on 10.0.0.1 for 0 s after step "
                    "21: it has its batch and waits in the step's all-reduce for a peer that is lost or stuck: worker "
                    "1 on 10.0.0.2; a re-run resumes from /out/backup at step 32; HARNESS_PEER_TIMEOUT_S=0.3 sets "
                    "the bound"), line
    between = _line(_progress(drawn=21, finished=21, in_call=False), _cluster(2, me=0), capsys)
    assert ("no step progress on worker 0 on 10.0.0.1 for 0 s after step 21: it waits in a collective between calls "
            "for a peer that is lost or stuck: worker 1 on 10.0.0.2;") in between, between   # not "stuck" itself
    many = _line(_progress(drawn=22, finished=21), _cluster(3, me=0), capsys)
    assert "lost or stuck: worker 1 on 10.0.0.2, worker 2 on 10.0.0.3 (the stuck one names itself in its own log)" \
        in many, many


def test_the_k_step_loop_counts_batches_drawn_and_steps_finished():
    """The counters the watchdog reads: after a call of K steps both equal K (two workers' trainers have them;
    one worker's trainer has none)."""
    import tf_keras as keras

    from harness.distribute.backend import TrainingBackend
    from harness.distribute.batch import batch_sizes
    from harness.distribute.context import Backend, WorkerContext
    from harness.train.loop import factory
    from harness.train.loop.controller import Schedule

    SCHEDULE = Schedule(epochs=1, steps_per_epoch=5)

    strategy = tf.distribute.get_strategy()
    model = keras.Sequential([keras.layers.Dense(3, input_shape=(2,))])
    batch = batch_sizes(workers=1, replicas_per_worker=1, global_batch_size=4)
    one = factory.build_run(TrainingBackend(strategy, WorkerContext.single()), model, keras.optimizers.SGD(0.1),
                            batch, SCHEDULE).trainer
    assert one.progress is None
    # a worker of two (the counters do not depend on the collectives, which the default strategy has none of)
    two = TrainingBackend(strategy, WorkerContext(0, 2, 0, 1, "worker", 0, Backend.MULTI_WORKER))
    trainer = factory.build_run(two, model, keras.optimizers.SGD(0.1), batch, SCHEDULE).trainer
    data = tf.data.Dataset.from_tensors((tf.ones([4, 2]), tf.zeros([4], tf.int32))).repeat()
    it = iter(data)
    trainer.run_loop(it, 5)
    assert (int(trainer.progress.drawn.numpy()), int(trainer.progress.finished.numpy())) == (5, 5)
    assert not trainer.progress.in_call and not trainer.progress.waiting_for_input()   # between calls
    trainer.run_loop(it, 3)
    assert (int(trainer.progress.drawn.numpy()), int(trainer.progress.finished.numpy())) == (8, 8)


@pytest.mark.parametrize("drawn, me, lingers", [(21, 1, True), (22, 0, False)])
def test_only_the_worker_whose_own_input_is_stuck_lingers_before_its_exit(drawn, me, lingers, capsys):
    """The cause lingers a quarter of the bound (at most LINGER_S) between its line and its exit, so that its
    peers, whose bounds end at about the same time, name it as stuck before its exit closes their sockets (on the
    bed, under load, the stuck worker's exit turned its peer's line into a lost-peer error); the peer waiting in
    the all-reduce exits at once."""
    bound = 0.8
    describe = watchdog.stalled(_cluster(2, me=me), Backup(), bound, _progress(drawn=drawn, finished=21))
    exits, described = [], []

    def timed(step, seconds):       # the line is written right after its description
        described.append(time.monotonic())
        return describe(step, seconds)

    dog = watchdog.Watchdog(timed, bound_s=bound, exit=lambda code: exits.append(time.monotonic()), poll_s=0.02,
                            linger_s=describe.linger_s)
    deadline = time.monotonic() + 10
    try:
        dog.beat(21)
        while not exits:
            time.sleep(0.01)
            assert time.monotonic() < deadline, "the watchdog never exited"
    finally:
        dog.close()
    assert "StalledWorkerError" in capsys.readouterr().err
    waited = exits[0] - described[0]
    if lingers:
        assert describe.linger_s() == bound / 4 and waited >= bound / 4 - 0.03, waited
    else:
        assert describe.linger_s() == 0.0 and waited < bound / 4, waited
