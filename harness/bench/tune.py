"""`harness tune`: short probes of each input stage on your shards and options, the step's rate on synthetic
batches, then the levers decided (`harness.data.tune.levers`) and written as a run config for `harness train --config`.

The stage probes (read, inflate, parse, decode, augment, batch, each per core; the pipeline's start) are
`harness.data.tune.stage_rates`'s (a layer down, shared with `harness train --tune`); here, besides them:

  compute  `harness bench train --data synthetic --like DATA` with the run's batch, precision and strategy
"""
from __future__ import annotations

import math
import tempfile
from typing import Optional

from harness.data.tune import model as tune_model, levers as tune_lib
from harness.data.tune.stage_rates import (COUNT_BATCH, NEGLIGIBLE, PROBE_RECORDS, REPEATS, difference,  # noqa: F401
                                free_disk, one_core, probe, rate_per_core)


def compute_rate(options, label: Optional[str], *, steps: int, warmup: int, data_config: Optional[dict] = None
                 ) -> float:
    """The step's examples/s on synthetic batches shaped like the data (`harness.bench.train.run` with
    `--data synthetic --like DATA`, the run's batch, precision and strategy; no trace, no sampling): `steps` timed
    steps, then, where they lasted less than `harness.train.measure.probe.PROBE_SECONDS`, again with as many as fill it
    (at most PROBE_MAX_STEPS): 20 steps of the ACES points' step gave 289k examples/s, 200 gave 546-722k (the
    calls of auto K need steps to amortize their start)."""
    from harness.train.measure.probe import probe_steps

    rate = _synthetic_rate(options, label, steps=steps, warmup=warmup, data_config=data_config)
    if rate <= 0:
        return rate
    _, wanted = probe_steps(1, (options.per_replica_batch_size or options.global_batch_size) / rate)
    return (_synthetic_rate(options, label, steps=wanted, warmup=warmup, data_config=data_config) if wanted > steps
            else rate)


def _synthetic_rate(options, label: Optional[str], *, steps: int, warmup: int,
                    data_config: Optional[dict] = None) -> float:
    from harness.bench.train import BenchTrainOptions, run

    with tempfile.TemporaryDirectory(prefix="harness-tune-") as out:
        report = run(BenchTrainOptions.from_flags(
            data=("synthetic",), like=tuple(options.data), label=label, data_config=data_config, steps=steps,
            warmup=warmup, output=out,
            per_replica_batch_size=options.per_replica_batch_size or options.global_batch_size,
            precision=options.precision, strategy=options.strategy, cpu_replicas=options.cpu_replicas,
            no_trace=True, no_sampling=True, no_plot=True, seed=options.seed))
    return float(report["summary"]["examples_per_s"])


def run(options, data_config: dict, *, workers: int = 1, records: int = PROBE_RECORDS, compute_steps: int = 20,
        compute: Optional[float] = None, say=print) -> tuple:
    """Probe, decide and print: returns `(Decision, spec)`.

    Args:
      options: the run's `TrainOptions` (data, batch, cache_dir, augment, epochs, ...).
      data_config: the `data:` section (label, bands, ...), as `harness train` refines the inferred spec.
      workers: training workers sharing the export on one host each (each gets 1/workers of the files and
        records; the CPUs and memory are this host's, `resources.detect`).
      compute: the step's examples/s on synthetic batches, measured before (the stages probed again, not the
        step); None: measured now (`compute_rate`, `compute_steps` steps).
    Raises:
      the data layer's errors (discovery, spec) and ConfigError (no label, no records).
    """
    import tensorflow as tf

    from harness.distribute import resources
    from harness.errors import ConfigError
    from harness.data.export.source import open_shards
    from harness.data.input.stages import default_shuffle_buffer
    from harness.train.inputs import resolve_spec

    train = open_shards(options.data, mixer=options.mixer)
    spec = resolve_spec(data_config or {}, train)
    if spec.label is None:
        raise ConfigError(f"no label feature found in {train.shards[0].path}: give --label")
    mine = resources.detect(1)
    say(f"tune: {len(train.files_with_records)} files, {train.records} records; {mine.describe()}")
    batch = options.per_replica_batch_size or options.global_batch_size
    stages = probe(train, spec, batch_size=batch, augment=options.augment, brightness=options.brightness,
                   contrast=options.contrast, cpus=mine.cpus, records=records)
    if compute is None:
        compute = compute_rate(options, (data_config or {}).get("label") or spec.label, steps=compute_steps,
                               warmup=3, data_config=data_config or None)
    measured = tune_model.Measured.from_probe(stages, compute=compute,
                                            compute_on_cpu=not tf.config.list_physical_devices("GPU"))
    say(f"measured on {stages['probed_records']} records of {stages['probed_files']} file(s), examples/s per core:")
    for label, s in measured.rows():
        if s is not None:
            cap = ""
            if s.name == tune_model.BATCH and s.max_cores != 1:
                cap = f", copied on {mine.cpus} threads (batches >= 1 MiB): {s.max_cores:.2f}x one core"
            elif s.name == tune_model.AUGMENT and s.max_cores is not None:
                cap = f", {mine.cpus} calls in flight on {mine.cpus} threads: {s.max_cores:.2f}x one core"
            if not tune_lib.plausible(s):
                cap += (f", {s.per_core * s.out_bytes / 1e9:,.0f} GB/s per core, above what a core's memory moves "
                        f"({tune_lib.MAX_BYTES_PER_CORE_S / 1e9:g} GB/s): the probe measured nothing, not used")
            say(f"  {label:<17} {s.per_core:>12,.0f}  {s.out_bytes:>10,.0f} B out per example{cap}")
    say(f"  {'start':<17} {measured.start_s * 1e3:>12,.1f}  ms: a fresh iterator's start beyond its work "
        "(once, in the first epoch)")
    say(f"  {'compute':<17} {compute:>12,.0f}  examples/s on synthetic batches "
        f"({'CPU' if measured.compute_on_cpu else 'accelerator'})")
    workload = tune_model.Workload(
        records=max(1, train.records // workers), files=max(1, math.ceil(len(train.files_with_records) / workers)),
        batch_size=batch, epochs=options.epochs, cpus=mine.cpus, memory_bytes=mine.memory_bytes,
        disk_bytes=free_disk(options.cache_dir), workers=workers,
        shuffle_buffer=default_shuffle_buffer(max(1, train.records // workers), train.nbytes() / train.records,
                                              options.shuffle_buffer))
    decision = tune_lib.decide(measured, workload)
    for line in decision.lines():
        say(line)
    return decision, spec


def config_text(decision, train: dict, data: dict) -> str:
    """The run config `harness train --config` takes: `train:` the options given (`train`) with the levers of
    `decision` (`Decision.train_options`), `data:` the data section given; each choice and the prediction as
    comments above."""
    import yaml

    def plain(v):
        return list(v) if isinstance(v, tuple) else v

    section = {k: plain(v) for k, v in train.items()}
    section.update(decision.train_options())
    config = {"train": section, **({"data": {k: plain(v) for k, v in data.items()}} if data else {})}
    head = ["# written by `harness tune`: the input pipeline's levers from its measured stages"]
    head += [f"# {line}" for line in decision.lines()]
    return "\n".join(head) + "\n" + yaml.safe_dump(config, sort_keys=False)
