"""A fault that comes back at the same step is not a lost peer: it is named as what it is and exits permanent.

Kubernetes' operators restart a pod that exits 138 (`harness.exit_codes.RETRYABLE`) without end. Some failures
look like a lost peer and fail the same way at the same step on every attempt: a collective whose message passes
protobuf's 2 GB limit fails on the sender with "RecvBufRespExtra exceeded maximum protobuf size of 2GB" and on the
others with "... is down, aborting collectives: Deadline Exceeded" (tensorflow/recommenders#274); a user's op that
kills its process at one batch; a worker whose host runs out of memory at the same step. The chief writes the
step and the cause of a lost peer beside the backup (`fault.json`); a run that resumed from that backup and loses
a peer after the same step again raises `RepeatedFaultError` (permanent) naming both causes. The protobuf limit's
own text is permanent at once.
"""
from __future__ import annotations

from typing import Optional

from harness.errors import PeerLostError, RepeatedFaultError
from harness.train.lifecycle import beside_backup

FILE = "fault.json"
# Steps apart that count as the same: a worker ends a step's all-reduce or draws the next batch while its peer's
# fault lands, so the updates counted at a fault differ by one between attempts (seen: 20 and 21).
SAME_STEP = 1
PROTOBUF_LIMIT = "exceeded maximum protobuf size of 2GB"
REMEDY = ("a tensor of the model sent in one collective message passes protobuf's 2 GB limit: a smaller model "
          "layer or batch, or an all-reduce that does not go through gRPC messages (NCCL on GPUs, or --backend "
          "horovod)")


def _path(backup) -> Optional[str]:
    return beside_backup.path(backup, FILE)


def previous(backup) -> Optional[dict]:
    """The fault the last attempt recorded beside this run's backup (`{"step", "cause"}`), or None. Read before
    training: a run compares a new fault with its predecessor's, never with its own."""
    found = beside_backup.read(_path(backup))
    return found if found and isinstance(found.get("step"), int) else None


def completed_step(optimizer, reported: int) -> int:
    """The updates this replica completed (`optimizer.iterations`, read after the failed call: the step inside a
    K-step call at which the fault came), else the last step the controller saw complete."""
    try:
        return max(int(optimizer.iterations.numpy()), reported)
    except Exception:   # a runtime left unusable by the fault: the coarser count
        return reported


def judge(lost: PeerLostError, error: BaseException, step: int, before: Optional[dict], backup, context, *,
          initial_step: int = 0):
    """The error to raise for a lost peer `lost` (from TensorFlow's or Horovod's `error`) after step `step`:
    `RepeatedFaultError` when the text is protobuf's limit, or when `before` (the last attempt's fault) was after
    the same step (within SAME_STEP), which this attempt (resumed at `initial_step`) reached again; else `lost`. The step is the last
    one the controller saw complete (a K-step call's end). The chief records this fault for the next attempt."""
    text = str(error)
    if context.is_chief:
        beside_backup.write(_path(backup), {"step": step, "cause": str(lost)})
    if PROTOBUF_LIMIT in text:
        return RepeatedFaultError(f"{lost}; not a lost peer, and a retry fails the same way: {REMEDY}")
    if before is not None and abs(before["step"] - step) <= SAME_STEP and step >= initial_step:
        return RepeatedFaultError(
            f"the same fault after step {step} as in the last attempt (after step {before['step']}), which resumed "
            "from the backup before it: "
            f"not a lost peer, and a retry fails the same way (a message over a size limit, an op or a batch that "
            f"kills a worker, a host out of memory at that step); now: {lost}; the last attempt: "
            f"{before.get('cause', '?')}")
    return lost


def clear(backup, context) -> None:
    """Forget the last attempt's fault (the chief, once a run ends well)."""
    beside_backup.remove(_path(backup), context)
