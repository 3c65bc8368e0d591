"""The input pipeline's levers decided on the model (`harness.data.tune.model`) against `harness train`'s defaults,
without TensorFlow (`harness tune`'s decisions): each lever's choice (`choose_parse`, `decide_cache`, `decide_*`),
kept at its default unless the modelled job gains more than the probes' noise (`against_default`); `decide` takes
them all."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from harness.data.input.stages import MEMORY_CACHE_FRACTION, MEMORY_CACHE_MAX_RECORDS, parse_per_record
from harness.data.tune.model import (AUGMENT, BATCHES, DECODE, PARSE, READ, RECORDS, Allocation, Measured,
                                     StageRate, Workload, _unbatch, allocate, end_to_end, epoch_rate,
                                     uncached_chain, upstream_of_shuffle)
from harness.errors import ConfigError

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
