"""Split an ordered file list between input pipelines (one per worker) so each record is read once per epoch.

Policy after TensorFlow Model Garden's `official/core/input_reader.py`: whole files per worker when there are at
least as many files as input pipelines, else every worker reads every file and keeps every n-th record (with a
warning: each worker then reads all the bytes).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

from harness.errors import ClusterConfigError, ShardDiscoveryError

log = logging.getLogger(__name__)

FILE = "file"
RECORD = "record"


@dataclasses.dataclass(frozen=True)
class ShardAssignment:
    """What one input pipeline reads.

    Attributes:
      files: paths this pipeline opens, in shard order.
      policy: `"file"` (whole files) or `"record"` (all files, then every `num_input_pipelines`-th record from
        `input_pipeline_id`).
      input_pipeline_id: this pipeline's index, 0-based.
      num_input_pipelines: number of input pipelines (usually workers).
    """

    files: tuple[str, ...]
    policy: str
    input_pipeline_id: int
    num_input_pipelines: int

    def records(self, counts: dict[str, int]) -> int:
        """Number of records this pipeline reads per epoch, given the record count of every file."""
        total = sum(counts[f] for f in self.files)
        if self.policy == FILE:
            return total
        # Record i of the concatenated stream goes to pipeline i % n.
        n, i = self.num_input_pipelines, self.input_pipeline_id
        return len(range(i, total, n))

    def describe(self) -> str:
        """One line for the log of whoever applies this assignment: the policy and this pipeline's share."""
        who = f"input pipeline {self.input_pipeline_id} of {self.num_input_pipelines}"
        if self.policy == FILE:
            return f"{who}: sharding by file, reads {len(self.files)} whole files"
        return (f"{who}: sharding by record, reads all {len(self.files)} files and keeps one record in "
                f"{self.num_input_pipelines}, from record {self.input_pipeline_id}")


def assign_files(files: Sequence[str], num_input_pipelines: int, input_pipeline_id: int, *,
                 warn: bool = True) -> ShardAssignment:
    """Choose the files (and the policy) for input pipeline `input_pipeline_id` of `num_input_pipelines`.

    Files go round-robin (`files[id::n]`, as `tf.data.Dataset.shard` on the file list) when
    `len(files) >= num_input_pipelines`; otherwise the record-level policy applies and a warning is logged.

    Raises:
      ShardDiscoveryError: if `files` is empty.
      ClusterConfigError: if `num_input_pipelines < 1`, or the id is out of range.
    """
    if num_input_pipelines < 1:
        raise ClusterConfigError(f"num_input_pipelines must be >= 1, got {num_input_pipelines}")
    if not 0 <= input_pipeline_id < num_input_pipelines:
        raise ClusterConfigError(f"input_pipeline_id {input_pipeline_id} out of range [0, {num_input_pipelines})")
    if not files:
        raise ShardDiscoveryError("no files to shard")
    if len(files) >= num_input_pipelines:
        return ShardAssignment(tuple(files[input_pipeline_id::num_input_pipelines]), FILE, input_pipeline_id,
                               num_input_pipelines)
    if warn:
        log.warning("%d files < %d input pipelines: sharding by record (every worker reads all files and keeps "
                    "every %d-th record). Reshard the data into a multiple of the workers to read each byte once.",
                    len(files), num_input_pipelines, num_input_pipelines)
    return ShardAssignment(tuple(files), RECORD, input_pipeline_id, num_input_pipelines)


def assign_nonempty(file_counts: Sequence[tuple[str, int]], num_input_pipelines: int, input_pipeline_id: int, *,
                    warn: bool = True) -> ShardAssignment:
    """`assign_files` over the files that hold at least one record, in order.

    Zero-record files (Earth Engine writes them) are skipped: under the file policy each would take a worker's
    turn and leave that worker short. The epoch plan and the input pipeline both split files this way, so the
    records the plan counts are the records the pipeline reads.

    Raises:
      ShardDiscoveryError, ClusterConfigError: as `assign_files` (every file holding zero records: no files).
    """
    return assign_files(files_with_records(file_counts), num_input_pipelines, input_pipeline_id, warn=warn)


def files_with_records(file_counts: Sequence[tuple[str, int]]) -> list[str]:
    """The paths of `(path, records)` pairs holding at least one record, in order: the files an epoch reads."""
    return [path for path, n in file_counts if n > 0]


def contiguous_runs(counts: Sequence[int], workers: int) -> list[range]:
    """Split shards (their record counts, in shard order) into `workers` contiguous runs of about equal records:
    what `harness predict` gives each worker, so that every worker's outputs keep the input's order and their
    sorted concatenation is the input order, whatever the number of workers.

    Shard i goes to the worker whose equal share of the records holds the shard's middle record, so the
    assignment is non-decreasing in i (runs are contiguous); a worker may get no shard (more workers than
    shards), and every shard goes to exactly one worker.

    Returns:
      one `range` of shard indices per worker (possibly empty), in worker order.
    Raises:
      ClusterConfigError: if `workers < 1`.
    """
    if workers < 1:
        raise ClusterConfigError(f"workers must be >= 1, got {workers}")
    total, before, owner = sum(counts), 0, []
    for n in counts:
        middle = before + n / 2
        owner.append(min(workers - 1, int(middle * workers // total)) if total else 0)
        before += n
    return [range(owner.index(w), len(owner) - owner[::-1].index(w)) if w in owner else range(0)
            for w in range(workers)]
