"""Batch arithmetic: global vs per-replica batch, steps per epoch, records dropped per worker.

The one place these numbers are derived. Conventions follow tf.distribute
(https://www.tensorflow.org/tutorials/distribute/input): the global batch is split evenly across the replicas in
sync, `global = per-replica x replicas in sync`; each worker's input pipeline feeds its local replicas, so it
consumes `per-replica x replicas per worker` records per step (the per-worker batch).

Training batches with `drop_remainder=True`, so every step has full batches and every replica sees the same
shapes. All workers must run the same number of steps (a collective all-reduce waits for every replica), so the
steps per epoch are set by the worker with the fewest records; the rest of each worker's records are dropped.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from harness.errors import BatchSizeError, ClusterConfigError


@dataclasses.dataclass(frozen=True)
class BatchSizes:
    """Per-replica and global batch of one job, in records.

    Attributes:
      per_replica_batch_size: records per replica per step.
      workers: number of workers (one input pipeline each).
      replicas_per_worker: local replicas (devices) per worker.
    """

    per_replica_batch_size: int
    workers: int
    replicas_per_worker: int

    @property
    def replicas_in_sync(self) -> int:
        return self.workers * self.replicas_per_worker

    @property
    def global_batch_size(self) -> int:
        """Records per step over all replicas."""
        return self.per_replica_batch_size * self.replicas_in_sync

    @property
    def per_worker_batch_size(self) -> int:
        """Records one worker's input pipeline delivers per step."""
        return self.per_replica_batch_size * self.replicas_per_worker


def batch_sizes(*, workers: int, replicas_per_worker: int, global_batch_size: Optional[int] = None,
                per_replica_batch_size: Optional[int] = None) -> BatchSizes:
    """Derive the batch sizes from exactly one of `global_batch_size` and `per_replica_batch_size`.

    Raises:
      BatchSizeError: if neither or both batch sizes are given, one is < 1, or `global_batch_size` is not a
        multiple of the replicas in sync (`workers x replicas_per_worker`).
      ClusterConfigError: if `workers` or `replicas_per_worker` is < 1.
    """
    if workers < 1 or replicas_per_worker < 1:
        raise ClusterConfigError(f"workers ({workers}) and replicas_per_worker ({replicas_per_worker}) must be >= 1")
    if (global_batch_size is None) == (per_replica_batch_size is None):
        raise BatchSizeError("give exactly one of the global batch size and the per-replica batch size")
    replicas = workers * replicas_per_worker
    if per_replica_batch_size is None:
        if global_batch_size < 1:
            raise BatchSizeError(f"global batch size must be >= 1, got {global_batch_size}")
        if global_batch_size % replicas:
            raise BatchSizeError(
                f"global batch size {global_batch_size} is not divisible by the {replicas} replicas in sync "
                f"({workers} workers x {replicas_per_worker} replicas per worker)")
        per_replica_batch_size = global_batch_size // replicas
    elif per_replica_batch_size < 1:
        raise BatchSizeError(f"per-replica batch size must be >= 1, got {per_replica_batch_size}")
    return BatchSizes(per_replica_batch_size, workers, replicas_per_worker)


def steps_per_epoch(records_per_worker: Sequence[int], batch: BatchSizes) -> int:
    """Full steps every worker can run in one epoch: min over workers of `records_w // per-worker batch`.

    Args:
      records_per_worker: records each worker's input pipeline reads per epoch, indexed by rank.

    Raises:
      BatchSizeError: if that is zero; the message names the worker with the fewest records.
      ClusterConfigError: if `records_per_worker` does not have one entry per worker.
    """
    if len(records_per_worker) != batch.workers:
        raise ClusterConfigError(f"{len(records_per_worker)} record counts for {batch.workers} workers")
    fewest = min(range(batch.workers), key=lambda w: records_per_worker[w])
    steps = records_per_worker[fewest] // batch.per_worker_batch_size
    if steps == 0:
        raise BatchSizeError(
            f"zero steps per epoch: worker {fewest} reads {records_per_worker[fewest]} records < per-worker batch "
            f"{batch.per_worker_batch_size} (per-replica batch {batch.per_replica_batch_size} x "
            f"{batch.replicas_per_worker} replicas per worker); use a smaller batch or fewer workers")
    return steps


def dropped_records(records_per_worker: Sequence[int], steps: int, batch: BatchSizes) -> tuple[int, ...]:
    """Records each worker reads but does not train on per epoch: `records_w - steps x per-worker batch`."""
    return tuple(r - steps * batch.per_worker_batch_size for r in records_per_worker)
