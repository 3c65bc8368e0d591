"""`harness bench train`: training throughput on synthetic batches (the compute ceiling) or on real shards, profiled.

As tf_cnn_benchmarks' and Horovod's synthetic benchmarks: with `--data synthetic` one random batch per replica is
generated once on the replica's device and fed to every step, so no input pipeline runs and the figure is what the
model, the precision and the all-reduce allow. With `--data PATH` the harness input pipeline feeds the same model
(`--like PATH` gives a synthetic run the shapes of real shards); the gap between the two is the input pipeline's
cost. Warm-up steps run first and are excluded; then `--steps` timed steps. Several workers come from the
launchers (`harness launch local --workers N -- harness bench train ...`); every worker's steps are gathered to
rank 0, which writes `report.json`, `timeline.png` and prints the table. `--baseline REPORT` (a one-replica run's
report.json) adds the scaling efficiency: job examples/s / (replicas x the baseline's examples/s per replica).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
from typing import Optional

from harness.errors import ConfigError

log = logging.getLogger(__name__)

SYNTHETIC = "synthetic"


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What one example looks like: image `[height, width, bands]` with a `[height, width]` mask, or a table row."""

    kind: str
    input_shape: tuple[int, ...]
    num_classes: int


def synthetic_batches(strategy, shapes: Shapes, per_replica_batch: int, seed: int = 0):
    """An endless iterator repeating one distributed batch, generated once on each replica's device."""
    import tensorflow as tf

    devices = strategy.extended.worker_devices  # this worker's replicas, in replica order

    def value_fn(ctx):
        with tf.device(devices[ctx.replica_id_in_sync_group % len(devices)]):
            g = tf.random.Generator.from_seed(seed + ctx.replica_id_in_sync_group)
            x = g.uniform([per_replica_batch, *shapes.input_shape])
            pixels = list(shapes.input_shape[:-1]) if shapes.kind == "image" else []
            y = g.uniform([per_replica_batch, *pixels], maxval=shapes.num_classes, dtype=tf.int32)
        return x, y

    batch = strategy.experimental_distribute_values_from_function(value_fn)
    return itertools.repeat(batch)


def _model(shapes: Shapes, mean=None, variance=None):
    from harness.train import models

    if shapes.kind == "image":
        h, w, bands = shapes.input_shape
        return models.unet(h, w, bands, shapes.num_classes, mean=mean, variance=variance)
    return models.pixel_classifier(shapes.input_shape[-1], shapes.num_classes, mean=mean, variance=variance)


class RealData:
    """The harness input pipeline over real shards for this worker, and what the advice needs to know of it."""

    def __init__(self, paths, *, context, label: Optional[str], per_replica_batch: int, cache: str,
                 cache_dir: Optional[str], data_service: Optional[str], seed: int):
        from harness.data import index, pipeline, spec as spec_lib
        from harness.data.shards import discover_shards, find_mixer
        from harness.distribute import plan as plan_lib
        from harness.train import models

        self.shards = discover_shards(list(paths))
        self.spec = spec_lib.infer_spec(self.shards, mixer=find_mixer(self.shards), label=label)
        if self.spec.label is None:
            raise ConfigError(f"no label feature found in {self.shards[0].path}: give --label")
        counts = index.record_counts(self.shards)
        self.plan = plan_lib.make_plan([(s.path, n) for s, n in zip(self.shards, counts)],
                                       workers=context.num_workers, replicas_per_worker=context.replicas_per_worker,
                                       per_replica_batch_size=per_replica_batch)
        sample = pipeline.build_dataset(self.shards, self.spec, per_replica_batch_size=per_replica_batch,
                                        training=False, cache="none")
        self.mean, self.variance = models.band_moments(sample, batches=2)
        classes = self.spec.num_classes or int(max(int(y.numpy().max()) for _, y in sample.take(4))) + 1
        self.shapes = Shapes(self.spec.kind, tuple(self.spec.input_shape), classes)
        self.options = dict(per_replica_batch_size=per_replica_batch, training=True,
                            records_per_epoch=self.plan.steps_per_epoch * self.plan.per_worker_batch_size,
                            cache=cache, cache_dir=cache_dir, seed=seed)
        self.data_service = data_service
        stats = index.record_stats(self.shards)
        mine = set(self.plan.files[context.rank])
        nbytes = sum(st.bytes for s, st in zip(self.shards, stats) if s.path in mine)
        choice = pipeline.choose_cache(cache, nbytes, cache_dir=cache_dir, name="bench")
        self.facts = {"compression": self.shards[0].compression or "none", "cache": choice.kind,
                      "files_per_worker": len(self.plan.files[context.rank]), "cpu_count": os.cpu_count(),
                      "data_service": bool(data_service), "synthetic": False}

    def iterator(self, strategy):
        from harness.data import pipeline

        def fn(input_context):
            ds = pipeline.build_dataset(self.shards, self.spec, input_pipeline_id=input_context.input_pipeline_id,
                                        num_input_pipelines=input_context.num_input_pipelines, **self.options)
            if self.data_service:
                from harness.data import service
                ds = service.distribute(ds, self.data_service,
                                        job_name=f"harness-bench-p{input_context.input_pipeline_id}")
            return ds

        return iter(strategy.distribute_datasets_from_function(fn))


def run(args) -> Optional[dict]:
    """Run the benchmark; returns the report on the chief, None on the other workers."""
    import tf_keras as keras

    from harness.distribute.strategy import make_strategy
    from harness.profile.session import ProfileSession, default_window
    from harness.profile.trace import parse_step_window
    from harness.train import precision
    from harness.train.loop import LoopConfig, Trainer

    strategy, context = make_strategy(args.strategy, num_cpu_replicas=args.cpu_replicas)
    baseline = load_baseline(args.baseline) if args.baseline else None
    policy = precision.apply_policy(args.precision)
    synthetic = args.data == [SYNTHETIC]
    real = None
    if not synthetic or args.like:
        real = RealData(args.like if synthetic else args.data, context=context, label=args.label,
                        per_replica_batch=args.per_replica_batch_size, cache=args.cache, cache_dir=args.cache_dir,
                        data_service=args.data_service, seed=args.seed)
    shapes = real.shapes if real else Shapes("image", (args.patch_size, args.patch_size, args.bands), args.classes)
    global_batch = args.per_replica_batch_size * context.replicas_in_sync
    with strategy.scope():
        model = _model(shapes, *((real.mean, real.variance) if real else (None, None)))
        optimizer = precision.wrap_optimizer(keras.optimizers.Adam(1e-3), policy)
    total = args.warmup + args.steps
    config = LoopConfig(epochs=1, steps_per_epoch=total, global_batch_size=global_batch, loss_divisor=global_batch,
                        warmup_steps=args.warmup)
    window = None if args.no_trace else (parse_step_window(args.profile_steps) if args.profile_steps
                                         else default_window(total, args.warmup))
    session = ProfileSession(context=context, strategy=strategy, output=args.output, trace_steps=window,
                             logdir=args.profile_dir, warmup_steps=args.warmup,
                             interval_s=None if args.no_sampling else args.sample_interval)
    trainer = Trainer(model=model, optimizer=optimizer, strategy=strategy, context=context, config=config,
                      timer=session.timer, step_hooks=session.hooks)
    iterator = (synthetic_batches(strategy, shapes, args.per_replica_batch_size, args.seed) if synthetic
                else real.iterator(strategy))
    if context.is_chief:
        print(f"bench train: {'synthetic batches on the device' if synthetic else 'real data'}, {shapes.kind} "
              f"{list(shapes.input_shape)}, {shapes.num_classes} classes, {context.replicas_in_sync} replicas x "
              f"{args.per_replica_batch_size} = {global_batch} per step, {policy}, {args.warmup} warm-up + "
              f"{args.steps} timed steps", flush=True)
    with session:
        trainer.fit(iterator)
    facts = real.facts if real and not synthetic else {"synthetic": True, "cpu_count": os.cpu_count()}
    config_out = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    config_out.update(policy=policy, global_batch_size=global_batch, shapes=dataclasses.asdict(shapes),
                      context=str(context), plan=real.plan.to_dict() if real and not synthetic else None)
    amend = (lambda r: add_scaling(r, baseline)) if baseline else None
    return session.finish(kind=f"bench-train-{SYNTHETIC if synthetic else 'real'}", config=config_out, facts=facts,
                          plot=not args.no_plot, amend=amend)


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


def main(args) -> int:
    if args.data != [SYNTHETIC] and SYNTHETIC in args.data:
        raise ConfigError("--data is either `synthetic` or shard paths, not both (compare two runs' reports)")
    run(args)
    return 0
