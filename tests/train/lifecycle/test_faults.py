"""harness.train.lifecycle.faults: the order in which an error out of the loop is named (storage, a lost peer, a
repeated fault, else raised as it is), on TensorFlow's own error types; the real faults are
tests/data/export/test_gcs_bucket.py (storage), tests/distribute/test_peer_faults.py and tests/launch/test_fault_tolerance.py
(peers, repeats)."""
import json

import tensorflow as tf

from harness.distribute import environment
from harness.distribute.context import Backend, WorkerContext
from harness.errors import PeerLostError, RepeatedFaultError, StorageError
from harness.train.lifecycle import faults, peers, repeats

# TensorFlow's Cloud Storage file system after its retries (tsl/platform/retrying_utils.cc), as an AbortedError: a type
# a lost peer's errors share
GAVE_UP = ("All 10 retry attempts failed. The last failure: Error executing an HTTP request: HTTP response code 429 "
           "when reading gs://bucket/export/x-00003.tfrecord.gz")
RESET = ("Collective ops is aborted by: Connection reset by peer\nAdditional GRPC error information from remote "
         "target /job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf")


class Backup:
    saved_step = 32

    def __init__(self, folder):
        self.chief_dir = str(folder)


class Optimizer:   # `iterations` read after the failed call
    @property
    def iterations(self):   # made when read: a TensorFlow op at import would start the runtime of every pytest
        return tf.constant(41, tf.int64)   # worker at collection (the in-process TF_CONFIG tests need it unstarted)


def _two_workers(me=0):
    config = environment.read_tf_config({"TF_CONFIG": json.dumps(
        {"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, "task": {"type": "worker", "index": me}})})
    return peers.Cluster.from_tf_config(config), WorkerContext(
        rank=me, num_workers=2, local_rank=0, replicas_per_worker=1, task_type="worker", task_index=me,
        backend=Backend.MULTI_WORKER)


def _translate(error, cluster, context, backup, last_fault=None, initial_step=0):
    return faults.translate(error, cluster=cluster, step=40, backup=backup, context=context, optimizer=Optimizer(),
                            last_fault=last_fault, initial_step=initial_step)


def test_storage_first_then_a_lost_peer_then_a_repeat_else_as_it_is(tmp_path):
    cluster, context = _two_workers()
    backup = Backup(tmp_path)
    # Cloud Storage giving up raises a lost peer's type: named for the object, on any number of workers
    stored = _translate(tf.errors.AbortedError(None, None, GAVE_UP), cluster, context, backup)
    assert isinstance(stored, StorageError), stored
    assert str(stored).startswith("Cloud Storage failed on gs://bucket/export/x-00003.tfrecord.gz (AbortedError on "
                                  "worker 0 on 10.0.0.1 after step 40")
    one = WorkerContext.single()
    assert isinstance(_translate(tf.errors.AbortedError(None, None, GAVE_UP), None, one, backup), StorageError)
    # a lost peer: on several workers only; the chief records it beside the backup for the next attempt
    lost = _translate(tf.errors.UnavailableError(None, None, RESET), cluster, context, backup)
    assert isinstance(lost, PeerLostError) and str(lost).startswith("worker 1 on 10.0.0.2 is lost"), lost
    recorded = json.loads((tmp_path / "fault.json").read_text())
    assert recorded == {"step": 41, "cause": str(lost)}   # the optimizer's count: the step inside the K-step call
    assert _translate(tf.errors.UnavailableError(None, None, RESET), None, one, backup) is None
    # the same fault after the same step as the last attempt, which resumed before it: permanent
    again = _translate(tf.errors.UnavailableError(None, None, RESET), cluster, context, backup,
                       last_fault=recorded, initial_step=32)
    assert isinstance(again, RepeatedFaultError) and "the same fault after step 41" in str(again), again
    assert repeats.previous(backup) == recorded and not list(tmp_path.glob("*.tmp"))   # written whole
    repeats.clear(backup, _two_workers(me=1)[1])   # not the chief: it keeps the record
    assert repeats.previous(backup) == recorded
    repeats.clear(backup, context)
    assert repeats.previous(backup) is None and not (tmp_path / "fault.json").exists()
    # anything else (the user's code, a bug) is raised as it is
    assert _translate(ValueError("unavailable"), cluster, context, backup) is None
    assert _translate(tf.errors.InvalidArgumentError(None, None, "bad shape"), cluster, context, backup) is None
