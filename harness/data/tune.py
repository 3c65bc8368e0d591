"""The input pipeline's levers decided from measured stage rates, without TensorFlow (`harness tune`'s decisions).

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
fresh training iterator also starts (`harness.data.probe.start_seconds`, T_start: the iterators and functions of
the epoch's stages created and first run, one thread's work, 30-50 ms on the ACES points), before any record is
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

Stages measured (`harness.data.probe` probes them): read (file bytes), inflate (GZIP), parse (`parse_example`,
per record or per read batch), decode (bands stacked, cropped, resized; label checked), unbatch (parsed read
batches split into records for the shuffle: one thread, 0.4-1.2 µs per ACES point record, about its parse's cost),
augment (random flips, rotations, color jitter; its cap the cores its parallel calls give, measured: memory-bound,
1.5-2.0 of 2 here) and batch (one thread, but for batches of at least 1 MiB, which tf.data copies on every thread
of its pool: `parallel_batch`, on by default, `tf.data.experimental.OptimizationOptions`; the 1 MiB threshold is
`CopyBatch` in tensorflow/core/data/dataset_utils.cc; its cap what those threads give, measured). Plumber's model
is linear in cores; these two caps are where this machine's cores are not.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from harness.data.stages import MEMORY_CACHE_FRACTION, MEMORY_CACHE_MAX_RECORDS, parse_per_record
from harness.errors import ConfigError

READ, INFLATE, PARSE, DECODE, UNBATCH, AUGMENT, BATCH = ("read", "inflate", "parse", "decode", "unbatch", "augment",
                                                         "batch")
STAGES = (READ, INFLATE, PARSE, DECODE, UNBATCH, AUGMENT, BATCH)
RECORDS, BATCHES = "records", "batches"  # parse placements (choices.PARSE_PLACEMENTS without "auto")
MEMORY, FILE, NONE = "memory", "file", "none"  # cache kinds (choices.CACHE_MODES)
# A file cache may take this fraction of the free disk under cache_dir.
DISK_CACHE_FRACTION = 0.5
# Prefetched batches may take at most this fraction of the worker's memory.
PREFETCH_MEMORY_FRACTION = 0.05
# Cachew's autoscaling rule: another worker is worth adding while it improves the batch time by more than 7%.
SERVICE_GAIN = 0.07
# What starting tf.data service workers costs a job before they deliver (a process each, TensorFlow's import, the
# dispatcher's handshake, the first files opened): seconds. Advice for a job whose input time it would save is
# shorter than this is not given. (A worker here starts in 10-20 s; 30 s is the round figure used.)
SERVICE_START_S = 30.0
# No stage moves bytes faster than one core's memory bandwidth: STREAM's copy on one core of a current x86 server
# runs at 10-25 GB/s (J. D. McCalpin, STREAM, cs.virginia.edu/stream). A probe whose examples/s x bytes out per
# example exceeds twice the top of that measured nothing (work skipped or cached): it is shown, and not used.
MAX_BYTES_PER_CORE_S = 50e9
# The baseline is what `harness train` does with no flag (`TrainOptions`' defaults): parse and cache `auto`, files
# read at once one per CPU, every parallel map's calls and the prefetch AUTOTUNE. A lever leaves its default only
# where the model predicts the job's time falls by more than the probes' own noise: the first epochs the probes
# predicted missed by up to +31% (the module docstring), and repeated probes of one stage spread by ~10%; 10% is
# the bar. The model has no term that a fixed number of map calls or prefetched batches improves on AUTOTUNE
# (tf.data's own tuner of exactly those), and fixed values lost to it in whole runs (0.89x on an input-bound table
# export, issue 49): those stay AUTOTUNE, the cores the model gives each stage said beside them.
TUNE_NOISE = 0.10
AUTO, AUTOTUNE = "auto", "autotune"


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
    """The probes' figures (`harness.data.probe.probe`).

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
      start_s: seconds a fresh training iterator takes beyond its work (`probe.start_seconds`);
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
        """The figures of `harness.data.probe.probe` (its dict) with the step's `compute` examples/s."""
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


@dataclasses.dataclass(frozen=True)
class Choice:
    """One lever's value and why, with the numbers it was decided on."""

    name: str
    value: object
    reason: str


@dataclasses.dataclass(frozen=True)
class Decision:
    """Every lever, decided (`decide`), and the predicted rates (examples/s): `first_epoch` (uncached chain),
    `steady` (later epochs, after the cache), `end_to_end` (the job's rate in later epochs, the step included),
    `compute` (synthetic batches)."""

    levers: tuple
    first_epoch: float
    steady: float
    end_to_end: float
    compute: float

    def value(self, name: str):
        return next(c.value for c in self.levers if c.name == name)

    def levers_set(self) -> dict:
        """The five levers as decided, a default shown as "auto" or "autotune" (`option_value` turns them into
        `TrainOptions`' values)."""
        return {k: self.value(k) for k in ("parse", "parallel_reads", "map_parallelism", "prefetch", "cache")}

    def train_options(self) -> dict:
        """The `train:` keys of a run config (`TrainOptions` fields) this decision sets; a lever kept at its
        default is None (files read at once, map calls, prefetch) or "auto" (parse, cache), as `TrainOptions`."""
        return {k: option_value(k, v) for k, v in self.levers_set().items()}

    def lines(self) -> list[str]:
        """One line per choice, then the prediction."""
        out = [f"{c.name}: {c.value} ({c.reason})" for c in self.levers]
        out.append(f"predicted: {self.steady:,.0f} examples/s from the pipeline after the first epoch "
                   f"({self.first_epoch:,.0f} in the first, the pipeline's start included), "
                   f"{self.end_to_end:,.0f} examples/s for the job beside "
                   f"{self.compute:,.0f} on synthetic batches (real/synthetic {self.end_to_end / self.compute:.2f}; "
                   "Plumber's model, Kuchnik et al., MLSys 2022)")
        return out


def option_value(lever: str, value):
    """A lever's value as `TrainOptions` takes it: "auto"/"autotune" of an integer lever is None (its default:
    one file per CPU, AUTOTUNE); parse and cache keep "auto"."""
    return None if lever in ("parallel_reads", "map_parallelism", "prefetch") and value in (AUTO, AUTOTUNE) else value


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def plausible(stage: Optional[StageRate]) -> bool:
    """Whether a probe's figure is one a core can reach: examples/s x bytes out per example at most
    MAX_BYTES_PER_CORE_S (a stage not measured counts as plausible)."""
    return stage is None or stage.per_core * max(stage.out_bytes, 1.0) <= MAX_BYTES_PER_CORE_S


def choose_parse(m: Measured) -> Choice:
    """The placement whose parse + decode costs fewer core-seconds per example; a placement whose probe is not
    `plausible` is not chosen on its figure (the other is, when it is plausible)."""
    cost = {p: m.parse[p].cost + m.decode[p].cost for p in (RECORDS, BATCHES)}
    sane = [p for p in (RECORDS, BATCHES) if plausible(m.parse[p]) and plausible(m.decode[p])]
    best = min(sane or cost, key=cost.get)
    other = BATCHES if best == RECORDS else RECORDS
    each = {RECORDS: "record", BATCHES: "read batch"}
    if other not in sane and sane:
        return Choice("parse", best, f"parse + decode {_fmt(1 / cost[best])} examples/s per core, one per "
                                     f"{each[best]}; the probe of one per {each[other]} gave more bytes per second "
                                     f"than a core's memory moves ({MAX_BYTES_PER_CORE_S / 1e9:g} GB/s): not used")
    return Choice("parse", best, f"parse + decode {_fmt(1 / cost[best])} examples/s per core, one per "
                                 f"{each[best]}, against {_fmt(1 / cost[other])} one per {each[other]}")


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


def decide_cache(m: Measured, w: Workload, parse: str) -> tuple[Choice, list[StageRate]]:
    """The cache kind and point, and the stages later epochs run.

    The one point is after decode (the deepest deterministic stage: augmentation is random, so it runs after the
    cache, every epoch). Read batches are split into records before a memory cache of at most
    `stages.MEMORY_CACHE_MAX_RECORDS` records (as the pipeline does), after any other cache, every epoch. Memory
    when the decoded records fit MEMORY_CACHE_FRACTION of the worker's memory; else a file cache when they fit
    DISK_CACHE_FRACTION of the free disk and reading it (at the read stage's bytes/s per
    core, `decode.out_bytes` per example) beats recomputing (Cachew's rule: the shorter modelled epoch); else
    none. One epoch: no cache (it would be filled and never read).
    """
    decoded = m.decode[parse].out_bytes
    nbytes = w.records * decoded
    after = ([m.augment] if m.augment else []) + [m.batch]
    split = _unbatch(m, parse)
    recompute = uncached_chain(m, w, parse)
    where = "after decode, before augment (random)" if m.augment else "after decode"
    if w.epochs < 2:
        return Choice("cache", NONE, "one epoch: a cache would be filled and never read"), recompute
    budget = MEMORY_CACHE_FRACTION * w.memory_bytes
    if nbytes <= budget:
        return Choice("cache", MEMORY, f"{where}: {_gb(nbytes)} of decoded records fit in "
                                       f"{MEMORY_CACHE_FRACTION:.0%} of {_gb(w.memory_bytes)} memory"), \
            (split if w.records > MEMORY_CACHE_MAX_RECORDS else []) + after
    no_memory = f"{_gb(nbytes)} of decoded records exceed {_gb(budget)} of memory"
    if w.disk_bytes is None:
        return Choice("cache", NONE, f"{no_memory}, and no cache_dir was given"), recompute
    if nbytes > DISK_CACHE_FRACTION * w.disk_bytes:
        return Choice("cache", NONE, f"{no_memory} and {DISK_CACHE_FRACTION:.0%} of the "
                                     f"{_gb(w.disk_bytes)} free disk"), recompute
    file_read = StageRate("cache read", m.read.per_core * m.read.out_bytes / decoded, decoded, w.files)
    cached = allocate([file_read, *split, *after], w.cpus).rate
    fresh = allocate(recompute, w.cpus).rate
    if cached > fresh:
        return Choice("cache", FILE, f"{where}: {no_memory}; read from local disk at {_fmt(cached)} examples/s "
                                     f"against {_fmt(fresh)} recomputed"), [file_read, *split, *after]
    return Choice("cache", NONE, f"{no_memory}; a file cache would read at {_fmt(cached)} examples/s, "
                                 f"recomputing gives {_fmt(fresh)}"), recompute


def _gb(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def decide_reads(allocations: Sequence[Allocation], w: Workload) -> Choice:
    """Files read at once: the most cores the reader needs in the first epoch's allocations (θ_read, rounded
    up; the fill of the shuffle buffer, where the stages above it have every core, and the whole chain), at least
    1, at most the files."""
    a = max(allocations, key=lambda x: x.cores[READ])
    theta = a.cores[READ]
    value = max(1, min(w.files, math.ceil(theta - 1e-9)))
    return Choice("parallel_reads", value, f"the reader needs {theta:.2f} cores at {_fmt(a.rate)} examples/s; "
                                           f"{w.files} files")


def decide_maps(allocations: Sequence[Allocation], w: Workload) -> Choice:
    """Calls in flight of each parallel map: the most cores any map stage (parse + decode, or augment) needs in
    any phase's allocation (either epoch's, the shuffle buffer's fill and drain), rounded up, plus one, within 1
    and the CPUs. The one more: a tf.data parallel map fetches its input inside each call (`CallFunction` in
    tensorflow/core/kernels/data/parallel_map_dataset_op.cc runs `input_impl_->GetNext` before the function,
    counted in the calls in flight), so with one call in flight the reader before it and the parse take turns
    instead of overlapping. (Measured on the ACES points' first epoch, the parse needing 0.26 cores: 104k
    examples/s with 1 in flight against 136k with 2 in one benchmark run, 165k against 146k in another; this
    machine's noise is larger than the effect, so the rule rests on the source.)"""
    need = max(max(a.cores.get(PARSE, 0) + a.cores.get(DECODE, 0), a.cores.get(AUGMENT, 0)) for a in allocations)
    value = max(1, min(w.cpus, math.ceil(need - 1e-9) + 1))
    return Choice("map_parallelism", value, f"the busiest map needs {need:.2f} cores, and 1 call more fetches "
                                            f"its input; {w.cpus} CPUs")


def decide_prefetch(maps: int, batch_bytes: float, w: Workload) -> Choice:
    """Batches prefetched: map_parallelism + 1 (a parallel map finishes up to that many batches together; the
    buffer holds them and the one the step takes), at least 2 (double buffering), and at most what
    PREFETCH_MEMORY_FRACTION of the worker's memory holds."""
    want = max(2, maps + 1)
    fits = max(1, int(PREFETCH_MEMORY_FRACTION * w.memory_bytes // max(batch_bytes, 1)))
    value = min(want, fits)
    why = f"{maps} maps in flight + 1" if value == want else \
        f"{_gb(batch_bytes)} per batch: {PREFETCH_MEMORY_FRACTION:.0%} of memory holds {fits}"
    return Choice("prefetch", value, why)


def decide_reshard(m: Measured, w: Workload, steady: Allocation, after_cache: Sequence[StageRate]) -> Choice:
    """Reshard (`harness reshard`) when later epochs are bound by the reader's files: into uncompressed files (no
    inflate; read at the measured bytes/s per core over the serialized bytes), as many per worker as the reader
    then needs cores for the uncapped rate (more than now when they were uncompressed already), times the workers.
    None when the reader does not bind (or a cache removes it)."""
    if steady.bound != READ:
        return Choice("reshard", None, f"later epochs are bound by {steady.bound}, not by reading "
                                       f"{w.files} file(s)")
    serialized = m.inflate.out_bytes if m.inflate else m.read.out_bytes
    plain = StageRate(READ, m.read.per_core * m.read.out_bytes / serialized, serialized)
    target = allocate([plain, *after_cache[1:]], w.cpus)
    need = max(1, math.ceil(target.cores[READ] - 1e-9))
    per_worker = need if m.inflate else max(w.files + 1, need)
    allowed = allocate([dataclasses.replace(plain, max_cores=per_worker), *after_cache[1:]], w.cpus).rate
    inflate = " uncompressed (no inflate)" if m.inflate else ""
    return Choice("reshard", per_worker * w.workers,
                  f"reading {w.files} file(s) caps the pipeline at {_fmt(steady.rate)} examples/s; {per_worker} "
                  f"file(s) per worker{inflate} allow {_fmt(allowed)}: harness reshard --workers {w.workers} "
                  f"--shards-per-worker {per_worker}")


def decide_service(job: float, pipeline_one_host: float, m: Measured, w: Optional[Workload] = None) -> Choice:
    """tf.data service workers (each with this worker's CPUs) when the job on one host falls short of the step's
    synthetic rate by more than SERVICE_GAIN (Cachew's 7%) and the time that saves over the job's epochs is more
    than SERVICE_START_S (what starting them costs): ceil(C / X_worker), X_worker the pipeline's rate on a
    worker's cores; 0 otherwise."""
    if job >= m.compute / (1 + SERVICE_GAIN):
        return Choice("data_service_workers", 0, f"one host feeds {_fmt(job)} of the step's {_fmt(m.compute)} "
                                                 f"examples/s (within {SERVICE_GAIN:.0%})")
    if w is not None:
        examples = w.records * w.epochs
        saved = examples / job - examples / m.compute
        if saved < SERVICE_START_S:
            return Choice("data_service_workers", 0, f"one host feeds {_fmt(job)} of the step's "
                                                     f"{_fmt(m.compute)} examples/s, but over this job's "
                                                     f"{examples:,} examples that costs {saved:.1f} s, less than "
                                                     f"starting service workers (~{SERVICE_START_S:g} s)")
    n = math.ceil(m.compute / pipeline_one_host - 1e-9)
    return Choice("data_service_workers", n, f"one host feeds {_fmt(job)} of the step's {_fmt(m.compute)} "
                                             f"examples/s; a worker's pipeline gives {_fmt(pipeline_one_host)}: "
                                             f"{n} worker{'s' if n != 1 else ''} (harness data-service worker)")


def default_parse(m: Measured) -> str:
    """The placement `parse: auto` takes: per record above `stages.VECTORIZE_MAX_RECORD_BYTES` of serialized
    record, else read batches (`stages.parse_per_record`)."""
    serialized = m.inflate.out_bytes if m.inflate else m.read.out_bytes
    return RECORDS if parse_per_record(serialized) else BATCHES


def default_cache(m: Measured, w: Workload, parse: str) -> tuple[str, list[StageRate]]:
    """What `cache: auto` does (`stages.choose_cache`) and the stages later epochs then run: memory when the
    decoded records fit MEMORY_CACHE_FRACTION of memory, else files when a cache_dir is given and they fit
    DISK_CACHE_FRACTION of its disk, else none."""
    decoded = m.decode[parse].out_bytes
    nbytes = w.records * decoded
    after = ([m.augment] if m.augment else []) + [m.batch]
    split = _unbatch(m, parse)
    if w.epochs < 2:
        return NONE, uncached_chain(m, w, parse)
    if nbytes <= MEMORY_CACHE_FRACTION * w.memory_bytes:
        return MEMORY, (split if w.records > MEMORY_CACHE_MAX_RECORDS else []) + after
    if w.disk_bytes is not None and nbytes <= DISK_CACHE_FRACTION * w.disk_bytes:
        file_read = StageRate("cache read", m.read.per_core * m.read.out_bytes / decoded, decoded, w.files)
        return FILE, [file_read, *split, *after]
    return NONE, uncached_chain(m, w, parse)


def job_seconds(m: Measured, w: Workload, parse: str, steady_chain: Sequence[StageRate]) -> float:
    """The modelled seconds of the job's epochs on this worker: the first on the uncached chain, the rest on
    `steady_chain`, each at `end_to_end` (the step included)."""
    first_chain = uncached_chain(m, w, parse)
    rate = {id(c): end_to_end(allocate(c, w.cpus), c, m.compute, compute_on_cpu=m.compute_on_cpu, cores=w.cpus)
            for c in (first_chain, steady_chain)}
    return w.records / rate[id(first_chain)] + (w.epochs - 1) * w.records / rate[id(steady_chain)]


def against_default(m: Measured, w: Workload, model_parse: Choice, model_cache: Choice) -> tuple[Choice, Choice]:
    """The parse and cache levers against `harness train`'s defaults (`TUNE_NOISE`): each changed from `auto`
    only where the model's choice, the other lever at its default, shortens the job's modelled time by more than
    the noise; the reason says the gain either way."""
    d_parse = default_parse(m)
    d_cache, d_chain = default_cache(m, w, d_parse)
    base = job_seconds(m, w, d_parse, d_chain)
    out = []
    for lever, choice, seconds in (
            ("parse", model_parse, job_seconds(m, w, model_parse.value, default_cache(m, w, model_parse.value)[1])),
            ("cache", model_cache, job_seconds(m, w, d_parse, decide_cache(m, w, d_parse)[1]))):
        gain = base / seconds
        default = d_parse if lever == "parse" else d_cache
        if choice.value != default and gain > 1 + TUNE_NOISE:
            out.append(Choice(lever, choice.value, f"{choice.reason}; the job {gain:.2f}x faster than with the "
                                                   f"default (auto: {default})"))
        else:
            why = ("the default's own choice" if choice.value == default else
                   f"{choice.value} would make the job {gain:.2f}x as fast, within the probes' noise "
                   f"({TUNE_NOISE:.0%})")
            out.append(Choice(lever, AUTO, f"the default kept (auto: {default}): {why}"))
    return out[0], out[1]


def decide(m: Measured, w: Workload) -> Decision:
    """Every lever from the measured rates (see the module docstring and each `decide_*`), against `harness
    train`'s defaults (`TUNE_NOISE`, `against_default`): parse and cache leave `auto` only for a predicted gain
    beyond the noise; files read at once, map calls and prefetch stay at their defaults, the model's figure for
    each said in its reason.

    Raises:
      ConfigError: for a workload of no records, files or CPUs.
    """
    if w.records < 1 or w.files < 1 or w.cpus < 1:
        raise ConfigError(f"tune: a worker needs records, files and CPUs, got {w.records}, {w.files}, {w.cpus}")
    model_parse = choose_parse(m)
    model_cache, _ = decide_cache(m, w, model_parse.value)
    parse, cache = against_default(m, w, model_parse, model_cache)
    placement = model_parse.value if parse.value != AUTO else default_parse(m)
    if cache.value != AUTO:
        _, steady_chain = decide_cache(m, w, placement)
    else:
        _, steady_chain = default_cache(m, w, placement)
    first_chain = uncached_chain(m, w, placement)
    first = allocate(first_chain, w.cpus)
    steady = allocate(steady_chain, w.cpus)
    phases = [first, steady]
    if w.shuffle_buffer:   # the buffer's fill and drain: each side alone on the cores
        phases += [allocate(side, w.cpus) for chain in (first_chain, steady_chain)
                   for side in upstream_of_shuffle(chain) if side]
    reads = decide_reads([a for a in phases if READ in a.cores], w)
    maps = decide_maps(phases, w)
    prefetch = decide_prefetch(maps.value, w.batch_size * m.batch.out_bytes, w)
    kept = "the default kept: the model has no term by which a fixed value beats it"
    reads = Choice("parallel_reads", AUTO, f"{kept} (one per CPU, at most the files); {reads.reason}")
    maps = Choice("map_parallelism", AUTOTUNE, f"{kept}; {maps.reason}")
    prefetch = Choice("prefetch", AUTOTUNE, f"{kept}; {prefetch.reason}")
    reshard = decide_reshard(m, w, steady, steady_chain)
    job = end_to_end(steady, steady_chain, m.compute, compute_on_cpu=m.compute_on_cpu, cores=w.cpus)
    service = decide_service(job, steady.rate, m, w)
    first_rate, steady_rate = (epoch_rate(*upstream_of_shuffle(chain), w.cpus, w.records, w.shuffle_buffer,
                                          start_s=start)
                               for chain, start in ((first_chain, m.start_s), (steady_chain, 0.0)))
    return Decision(levers=(parse, reads, maps, prefetch, cache, reshard, service), first_epoch=first_rate,
                    steady=steady_rate, end_to_end=job, compute=m.compute)
