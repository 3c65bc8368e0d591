"""`harness train --tune`: the input pipeline's levers decided before the first epoch, the same on every worker.

Before the datasets are built, every worker probes its own share of the training files (`harness.data.tune.stage_rates`:
each stage's examples/s per core on the first `PROBE_RECORDS` records of the files the epoch plan assigned it) and the
step on synthetic batches (`harness.train.measure.probe.synthetic_probe`: a fresh copy of the run's model and optimizer,
the run's step, over the backend already built: no second strategy; every worker runs it, its steps are
collectives). `harness.data.tune.levers.decide` then decides each worker's levers from its figures (Plumber's model,
Kuchnik et al., MLSys 2022), as `harness tune` does.

Workers measure on their own cores and files, so their decisions may differ; a worker that read its files with
other levers than its peers would still train on the same records, but the job would not be the one the summary
describes. The levers are agreed through the backend's all-gather (`TrainingBackend.allgather`, every worker at
the same point): every worker applies the chief's (rank 0's) decision, and every worker's own decision is kept in
the record beside it. The chief prints the decision with its numbers once; every worker prints the levers it
applies (`tune: worker R applies ...`); the chief's `summary.json` holds the record under "tune".

The decision is kept: the chief writes the record to `OUTPUT/tune.json` (the output folder every worker shares,
`harness.train.lifecycle.shared_output`), and a run that resumes from a backup applies the levers kept there instead of
probing again. The files read at once set the interleave's cycle and so the records' order (`pipeline.read_files`,
deterministic): a resumed epoch skips the batches already trained on, which holds only in the order they were
read.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Callable, Optional, Sequence

from harness.data.tune import model as tune_model, levers as tune_lib
from harness.data.tune.stage_rates import PROBE_RECORDS, free_disk, probe
from harness.data.export.source import ShardSet
from harness.data.input.stages import default_shuffle_buffer
from harness.errors import ConfigError

LEVERS = ("parse", "parallel_reads", "map_parallelism", "prefetch", "cache")
PLACEMENTS = (tune_model.RECORDS, tune_model.BATCHES)    # the two the probes time
PARSES = (*PLACEMENTS, tune_lib.AUTO)                # the parse lever's values (auto: harness train's default)
CACHES = (tune_lib.MEMORY, tune_lib.FILE, tune_lib.NONE, tune_lib.AUTO)
PREDICTED = ("first_epoch", "steady", "end_to_end", "compute")  # examples/s, `Decision`'s
RECORD_FILE = "tune.json"   # in the run's output folder: the decision a resume keeps


def encode(decision: tune_lib.Decision) -> list[float]:
    """The levers and predictions of `decision` as numbers for a collective: `[parse index in PARSES,
    parallel_reads, map_parallelism, prefetch, cache index in CACHES, first_epoch, steady, end_to_end, compute]`
    (float64; the integers exact below 2**53; 0 for a lever at its default, None in `TrainOptions`)."""
    o = decision.train_options()
    return [PARSES.index(o["parse"]), o["parallel_reads"] or 0, o["map_parallelism"] or 0, o["prefetch"] or 0,
            CACHES.index(o["cache"]), *(float(getattr(decision, k)) for k in PREDICTED)]


DEFAULT_SHOWN = {"parallel_reads": tune_lib.AUTO, "map_parallelism": tune_lib.AUTOTUNE,
                 "prefetch": tune_lib.AUTOTUNE}   # an integer lever at its default, as decided and printed


def decode(row: Sequence[float]) -> dict:
    """`encode`'s numbers back: `{"levers": {parse, parallel_reads, map_parallelism, prefetch, cache},
    "predicted": {first_epoch, steady, end_to_end, compute}}` (examples/s).

    Raises:
      ConfigError: for a row of the wrong length or an index outside PARSES / CACHES.
    """
    if len(row) != len(LEVERS) + len(PREDICTED):
        raise ConfigError(f"tune: a decision of {len(row)} numbers, expected {len(LEVERS) + len(PREDICTED)}")
    parse, reads, maps, prefetch, cache = (int(round(float(v))) for v in row[:len(LEVERS)])
    if not (0 <= parse < len(PARSES) and 0 <= cache < len(CACHES)):
        raise ConfigError(f"tune: parse index {parse} or cache index {cache} out of range")
    return {"levers": {"parse": PARSES[parse], "parallel_reads": reads or DEFAULT_SHOWN["parallel_reads"],
                       "map_parallelism": maps or DEFAULT_SHOWN["map_parallelism"],
                       "prefetch": prefetch or DEFAULT_SHOWN["prefetch"], "cache": CACHES[cache]},
            "predicted": dict(zip(PREDICTED, (float(v) for v in row[len(LEVERS):])))}


def agree(backend, decision: tune_lib.Decision) -> tuple[dict, list[dict]]:
    """Every worker's decision gathered (`backend.allgather`, a collective: every worker calls it at the same
    point); returns `(the chief's levers, every worker's decoded decision in rank order)`. The chief's levers are
    what every worker applies."""
    rows = [decode(r) for r in backend.allgather(encode(decision))]
    return dict(rows[0]["levers"]), rows


def replaced(options, levers: dict) -> list[tuple[str, object, object]]:
    """`(lever, given, tuned)` for each lever the user set (a value other than `TrainOptions`' default) that the
    tuned value replaces."""
    defaults = {f.name: f.default for f in dataclasses.fields(options)}
    return [(k, getattr(options, k), v) for k, v in levers.items()
            if getattr(options, k) != defaults[k] and getattr(options, k) != tune_lib.option_value(k, v)]


def my_share(train: ShardSet, files: Sequence[str]) -> ShardSet:
    """The shards of `train` among `files` (this worker's assignment), in shard order, with their counts."""
    mine = set(files)
    held = [(s, st) for s, st in zip(train.shards, train.stats) if s.path in mine]
    return ShardSet(shards=tuple(s for s, _ in held), stats=tuple(st for _, st in held), mixer=train.mixer,
                    sources=train.sources)


def kept(output: str) -> dict | None:
    """The record a previous start of this run wrote to `output/tune.json`, or None when there is none.

    Raises:
      ConfigError: for a file that is not a record of `tune` (no "applied" levers), naming it.
    """
    import tensorflow as tf

    path = os.path.join(output, RECORD_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        record = json.load(f)
    if set(record.get("applied") or {}) != set(LEVERS):
        raise ConfigError(f"{path}: expected the levers {list(LEVERS)} under 'applied', got {record.get('applied')!r}"
                          "; delete it to tune again")
    return record


def _apply(inputs, levers: dict, say, rank: int):
    """The levers said (a lever given and replaced, each worker's applied line) and set in the inputs' options."""
    swaps = replaced(inputs.options, levers)
    for key, given, value in swaps:
        say(f"tune: {key} {given!r} was given; --tune applies the tuned {value!r}")
    print(f"tune: worker {rank} applies " + " ".join(f"{k}={levers[k]}" for k in LEVERS), flush=True)
    tuned = dataclasses.replace(inputs.options, **{k: tune_lib.option_value(k, v) for k, v in levers.items()})
    return dataclasses.replace(inputs, options=tuned), [{"lever": k, "given": g, "tuned": v} for k, g, v in swaps]


def _stage_record(s) -> dict | None:
    return None if s is None else {"per_core": s.per_core, "out_bytes": s.out_bytes, "max_cores": s.max_cores}


@dataclasses.dataclass(frozen=True)
class Tuning:
    """What one tuning measured and decided (`measure`).

    Attributes:
      stages: `stage_rates.probe`'s dict (each stage's examples/s per core, `probed_records`, `probed_files`).
      step: `probe.sized_synthetic_probe`'s dict of the step on synthetic batches, or None where the step's rate
        was given.
      measured: the stages and the step as the model takes them (`tune_model.Measured`; compute: examples/s of
        one worker).
      workload: one worker's share (`tune_model.Workload`).
      decision: the levers and the predicted rates (`levers.decide`).
    """

    stages: dict
    step: Optional[dict]
    measured: tune_model.Measured
    workload: tune_model.Workload
    decision: tune_lib.Decision


def measure(inputs, backend, probe_run: Callable, *, share: ShardSet, records_per_worker: int, files: int,
            workers: int, records: int = PROBE_RECORDS, compute_on_cpu: bool = True,
            compute: Optional[float] = None) -> Tuning:
    """The one tuner of `harness tune` and `harness train --tune`: the stages probed on `share`
    (`stage_rates.probe`, `records` records), the step measured on synthetic batches of the run's model, batch,
    precision and K (`probe.sized_synthetic_probe` over `probe_run`: every worker calls it, its steps are
    collectives), one worker's workload, and the decision (`levers.decide`, Plumber's model).

    Args:
      inputs: the run's `harness.train.inputs.Inputs` (plan, spec, resources, options), before its datasets.
      backend: the run's `TrainingBackend` (its context; the all-gather that agrees on the probe's K).
      probe_run: `fn(schedule, timer) -> Run` over a fresh copy of the run's model and optimizer (None only where
        `compute` is given).
      share: the shards one worker reads (its assignment; `harness tune`: the whole export).
      records_per_worker, files: one worker's records and files (the workload).
      workers: training workers, one per host (the job's rate is theirs together).
      compute: one worker's examples/s on synthetic batches measured before (the step is not probed again).
    Raises:
      the data layer's errors from the probes, ConfigError for a share of no records.
    """
    from harness.train.measure.probe import sized_synthetic_probe
    from harness.train.loop.synthetic import Shapes

    options, context = inputs.options, backend.context
    batch = inputs.plan.per_replica_batch_size
    stages = probe(share, inputs.spec, batch_size=batch, augment=options.augment, brightness=options.brightness,
                   contrast=options.contrast, cpus=inputs.resources.cpus, records=records)
    step = None
    if compute is None:
        step = sized_synthetic_probe(probe_run, context=context,
                                     shapes=Shapes.from_spec(inputs.spec, inputs.num_classes),
                                     per_replica_batch=batch, steps_per_loop=options.loop_steps, seed=options.seed,
                                     agree=lambda call_s: float(backend.allgather([call_s])[0][0]))   # the chief's
        compute = step["examples_per_s"] / context.num_workers   # the job's rate: this worker's share of it
    measured = tune_model.Measured.from_probe(stages, compute=compute, compute_on_cpu=compute_on_cpu)
    resources = inputs.resources
    workload = tune_model.Workload(records=max(1, records_per_worker), files=max(1, files), batch_size=batch,
                                   epochs=options.epochs, cpus=resources.cpus, memory_bytes=resources.memory_bytes,
                                   disk_bytes=free_disk(options.cache_dir), workers=workers,
                                   shuffle_buffer=default_shuffle_buffer(
                                       max(1, records_per_worker), share.nbytes() / max(1, share.records),
                                       options.shuffle_buffer))
    return Tuning(stages, step, measured, workload, tune_lib.decide(measured, workload))


def measured_lines(tuning: Tuning, cpus: int) -> list[str]:
    """`harness tune`'s table of what was measured: each stage's examples/s per core and bytes out per example
    (with the batch and augment stages' gain on `cpus` threads, and a stage the probe could not have measured
    said so), the iterator's start, the step's rate on synthetic batches."""
    measured, stages = tuning.measured, tuning.stages
    lines = [f"measured on {stages['probed_records']} records of {stages['probed_files']} file(s), examples/s per "
             "core:"]
    for label, s in measured.rows():
        if s is not None:
            cap = ""
            if s.name == tune_model.BATCH and s.max_cores != 1:
                cap = f", copied on {cpus} threads (batches >= 1 MiB): {s.max_cores:.2f}x one core"
            elif s.name == tune_model.AUGMENT and s.max_cores is not None:
                cap = f", {cpus} calls in flight on {cpus} threads: {s.max_cores:.2f}x one core"
            if not tune_lib.plausible(s):
                cap += (f", {s.per_core * s.out_bytes / 1e9:,.0f} GB/s per core, above what a core's memory moves "
                        f"({tune_lib.MAX_BYTES_PER_CORE_S / 1e9:g} GB/s): the probe measured nothing, not used")
            lines.append(f"  {label:<17} {s.per_core:>12,.0f}  {s.out_bytes:>10,.0f} B out per example{cap}")
    lines.append(f"  {'start':<17} {measured.start_s * 1e3:>12,.1f}  ms: a fresh iterator's start beyond its work "
                 "(once, in the first epoch)")
    steps = f", {tuning.step['steps']} steps" if tuning.step else ", measured before"
    lines.append(f"  {'compute':<17} {measured.compute:>12,.0f}  examples/s on synthetic batches "
                 f"({'CPU' if measured.compute_on_cpu else 'accelerator'}{steps})")
    return lines


def config_text(decision: tune_lib.Decision, train: dict, data: dict) -> str:
    """The run config `harness train --config` takes, as `harness tune --write` writes it: `train:` the options
    given (`train`) with the levers of `decision` (`Decision.train_options`), `data:` the data section given; each
    choice and the prediction as comments above."""
    import yaml

    def plain(v):
        return list(v) if isinstance(v, tuple) else v

    section = {k: plain(v) for k, v in train.items()}
    section.update(decision.train_options())
    config = {"train": section, **({"data": {k: plain(v) for k, v in data.items()}} if data else {})}
    head = ["# written by `harness tune`: the input pipeline's levers from its measured stages"]
    head += [f"# {line}" for line in decision.lines()]
    return "\n".join(head) + "\n" + yaml.safe_dump(config, sort_keys=False)


def tune(inputs, backend, probe_run: Callable, say: Callable[..., None], *, records: int = PROBE_RECORDS,
         compute_on_cpu: bool = True, resuming: bool = False) -> tuple:
    """Probe, decide, agree and apply; returns `(inputs with the tuned options, record for summary.json)`.

    Args:
      inputs: the run's `harness.train.inputs.Inputs` (plan, spec, resources, options), before its datasets.
      backend: the run's `TrainingBackend` (its context; the all-gather of `agree`).
      probe_run: `fn(schedule, timer) -> Run` over a fresh copy of the run's model and optimizer (`job.run`'s).
      say: the chief's print.
      records: records each stage's probe reads (of this worker's files).
      compute_on_cpu: the step runs on the pipeline's cores (no accelerator).
      resuming: the run continues from a backup: the levers kept in `OUTPUT/tune.json` are applied (the module
        docstring), nothing is probed; where there is none, tuned as a fresh start.
    Returns:
      the record: `{"applied": levers, "decided_by": 0, "by_worker": [{"levers", "predicted"} per rank],
      "replaced": [{"lever", "given", "tuned"}], "this_worker": {"rank", "choices", "measured",
      "compute_examples_per_s", "workload", "probe_seconds"}}` (examples/s per worker; on the chief
      "this_worker" is the decision applied); a resume's: the kept record with "kept_from" (its path) added.
    Raises:
      the data layer's errors from the probes, ConfigError for a share of no records.
    """
    start = time.perf_counter()
    options, plan, context = inputs.options, inputs.plan, backend.context
    saved = kept(options.output) if resuming else None
    if saved is not None:
        path = os.path.join(options.output, RECORD_FILE)
        say(f"tune: resuming: the levers decided when this run started ({path}), not probed again (a resumed "
            "epoch's records are read in the order they were)")
        inputs, swaps = _apply(inputs, saved["applied"], say, context.rank)
        return inputs, dict(saved, replaced=swaps, kept_from=path)
    files = plan.assignments[context.rank].files
    tuning = measure(inputs, backend, probe_run, share=my_share(inputs.train, files),
                     records_per_worker=plan.records[context.rank], files=len(files), workers=context.num_workers,
                     records=records, compute_on_cpu=compute_on_cpu)
    stages, measured, decision = tuning.stages, tuning.measured, tuning.decision
    levers, rows = agree(backend, decision)
    say(f"tune: the chief's probes ({stages['probed_records']} records of its {stages['probed_files']} file(s), "
        f"{tuning.step['steps']} steps on synthetic batches) and its decision, applied on every worker:")
    for line in decision.lines():
        say(f"tune: {line}")
    inputs, swaps = _apply(inputs, levers, say, context.rank)
    record = {
        "applied": levers, "decided_by": 0, "by_worker": rows, "replaced": swaps,
        "this_worker": {
            "rank": context.rank,
            "choices": [{"name": c.name, "value": c.value, "reason": c.reason} for c in decision.levers],
            "measured": {"read": _stage_record(measured.read), "inflate": _stage_record(measured.inflate),
                         **{f"parse_{p}": _stage_record(measured.parse[p]) for p in PLACEMENTS},
                         **{f"decode_{p}": _stage_record(measured.decode[p]) for p in PLACEMENTS},
                         "unbatch": _stage_record(measured.unbatch), "augment": _stage_record(measured.augment),
                         "batch": _stage_record(measured.batch), "start_s": measured.start_s},
            "compute_examples_per_s": measured.compute, "compute_on_cpu": compute_on_cpu,
            "workload": dataclasses.asdict(tuning.workload), "probed_records": stages["probed_records"],
            "probed_files": stages["probed_files"], "probe_seconds": time.perf_counter() - start}}
    if context.is_chief:
        import tensorflow as tf

        tf.io.gfile.makedirs(options.output)
        with tf.io.gfile.GFile(os.path.join(options.output, RECORD_FILE), "w") as f:
            json.dump(record, f, indent=1)
    return inputs, record


def measured_against_predicted(record: dict, history: Sequence[dict], workers: int) -> Optional[str]:
    """After a `--tune` run: the real/synthetic ratio measured (the later epochs' median examples/s, or the only
    epoch's, over the synthetic-batch rate the probe measured for the job) beside the one the chief's decision
    predicted. None for a resumed record (no probe) or no epoch."""
    chief = (record.get("by_worker") or [{}])[0].get("predicted")
    if not chief or not history or not chief.get("compute"):
        return None
    later = [h["examples_per_s"] for h in history[1:]] or [history[0]["examples_per_s"]]
    measured = statistics.median(later)
    synthetic = chief["compute"] * workers          # the probe's rate is each worker's share of the job's
    which = "later epochs' median" if len(history) > 1 else "the only epoch's"
    return (f"tune: real/synthetic measured {measured / synthetic:.2f} ({which} {measured:,.0f} examples/s over "
            f"{synthetic:,.0f} on synthetic batches), predicted {chief['end_to_end'] / chief['compute']:.2f}")
