"""A failed training call, named once: the one place an exception out of the training loop becomes the harness's
fault line (`harness.errors.ClusterFault` or `RepeatedFaultError`), the checks in this order:

1. storage (`storage.storage_fault`): TensorFlow's Cloud Storage file system giving up on an object after its own
   retries raises the error types a lost peer's share (AbortedError, UnavailableError), so it is checked first, on
   any number of workers; its line names the object (retryable).
2. a lost peer (`peers.peer_lost`), on several workers only: the worker or rank and its host.
3. repeated (`repeats.judge`): a lost peer after the same step as the last attempt's, or protobuf's 2 GB limit in
   its text, is no peer's and exits permanent; the chief records the fault beside the backup for the next attempt.

Anything else is not translated (`None`: raised as it is: the user's code, a bug). A fault without an error (a
stuck peer, a tf.data service that sends nothing) is the step-progress watchdog's (`watchdog.stalled`); bad input
met mid-run is the input's (`harness.train.inputs.named_error`); a preemption is `preemption`'s. A new fault kind
that comes as an exception out of the loop is one more check here.
"""
from __future__ import annotations

from typing import Optional

from harness.errors import HarnessError
from harness.train.lifecycle import peers, repeats, storage


def translate(error: BaseException, *, cluster: Optional[peers.Cluster], step: int, backup, context, optimizer,
              last_fault: Optional[dict], initial_step: int = 0) -> Optional[HarnessError]:
    """The harness error for `error`, raised out of the training loop after global step `step` (the last step the
    controller saw complete), or None when it is none of the faults above.

    Args:
      cluster: the workers and their hosts (`peers.Cluster.gather`), None where not gathered.
      backup: the run's `harness.train.lifecycle.backup.Backup` (what a re-run resumes from; where the chief records
        a lost peer for the next attempt).
      context: this worker's `harness.distribute.context.WorkerContext` (`num_workers`, `is_chief`).
      optimizer: the run's optimizer: `iterations` is the step inside a K-step call at which the fault came.
      last_fault: the last attempt's recorded fault (`repeats.previous`), or None.
      initial_step: the global step this attempt resumed at.
    """
    stored = storage.storage_fault(error, cluster, step, backup)
    if stored is not None:
        return stored
    if context.num_workers < 2 or cluster is None:
        return None
    lost = peers.peer_lost(error, cluster, step, backup)
    if lost is None:
        return None
    return repeats.judge(lost, error, repeats.completed_step(optimizer, step), last_fault, backup, context,
                         initial_step=initial_step)
