"""Plumber's model of the input pipeline, without TensorFlow: the measured stage rates (`StageRate`, `Measured`),
a worker's `Workload`, and what a chain of stages delivers on given cores (`allocate`, `epoch_rate`, `end_to_end`);
`harness.data.tune.levers` decides the levers on it (`harness tune`'s decisions).

Model (Plumber: Kuchnik, Klimovic, Šimša, Smith, Amvrosiadis, "Plumber: Diagnosing and Removing
Performance Bottlenecks in Machine Learning Data Pipelines", MLSys 2022, arXiv 2111.04131): each stage i runs at
`r_i` examples/s per core and may use at most `m_i` cores (1 for a sequential stage; the files for a reader, one
thread per file). Given `c` cores, Plumber's linear program `maximize min_i r_i·θ_i  s.t.  Σθ_i ≤ c, θ_i ≤ m_i` has
the closed-form optimum

    X = min(c / Σ_i 1/r_i,  min_i m_i·r_i),   θ_i = X / r_i   (cores given to stage i)

(every stage runs at the pipeline's rate X; the cores are shared in proportion to each stage's cost), and the
pipeline delivers X examples/s: the slowest stage's rate given its cores. One cache point (Plumber's mixed-integer
program allows at most one): the deepest that fits the memory budget and comes before any random stage (cached
augmentations would repeat every epoch); Cachew (Graur et al., USENIX ATC 2022, eth-easl/cachew `cache_utils.cc`)
picks between recomputing, a cache read and none by the modelled epoch time, as `decide_cache` does for the
file cache. The number of tf.data service workers follows Cachew's autoscaling stop rule (`scaling_utils.cc`: add
a worker while the client's batch time improves by more than 7%), computed from the model instead of tried.

Where the step runs on the same cores (no accelerator: `Workload.compute_on_cpu`), the step and the pipeline
take turns on them: a step of `c / C` core-seconds per example (C: the synthetic-batch rate on all c cores) and
the pipeline's `Σ 1/r_i` add up, so the job runs at `c / (c / C + Σ 1/r_i)` (bounded by the stages' caps): the
real/synthetic ratio, not the stall share, is what tuning raises.

The shuffle buffer splits an epoch in three phases (`epoch_rate`). A training epoch shuffles records in a buffer of
B of its N records; nothing leaves the buffer before it is full, so the stages above it (read, inflate, parse,
decode; a file cache's read in later epochs) first run alone for B records, then the whole chain runs for N − B,
and the stages below it (batch, augment) drain the last B alone:

    T_epoch = B / X_up + (N − B) / X + B / X_down,   epoch rate = N / T_epoch

with X_up, X the allocations of the upstream and the whole chain and X_down the downstream's. In the first epoch a
fresh training iterator also starts (`harness.data.tune.stage_rates.start_seconds`, T_start: the iterators and functions
of the epoch's stages created and first run, one thread's work, 30-50 ms on the ACES points), before any record is
read: it adds T_start to the first phase that runs (`phase_seconds`), whatever binds it. Modelled instead as one
more stage's work sharing the fill's cores, it hid under the points' reader cap (one file: the start on the idle
core) and over-predicted their first epoch by 11-36%; with the start first and the reader timed as an epoch reads
it (`probe`), the first epochs of the points, the GZIP patches and the U-Net export were predicted within +1% and
+31%, -5% and +13%, +1% and -6% (two probes each in one run; the points' epoch lasts ~70 ms, and three timings of
it swung by 25%). A new epoch's inner iterator (the flat_map's, later epochs without a cache) starts in 6-10 ms on
the points; not modelled. The harness's default buffer holds a whole epoch whenever the records fit in 256 MB
(`stages.default_shuffle_buffer`), so the phases are the rule, not a corner: a pipelined model (X alone)
over-predicted the first epoch by 45-54% on the ACES points and a U-Net export, and gave the reader one core where
the fill has them all.

Stages measured (`harness.data.tune.stage_rates` probes them): read (file bytes), inflate (GZIP), parse
(`parse_example`, per record or per read batch), decode (bands stacked, cropped, resized; label checked), unbatch
(parsed read batches split into records for the shuffle: one thread, 0.4-1.2 µs per ACES point record, about its parse's
cost), augment (random flips, rotations, color jitter; its cap the cores its parallel calls give, measured:
memory-bound, 1.5-2.0 of 2 here) and batch (one thread, but for batches of at least 1 MiB, which tf.data copies on every
thread of its pool: `parallel_batch`, on by default, `tf.data.experimental.OptimizationOptions`; the 1 MiB threshold is
`CopyBatch` in tensorflow/core/data/dataset_utils.cc; its cap what those threads give, measured). Plumber's model
is linear in cores; these two caps are where this machine's cores are not.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from harness.errors import ConfigError

READ, INFLATE, PARSE, DECODE, UNBATCH, AUGMENT, BATCH = ("read", "inflate", "parse", "decode", "unbatch", "augment",
                                                         "batch")
STAGES = (READ, INFLATE, PARSE, DECODE, UNBATCH, AUGMENT, BATCH)
RECORDS, BATCHES = "records", "batches"  # parse placements (choices.PARSE_PLACEMENTS without "auto")


@dataclasses.dataclass(frozen=True)
class StageRate:
    """One stage as measured: `per_core` examples/s on one core, `out_bytes` per example it outputs, `max_cores`
    the most cores it can use (None: any, a parallel map; 1: sequential; a reader: one per file).

    Raises:
      ConfigError: if per_core is not > 0.
    """

    name: str
    per_core: float
    out_bytes: float
    max_cores: Optional[float] = None

    def __post_init__(self):
        if not self.per_core > 0:
            raise ConfigError(f"stage {self.name}: rate per core must be > 0 examples/s, got {self.per_core}")

    @property
    def cost(self) -> float:
        """Core-seconds per example (1 / per_core)."""
        return 1.0 / self.per_core


@dataclasses.dataclass(frozen=True)
class Measured:
    """The probes' figures (`harness.data.tune.stage_rates.probe`).

    Attributes:
      read: file bytes read (`out_bytes`: bytes per example as stored, compressed or not).
      inflate: GZIP decompression (`out_bytes`: serialized bytes per example); None for uncompressed files.
      parse: by placement, RECORDS and BATCHES: `tf.io.parse_example` of one record, or of one read batch
        (rate per example); `out_bytes` the parsed features' bytes.
      decode: by placement: bands stacked, cropped and resized, the label checked; `out_bytes` as delivered.
      augment: the random stages (flips, rotations, jitter) on batches (`max_cores`: the cores its parallel calls
        give, measured; None: not measured, one CPU); None when the run augments nothing.
      batch: grouping decoded examples into batches (`max_cores` 1, or more where tf.data copies the batch in
        parallel).
      compute: the training step's examples/s on synthetic batches (`harness bench train --data synthetic`).
      compute_on_cpu: the step runs on the pipeline's cores (no accelerator).
      unbatch: parsed read batches split into records (one thread), for parse per read batch; None: not
        measured (costs nothing).
      start_s: seconds a fresh training iterator takes beyond its work (`stage_rates.start_seconds`);
        the first epoch pays it once.
    """

    read: StageRate
    inflate: Optional[StageRate]
    parse: dict
    decode: dict
    augment: Optional[StageRate]
    batch: StageRate
    compute: float
    compute_on_cpu: bool
    unbatch: Optional[StageRate] = None
    start_s: float = 0.0

    @classmethod
    def from_probe(cls, stages: dict, *, compute: float, compute_on_cpu: bool) -> "Measured":
        """The figures of `harness.data.tune.stage_rates.probe` (its dict) with the step's `compute` examples/s."""
        return cls(read=stages["read"], inflate=stages["inflate"], parse=stages["parse"], decode=stages["decode"],
                   augment=stages["augment"], batch=stages["batch"], unbatch=stages["unbatch"], compute=compute,
                   compute_on_cpu=compute_on_cpu, start_s=stages.get("start_s", 0.0))

    def rows(self) -> list:
        """(label, StageRate) of each stage measured, in pipeline order (None where not measured)."""
        return [("read", self.read), ("inflate", self.inflate), ("parse per record", self.parse[RECORDS]),
                ("parse per batch", self.parse[BATCHES]), ("decode per record", self.decode[RECORDS]),
                ("decode per batch", self.decode[BATCHES]), ("unbatch", self.unbatch), ("augment", self.augment),
                ("batch", self.batch)]


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one worker's pipeline must deliver and with what: `records` per epoch and `files` (this worker's),
    `batch_size` (per replica), `epochs`, `cpus` and `memory_bytes` (`harness.distribute.resources`),
    `disk_bytes` free under `cache_dir` (None: no cache dir), `workers` (training workers sharing the export),
    `shuffle_buffer` records in the training shuffle buffer (`stages.default_shuffle_buffer`; 0: no buffer, the
    chain runs pipelined)."""

    records: int
    files: int
    batch_size: int
    epochs: int
    cpus: int
    memory_bytes: int
    disk_bytes: Optional[int] = None
    workers: int = 1
    shuffle_buffer: int = 0


@dataclasses.dataclass(frozen=True)
class Allocation:
    """Plumber's optimum for a chain of stages on `cores`: `rate` examples/s, `cores` given to each stage
    (`{name: θ}`), and `bound`: the stage whose cap binds, or "cores" when the cores do."""

    rate: float
    cores: dict
    bound: str


def allocate(chain: Sequence[StageRate], cores: float) -> Allocation:
    """X = min(cores / Σ 1/r_i, min_i m_i·r_i), θ_i = X / r_i (the module docstring; Kuchnik et al., MLSys 2022).

    Raises:
      ConfigError: if cores is not > 0 or the chain is empty.
    """
    if not cores > 0 or not chain:
        raise ConfigError(f"allocate: needs cores > 0 and at least one stage, got {cores} cores, {len(chain)} stages")
    rate, bound = cores / sum(s.cost for s in chain), "cores"
    for s in chain:
        if s.max_cores is not None and s.max_cores * s.per_core < rate:
            rate, bound = s.max_cores * s.per_core, s.name
    return Allocation(rate=rate, cores={s.name: rate * s.cost for s in chain}, bound=bound)


def combined(name: str, stages: Sequence[StageRate], *, max_cores: Optional[float] = None) -> StageRate:
    """Stages run one after the other on one thread as one stage (a file's reader reads and inflates it): the
    costs add, the last stage's output."""
    return StageRate(name, 1.0 / sum(s.cost for s in stages), stages[-1].out_bytes, max_cores)


def phase_seconds(chain: Sequence[StageRate], records: int, cores: float, start_s: float = 0.0) -> float:
    """Seconds `chain` takes for `records` on `cores` after `start_s` seconds of a fresh iterator's start:
    T_start + max(N·Σ 1/r_i / c, max_i N / (m_i·r_i)), Plumber's bounds (cores, each stage's cap) after the start,
    which runs before any record does (the module docstring); N / `allocate(chain, cores).rate` without a start."""
    t = records * sum(s.cost for s in chain) / cores
    return start_s + max([t, *(records / (s.max_cores * s.per_core) for s in chain if s.max_cores is not None)])


def epoch_rate(upstream: Sequence[StageRate], downstream: Sequence[StageRate], cores: float, records: int,
               buffer: int, *, start_s: float = 0.0) -> float:
    """One epoch's examples/s through a shuffle buffer of `buffer` of its `records` (the module docstring):
    N / (T_fill + (N − B) / X + B / X_down), T_fill the stages above the buffer for B records and T_start
    (`start_s`, seconds of one thread) on the cores (`phase_seconds`), X and X_down Plumber's allocations
    (`allocate`) of the whole chain and of the stages below the buffer; an empty side costs nothing, and the start
    joins the first phase that runs. B = 0 and T_start = 0: X.

    Raises:
      ConfigError: if records < 1 or start_s < 0, or from `allocate`.
    """
    if records < 1 or start_s < 0 or not (upstream or downstream):
        raise ConfigError(f"epoch_rate: an epoch needs records >= 1, a start >= 0 s and a stage, got {records}, "
                          f"{start_s}, {len(upstream) + len(downstream)} stages")
    b = max(0, min(buffer, records))
    phases = [(list(upstream), b), ([*upstream, *downstream], records - b), (list(downstream), b)]
    t, start = 0.0, start_s
    for chain, n in phases:
        if chain and n:
            allocate(chain, cores)   # its errors
            t += phase_seconds(chain, n, cores, start)
            start = 0.0
    return records / t


def end_to_end(pipeline: Allocation, chain: Sequence[StageRate], compute: float, *, compute_on_cpu: bool,
               cores: float) -> float:
    """The job's examples/s: min(C, X) with an accelerator (the pipeline overlaps the step); on the step's own
    cores c / (c / C + Σ 1/r_i), at most the stages' caps (the module docstring)."""
    if not compute_on_cpu:
        return min(compute, pipeline.rate)
    shared = cores / (cores / compute + sum(s.cost for s in chain))
    return min([shared, *(s.max_cores * s.per_core for s in chain if s.max_cores is not None)])


def uncached_chain(m: Measured, w: Workload, parse: str) -> list[StageRate]:
    """The first epoch's stages: the reader (read + inflate, one thread per file), parse, decode, the unbatch of
    read batches (parse per read batch), augment, batch; `upstream_of_shuffle` splits it at the shuffle buffer."""
    reader = combined(READ, [m.read] + ([m.inflate] if m.inflate else []), max_cores=w.files)
    chain = [reader, m.parse[parse], m.decode[parse], *_unbatch(m, parse)]
    return chain + ([m.augment] if m.augment else []) + [m.batch]


def _unbatch(m: Measured, parse: str) -> list[StageRate]:
    return [m.unbatch] if parse == BATCHES and m.unbatch is not None else []


def upstream_of_shuffle(chain: Sequence[StageRate]) -> tuple[list, list]:
    """(the stages above the shuffle buffer, those below: batch and augment) of a chain."""
    below = (AUGMENT, BATCH)
    return [s for s in chain if s.name not in below], [s for s in chain if s.name in below]
