"""A storage fault, named: TensorFlow's Cloud Storage file system gives up after its own retries (10 by default,
`GCS_RETRY_CONFIG_MAX_RETRIES`) with "All 10 retry attempts failed. The last failure: ..." (tsl/platform/
retrying_utils.cc), raised as AbortedError or UnavailableError, types a lost peer's errors share. Seen on clusters
as HTTP 429 (per-project egress and per-object rate limits) and requests stuck at 0 bytes (tensorflow/datasets#4051).
It is the object and this worker's, not a peer's: one `StorageError` line naming the object, the worker, its host
and the step (retryable: the limits pass; a re-run resumes from the last backup).
"""
from __future__ import annotations

import re
import socket
from typing import Optional

from harness.errors import HarnessError, StorageError
from harness.train.lifecycle.peers import Cluster, resume_from

_RETRIES = re.compile(r"All \d+ retry attempts failed")
_OBJECT = re.compile(r"gs://[^\s'\",;)]+")
_TYPES = ("AbortedError", "UnavailableError", "DeadlineExceededError", "ResourceExhaustedError", "InternalError",
          "UnknownError", "NotFoundError", "PermissionDeniedError", "FailedPreconditionError")


def is_storage_fault(error: BaseException) -> bool:
    """Whether `error` is TensorFlow's Cloud Storage file system giving up on an object."""
    if isinstance(error, HarnessError):
        return False
    names = {c.__name__ for c in type(error).__mro__}
    text = str(error)
    return bool(names.intersection(_TYPES)) and bool(_RETRIES.search(text)) and \
        ("gs://" in text or "googleapis.com" in text or "GCS" in text)


def storage_fault(error: BaseException, cluster: Optional[Cluster], step: int, backup) -> Optional[StorageError]:
    """The `StorageError` for `error` raised after global step `step`, or None when it is not a storage fault.

    `Cloud Storage failed on gs://bucket/export/x-00003.tfrecord.gz (AbortedError on worker 0 on host-a after step
    40: All 10 retry attempts failed. The last failure: ... 429 ...); not a peer: a re-run resumes from ...`."""
    if not is_storage_fault(error):
        return None
    text = str(error)
    found = _OBJECT.search(text)
    where = cluster.describe(cluster.me) if cluster is not None else f"worker 0 on {socket.gethostname()}"
    last = text[_RETRIES.search(text).start():].splitlines()[0]
    last = last if len(last) <= 240 else last[:237] + "..."
    return StorageError(f"Cloud Storage failed on {found.group(0) if found else 'an object'} "
                        f"({type(error).__name__} on {where} after step {step}: {last}); not a peer: "
                        f"{resume_from(backup)}")
