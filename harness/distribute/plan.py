"""The epoch plan: which files and how many records each worker reads, batch sizes, steps, dropped records.

`make_plan` is pure arithmetic over record counts (no TensorFlow): it applies the same sharding policy
(`harness.distribute.sharding.assign_files`) and batch arithmetic (`harness.distribute.batch`) as training, so
`harness plan` predicts exactly what a run will do before any machine is started.
"""
from __future__ import annotations

import dataclasses
import posixpath
import shlex
from typing import Optional, Sequence

from harness.distribute import batch as batch_math
from harness.distribute.sharding import ShardAssignment, assign_nonempty
from harness.errors import BatchSizeError, ConfigError

# Above this share of the records read per epoch, dropped records are warned about (plan and train).
DROPPED_WARN_SHARE = 0.05


@dataclasses.dataclass(frozen=True)
class Plan:
    """One epoch of a job, per worker (indexed by rank).

    Attributes:
      assignments: each worker's `ShardAssignment` (files in shard order, zero-record files skipped, and the
        policy): what its input pipeline reads (`harness.data.input.pipeline.build_dataset(assignment=...)`).
      records: records each worker's input pipeline reads per epoch.
      policy: sharding policy, `"file"` or `"record"` (see `harness.distribute.sharding`).
      batch: per-replica batch, workers and replicas per worker (global and per-worker batch derive from it).
      steps_per_epoch: steps every worker runs (the same on all workers).
      dropped: records each worker reads but drops per epoch (`drop_remainder=True`, equal steps).
    """

    assignments: tuple[ShardAssignment, ...]
    records: tuple[int, ...]
    policy: str
    batch: batch_math.BatchSizes
    steps_per_epoch: int
    dropped: tuple[int, ...]

    @property
    def files(self) -> tuple[tuple[str, ...], ...]:
        """The files each worker opens, in shard order."""
        return tuple(a.files for a in self.assignments)

    @property
    def per_replica_batch_size(self) -> int:
        return self.batch.per_replica_batch_size

    @property
    def global_batch_size(self) -> int:
        return self.batch.global_batch_size

    @property
    def per_worker_batch_size(self) -> int:
        return self.batch.per_worker_batch_size

    @property
    def records_kept_per_worker(self) -> int:
        """Records each worker keeps (trains on) per epoch, the same on every worker: steps_per_epoch x
        per-worker batch (the rest of its `records` are read and dropped); what its input pipeline keeps
        (`PipelineOptions.records_per_epoch`)."""
        return self.steps_per_epoch * self.per_worker_batch_size

    @property
    def dropped_share(self) -> float:
        """Records read and dropped per epoch / records read per epoch, over all workers."""
        return sum(self.dropped) / max(sum(self.records), 1)

    def waste_warning(self, sources: Sequence[str] = ()) -> Optional[str]:
        """A warning when more than DROPPED_WARN_SHARE of the records read each epoch are dropped, with the split
        and the fix; None otherwise. Uneven files (3 files over 2 workers) are the usual cause: every worker runs
        the steps of the worker with the fewest records.

        Args:
          sources: the data as given (folders, globs or paths): the fix is then the `harness reshard` command
            line to run, writing beside the first of them (`<source>-resharded`)."""
        if self.dropped_share <= DROPPED_WARN_SHARE:
            return None
        b = self.batch
        text = (f"warning: {sum(self.dropped)} of {sum(self.records)} records ({self.dropped_share:.0%}) are read "
                f"and dropped every epoch (records per worker: {'/'.join(map(str, self.records))}, files per worker: "
                f"{'/'.join(str(len(f)) for f in self.files)})")
        if max(self.records) - min(self.records) >= b.per_worker_batch_size:
            command = ["harness", "reshard", *(sources or ["DATA"]), "--output",
                       _resharded(sources[0]) if sources else "DIR", "--workers", str(b.workers)]
            return text + (f"; the workers' shares are uneven: rewrite the data into a multiple of {b.workers} "
                           f"equal shards: {shlex.join(command)}")
        return text + f"; a smaller batch than {b.global_batch_size} drops fewer"

    def to_dict(self) -> dict:
        """JSON-ready summary: job-wide numbers and one entry per worker."""
        return {
            "workers": self.batch.workers,
            "replicas_per_worker": self.batch.replicas_per_worker,
            "replicas_in_sync": self.batch.replicas_in_sync,
            "policy": self.policy,
            "per_replica_batch_size": self.per_replica_batch_size,
            "per_worker_batch_size": self.per_worker_batch_size,
            "global_batch_size": self.global_batch_size,
            "steps_per_epoch": self.steps_per_epoch,
            "records_per_epoch": sum(self.records),
            "dropped": sum(self.dropped),
            "dropped_share": self.dropped_share,
            "per_worker": [{"rank": w, "files": list(self.files[w]), "records": self.records[w],
                            "dropped": self.dropped[w]} for w in range(self.batch.workers)],
        }

    def format(self, sources: Sequence[str] = ()) -> str:
        """Plain-text table for people; `sources` as for `waste_warning`."""
        b = self.batch
        lines = [
            f"{b.workers} worker{'s' if b.workers > 1 else ''} x {b.replicas_per_worker} replicas per worker = "
            f"{b.replicas_in_sync} replicas in sync; "
            f"sharding by {self.policy}",
            f"batch: per-replica {b.per_replica_batch_size}, per-worker {b.per_worker_batch_size}, "
            f"global {b.global_batch_size}",
            f"steps per epoch: {self.steps_per_epoch} (drop_remainder=True, equal on all workers)",
            f"{'rank':>4}  {'files':>5}  {'records':>8}  {'dropped':>8}",
        ]
        lines += [f"{w:>4}  {len(self.files[w]):>5}  {self.records[w]:>8}  {self.dropped[w]:>8}"
                  for w in range(b.workers)]
        warning = self.waste_warning(sources)
        return "\n".join(lines + ([warning] if warning else []))


def _resharded(source: str) -> str:
    """Where `harness reshard` should write: beside the source folder (or the folder of a glob or file)."""
    path = source.rstrip("/")
    if any(c in path for c in "*?[") or path.endswith((".gz", ".tfrecord")) or ".tfrecord" in posixpath.basename(path):
        path = posixpath.dirname(path) or "."
    return f"{path}-resharded"


def make_plan(file_counts: Sequence[tuple[str, int]], *, workers: int, replicas_per_worker: int,
              global_batch_size: Optional[int] = None, per_replica_batch_size: Optional[int] = None,
              evaluation: bool = False) -> Plan:
    """Plan one epoch (`evaluation`: one pass of validation, every record once).

    Args:
      file_counts: `(path, records)` per file, in shard order (the order training reads them). Zero-record files
        are skipped, as the input pipeline skips them (`sharding.assign_nonempty`).
      workers: number of workers (input pipelines).
      replicas_per_worker: local replicas per worker.
      global_batch_size, per_replica_batch_size: exactly one.
      evaluation: plan a validation pass instead: every worker reads all its records, the last batch partial
        (`harness.train.loop.evaluator`); steps_per_epoch is the longest worker's batches, nothing is dropped and a set
        smaller than one batch is fine.

    Raises:
      BatchSizeError: as `harness.distribute.batch.batch_sizes`, if every file holds zero records, or if an epoch
        would have zero steps.
      ConfigError: if `file_counts` is empty, a count is negative, or one path has two different counts.
    """
    counts: dict[str, int] = {}
    for path, n in file_counts:
        if n < 0 or counts.get(path, n) != n:
            raise ConfigError(f"bad record count {n} for {path}")
        counts[path] = n
    batch = batch_math.batch_sizes(workers=workers, replicas_per_worker=replicas_per_worker,
                                   global_batch_size=global_batch_size,
                                   per_replica_batch_size=per_replica_batch_size)
    if not any(counts.values()):
        raise BatchSizeError(f"every file holds zero records ({len(counts)} files)")
    shares = [assign_nonempty(file_counts, workers, w, warn=False) for w in range(workers)]
    records = tuple(s.records(counts) for s in shares)
    if evaluation:
        steps = max(-(-r // batch.per_worker_batch_size) for r in records)
        return Plan(assignments=tuple(shares), records=records, policy=shares[0].policy, batch=batch,
                    steps_per_epoch=steps, dropped=(0,) * workers)
    steps = batch_math.steps_per_epoch(records, batch)
    return Plan(assignments=tuple(shares), records=records, policy=shares[0].policy, batch=batch,
                steps_per_epoch=steps, dropped=batch_math.dropped_records(records, steps, batch))

