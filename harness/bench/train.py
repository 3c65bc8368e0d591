"""`harness bench train`: training throughput on synthetic batches (the compute ceiling) or on real shards, profiled.

As tf_cnn_benchmarks' and Horovod's synthetic benchmarks: with `--data synthetic` one random batch per replica is
generated once on the replica's device and fed to every step (`harness.train.loop.synthetic`, which `harness train
--profile`'s input-cost probe uses too), so no input pipeline runs and the figure is what the
model, the precision and the all-reduce allow. With `--data PATH` the harness input pipeline feeds the same model
(`--like PATH` gives a synthetic run the shapes of real shards); the gap between the two is the input pipeline's
cost. Warm-up steps run first and are excluded; then `--steps` timed steps. Several workers come from the
launchers (`harness launch local --workers N -- harness bench train ...`); every worker's steps are gathered to
rank 0, which writes `report.json`, `timeline.png` and prints the table. `--baseline REPORT` (a one-replica run's
report.json) adds the scaling efficiency: job examples/s / (replicas x the baseline's examples/s per replica).
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Optional

from harness.errors import ConfigError
from harness.train.options import TrainOptions

log = logging.getLogger(__name__)

SYNTHETIC = "synthetic"


# The `TrainOptions` fields that are `harness bench train`'s flags too, and its defaults where they differ from
# `harness train`'s: every other field (the optimizer, learning rate, loss, ...) is `harness train`'s default.
TRAIN_FLAGS = ("data", "output", "per_replica_batch_size", "precision", "strategy", "cpu_replicas", "cache",
               "cache_dir", "data_service", "profile_steps", "profile_dir", "seed", "backend")
BENCH_DEFAULTS = {"data": (SYNTHETIC,), "output": "runs/bench", "per_replica_batch_size": 16}


def bench_train_options(**overrides) -> TrainOptions:
    """The `TrainOptions` of a `harness bench train` run: `harness train`'s defaults, then BENCH_DEFAULTS, then
    `overrides` (fields of TRAIN_FLAGS)."""
    return TrainOptions(**{**BENCH_DEFAULTS, **overrides})


@dataclasses.dataclass(frozen=True)
class BenchTrainOptions:
    """`harness bench train`'s options (the flags of the same names; `harness bench train --help`): the run's
    `TrainOptions` and what only a benchmark has. `from_flags` takes them flat, as the command line gives them.

    Attributes:
      train: the run's `TrainOptions` (`bench_train_options`): data (`("synthetic",)`: one random batch per
        replica, generated on its device; or shard paths), output, per_replica_batch_size (examples per replica
        per step), precision, strategy, cpu_replicas, cache, cache_dir, data_service, profile_steps, profile_dir,
        seed, and backend ("tf": tf.distribute, the strategy from `strategy` and TF_CONFIG; "horovod": one
        process per replica under horovodrun/mpirun, `harness train --backend horovod`'s step); the model,
        optimizer and loss are built from it (`harness.train.model.parts.RunParts`).
      like: with synthetic data, shards whose shapes the synthetic batches take.
      label, data_config: the label, or the whole `data:` section (collapsed bands, depths, ...), refining the
        spec inferred from the shards as `harness train` does.
      steps, warmup: timed steps, and untimed first steps (tracing, autotuning, cache fill).
      patch_size, bands, classes: synthetic shapes when `like` is not given (pixels, bands, classes).
      sample_interval: seconds between utilization samples.
      baseline: a one-replica run's report.json, for the scaling efficiency.
    """

    train: TrainOptions = dataclasses.field(default_factory=bench_train_options)
    like: Optional[tuple[str, ...]] = None
    label: Optional[str] = None
    data_config: Optional[dict] = None
    steps: int = 50
    warmup: int = 5
    patch_size: int = 64
    bands: int = 4
    classes: int = 4
    no_trace: bool = False
    no_sampling: bool = False
    sample_interval: float = 0.05
    no_plot: bool = False
    baseline: Optional[str] = None

    def __post_init__(self):
        if tuple(self.train.data) != (SYNTHETIC,) and SYNTHETIC in self.train.data:
            raise ConfigError("--data is either `synthetic` or shard paths, not both (compare two runs' reports)")

    @classmethod
    def from_flags(cls, **flags) -> "BenchTrainOptions":
        """From the flat flags (`harness bench train`'s): those of TRAIN_FLAGS go to `train`, over the bench's
        defaults.

        Raises:
          ConfigError: from `TrainOptions`; TypeError for a name that is no flag.
        """
        train = {k: flags.pop(k) for k in TRAIN_FLAGS if k in flags}
        return cls(train=bench_train_options(**train), **flags)

    def flags(self) -> dict:
        """The flat flags (`from_flags`'s argument): what report.json's "config" holds."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "train"}
        return {**{k: getattr(self.train, k) for k in TRAIN_FLAGS}, **own}

    @property
    def synthetic(self) -> bool:
        return tuple(self.train.data) == (SYNTHETIC,)


def _real_inputs(options: BenchTrainOptions, backend):
    """The training job's own input preparation (`harness.train.inputs.prepare`) for the real shards (or the
    shards `like` names): the same plan, spec, statistics and pipelines as `harness train`."""
    from harness.train.inputs import prepare

    train = dataclasses.replace(options.train, data=tuple(options.like)) if options.synthetic else options.train
    data = options.data_config or ({"label": options.label} if options.label else None)
    return prepare(train, backend, data_config=data)


def run(options: BenchTrainOptions) -> Optional[dict]:
    """Run the benchmark; returns the report on the chief, None on the other workers.

    Raises:
      ConfigError: for a bad --baseline; the errors of `harness.train.inputs.prepare` for real shards.
    """
    from harness.distribute import resources
    from harness.distribute.backend import make_backend
    from harness.distribute.context import one_process_per_replica
    from harness.profile.session import ProfileSession, default_window
    from harness.profile.trace import parse_step_window
    from harness.train.loop import factory
    from harness.train.loop.controller import Schedule
    from harness.train.loop.synthetic import Shapes, synthetic_batches
    from harness.train.model.parts import RunParts

    o = options.train
    backend = make_backend(o.backend, strategy=o.strategy, cpu_replicas=o.cpu_replicas)
    strategy, context = backend.strategy, backend.context
    baseline = load_baseline(options.baseline) if options.baseline else None
    parts = RunParts(o)   # `harness train`'s optimizer, learning rate (constant) and loss; the built-in model
    policy = parts.apply_policy()
    synthetic = options.synthetic
    real = _real_inputs(options, backend) if not synthetic or options.like else None
    shapes = (Shapes.from_spec(real.spec, real.num_classes) if real
              else Shapes("image", (options.patch_size, options.patch_size, options.bands), options.classes))
    batch = factory.synthetic_batch(backend, o.per_replica_batch_size)
    global_batch = batch.global_batch_size
    with strategy.scope():
        moments = dict(mean=real.mean, variance=real.variance) if real else {}
        model = parts.build_builtin(shapes.kind, shapes.input_shape, shapes.num_classes, **moments)
        optimizer = parts.create_optimizer()
    total = options.warmup + options.steps
    window = None if options.no_trace else (parse_step_window(o.profile_steps) if o.profile_steps
                                            else default_window(total, options.warmup))
    session = ProfileSession(context=context, strategy=strategy, output=o.output, trace_steps=window,
                             logdir=o.profile_dir, warmup_steps=options.warmup,
                             interval_s=None if options.no_sampling else options.sample_interval)
    run = factory.build_run(backend, model, optimizer, real.plan if real and not synthetic else batch,
                            Schedule(epochs=1, steps_per_epoch=total, warmup_steps=options.warmup),
                            loss_fn=parts.loss, **session.controller_kwargs())   # K: auto, as `harness train`
    # Horovod: one replica per process, each its own seed (under tf.distribute the replica ids differ already)
    seed = o.seed + (context.rank if one_process_per_replica(backend.name) else 0)
    iterator = (synthetic_batches(strategy, shapes, o.per_replica_batch_size, seed) if synthetic
                else iter(backend.distribute(real.dataset_fn(True))))
    if context.is_chief:
        print(f"bench train: {'synthetic batches on the device' if synthetic else 'real data'}, {shapes.kind} "
              f"{list(shapes.input_shape)}, {shapes.num_classes} classes, {context.replicas_in_sync} replicas x "
              f"{o.per_replica_batch_size} = {global_batch} per step, {policy}, {options.warmup} warm-up + "
              f"{options.steps} timed steps", flush=True)
    with session:
        run.controller.fit(iterator)
    facts = (dict(real.worker_facts(context.rank), synthetic=False) if real and not synthetic
             else {"synthetic": True, "cpu_count": resources.detect(context.local_size).cpus})
    config_out = options.flags()
    config_out.update(policy=policy, global_batch_size=global_batch, shapes=dataclasses.asdict(shapes),
                      context=str(context), plan=real.plan.to_dict() if real and not synthetic else None)
    amend = (lambda r: add_scaling(r, baseline)) if baseline else None
    return session.finish(kind=f"bench-train-{SYNTHETIC if synthetic else 'real'}", config=config_out, facts=facts,
                          plot=not options.no_plot, amend=amend)


def load_baseline(path: str) -> dict:
    """The summary of a one-replica run's report.json.

    Raises:
      ConfigError: if the file is not a report or its run had more than one replica.
    """
    try:
        with open(path) as f:
            base = json.load(f)["summary"]
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"--baseline {path}: not a readable report.json ({e})") from None
    if base["replicas_in_sync"] != 1:
        raise ConfigError(f"--baseline {path} ran {base['replicas_in_sync']} replicas; give a one-replica run")
    return base


def add_scaling(report: dict, base: dict) -> None:
    """Scaling efficiency vs one replica: job examples/s / (replicas x the one-replica run's examples/s)."""
    s = report["summary"]
    s["baseline_examples_per_s"] = base["examples_per_s"]
    s["scaling_efficiency"] = s["examples_per_s"] / (s["replicas_in_sync"] * base["examples_per_s"])
