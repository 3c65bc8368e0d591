"""Gather one JSON-able object per worker to the chief, over the job's own communication.

Non-chief workers never write report files: their part travels to the chief.
  - one worker (single, mirrored): nothing to gather;
  - tf.distribute MultiWorkerMirrored: the part is JSON-encoded, packed into int32 words and all-gathered through
    the strategy's collectives (`ReplicaContext.all_gather`), after an all-gather of the lengths to pad to;
  - Horovod: `mpi4py`'s `COMM_WORLD.gather` to rank 0 under MPI, else `hvd.allgather_object` (Gloo).
"""
from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

from harness.distribute.context import Backend, WorkerContext


def gather_to_chief(obj: Any, *, context: WorkerContext, strategy=None) -> Optional[list]:
    """Every worker calls this at the same point; returns the list of all workers' objects ordered by rank on the
    chief (and, for the all-gathers, on the others too), None where the transport gives the others nothing.

    Raises:
      ValueError: for MultiWorkerMirrored without `strategy`.
    """
    if context.num_workers == 1:
        return [obj]
    if context.backend is Backend.HOROVOD:
        return _gather_horovod(obj, context)
    if strategy is None:
        raise ValueError("gathering over tf.distribute needs the strategy")
    return _gather_collective(obj, strategy, context)


def _encode(obj: Any) -> np.ndarray:
    raw = json.dumps(obj, separators=(",", ":"), default=str).encode()
    raw += b" " * (-len(raw) % 4)  # whole int32 words; trailing spaces are valid JSON whitespace
    return np.frombuffer(raw, dtype="<i4")


def _decode(words: np.ndarray, length: int) -> Any:
    return json.loads(words[:length].astype("<i4").tobytes())


def _gather_collective(obj: Any, strategy, context: WorkerContext) -> list:
    import tensorflow as tf
    from harness.tracing import graph_function

    words = _encode(obj)

    def all_gather(value):
        def replica_fn():
            return tf.distribute.get_replica_context().all_gather(value, axis=0)
        out = graph_function(lambda: strategy.run(replica_fn))()
        return strategy.experimental_local_results(out)[0].numpy()

    lengths = all_gather(tf.constant([len(words)], tf.int32))
    longest = int(lengths.max())
    padded = np.zeros([1, longest], np.int32)
    padded[0, :len(words)] = words
    rows = all_gather(tf.constant(padded))
    # One row per replica in sync, replicas of worker r at r*R .. r*R+R-1; every local replica sent the same part.
    step = context.replicas_per_worker
    return [_decode(rows[i], int(lengths[i])) for i in range(0, len(rows), step)]


def _gather_horovod(obj: Any, context: WorkerContext) -> Optional[list]:
    try:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.Get_size() == context.num_workers:
            return comm.gather(obj, root=0)
    except ImportError:
        pass
    import horovod.tensorflow as hvd  # Gloo: no MPI world
    return list(hvd.allgather_object(obj))
