"""`harness train` and `harness demo`: the main job, from shards on disk to a trained model.

Order (every step fails before training starts where it can): worker context and strategy → precision policy →
shards, record counts and feature spec checked against the first record of every shard → the epoch plan (same
steps on every worker) → input pipelines per worker → model and optimizer under the strategy's scope → restore
the backup → train → final model and `summary.json` (chief only).

`--backend horovod` runs the same job with one process per device (`harness.distribute.horovod`): the default
strategy, each rank's pipeline built directly for its global rank, Horovod's gradient tape, rank 0's backup
broadcast before the first step, and per-rank statistics gathered to rank 0.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os

from harness.data import pipeline as pipeline_lib
from harness.data import spec as spec_lib
from harness.data.index import record_counts
from harness.data.shards import discover_shards, find_mixer
from harness.distribute import plan as plan_lib
from harness.errors import BatchSizeError, ConfigError

log = logging.getLogger(__name__)

BACKENDS = ("tf", "horovod")  # tf.distribute strategies; Horovod (one process per device)


_INT_FIELDS = {"epochs", "global_batch_size", "per_replica_batch_size", "cpu_replicas", "num_classes",
               "shuffle_buffer", "seed"}
_BOOL_FIELDS = {"augment", "profile", "check_sharding"}


def _check_option_types(options: "TrainOptions") -> None:
    """Raise ConfigError naming `train.<field>`, the value and the expected type (a YAML `epochs: "5"` is a
    string; `true` is not a number)."""
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        if value is None or field.name in ("data", "validation_data"):
            continue
        if field.name in _INT_FIELDS:
            ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif field.name in _BOOL_FIELDS:
            ok, want = isinstance(value, bool), "true or false"
        elif field.name == "learning_rate":
            ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        else:
            ok, want = isinstance(value, str), "a string"
        if not ok:
            raise ConfigError(f"train.{field.name}: expected {want}, got {value!r} ({type(value).__name__})")


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """Everything `harness train` needs besides the data spec. Field names match the command-line flags and the
    `train:` section of the YAML config (flags win)."""

    data: tuple[str, ...]
    validation_data: tuple[str, ...] = ()
    mixer: str | None = None
    epochs: int = 5
    global_batch_size: int | None = None
    per_replica_batch_size: int | None = None
    learning_rate: float = 1e-3
    precision: str = "float32"
    strategy: str = "auto"
    cpu_replicas: int = 1
    output: str = "runs/train"
    num_classes: int | None = None
    class_weights: str = "none"
    cache: str = "auto"
    cache_dir: str | None = None
    shuffle_buffer: int | None = None   # records; None: about 256 MB of records (the pipeline's default)
    augment: bool = False
    seed: int = 0
    profile: bool = False
    profile_steps: str | None = None
    profile_dir: str | None = None
    data_service: str | None = None
    backend: str = "tf"
    check_sharding: bool = False

    def __post_init__(self):
        _check_option_types(self)
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "horovod" and (self.strategy != "auto" or self.cpu_replicas != 1):
            raise ConfigError("--strategy and --cpu-replicas choose a tf.distribute strategy; --backend horovod runs "
                              "one replica per process (start more processes: mpirun -np / horovodrun -np)")
        if self.global_batch_size is None and self.per_replica_batch_size is None:
            object.__setattr__(self, "per_replica_batch_size", 32)
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if not self.learning_rate > 0:
            raise ConfigError(f"learning rate must be > 0, got {self.learning_rate}")


def _file_counts(paths):
    shards = discover_shards(list(paths))
    counts = record_counts(shards)
    return shards, [(s.path, n) for s, n in zip(shards, counts)]


def _class_weights(option: str, num_classes: int, labels) -> list[float] | None:
    """`none`, `balanced` (n / (classes × count_c), as scikit-learn's), or comma-separated weights."""
    import numpy as np
    if option == "none":
        return None
    if option == "balanced":
        counts = np.bincount(np.asarray(labels).ravel(), minlength=num_classes).astype(np.float64)
        return (counts.sum() / (num_classes * np.maximum(counts, 1))).tolist()
    weights = [float(w) for w in option.split(",")]
    if len(weights) != num_classes:
        raise ValueError(f"--class-weights has {len(weights)} values for {num_classes} classes")
    return weights


def run(options: TrainOptions, spec=None, *, data_config: dict | None = None, model_fn=None,
        distribution=None) -> dict:
    """Train; returns the summary dict (also written to `output/summary.json` by the chief).

    Args:
      options: `TrainOptions`.
      spec: a `DataSpec`; else inferred from the training shards and overridden by `data_config` (the `data:`
        section of a config, see `DataSpec.from_config`).
      distribution: `(strategy, context)` already built by `make_strategy`; built from `options` when None.
        The strategy must exist before any other TensorFlow op runs.
      model_fn: `(spec, num_classes, mean, variance) -> keras.Model` for a user's own model (called under the
        strategy's scope); the built-in U-Net / pixel classifier when None.
    Raises:
      HarnessError subclasses for bad input, cluster or batch configuration, or a non-finite loss.
    """
    import tensorflow as tf
    import tf_keras as keras

    from harness.distribute.strategy import make_strategy
    from harness.train import checkpoint, models, precision, summaries
    from harness.train.loop import LoopConfig, Trainer

    if distribution is None and options.backend == "horovod":
        from harness.distribute import horovod as horovod_lib
        distribution = horovod_lib.init()
    strategy, context = distribution or make_strategy(options.strategy, num_cpu_replicas=options.cpu_replicas)
    horovod = _horovod(context)  # the backend module under Horovod, else None
    say = print if context.is_chief else (lambda *a, **k: None)
    say(f"worker: {context}")
    policy = precision.apply_policy(options.precision)

    shards, counts = _file_counts(options.data)
    spec = spec or resolve_spec(data_config or {}, options)
    if spec.label is None:
        raise ConfigError(f"no label feature found in {shards[0].path}: give --label")
    spec_lib.validate_spec(spec, shards)
    _check_class_labels(spec, shards)
    _check_mixer(shards, options, counts)
    plan = plan_lib.make_plan(counts, workers=context.num_workers, replicas_per_worker=context.replicas_per_worker,
                              global_batch_size=options.global_batch_size,
                              per_replica_batch_size=options.per_replica_batch_size)
    say(plan.format())
    control = horovod.control_plane() if horovod else None
    if horovod:
        horovod.agree_steps(plan.steps_per_epoch)
        say(f"Horovod: one replica per rank; learning rate {options.learning_rate} (not scaled with the ranks)")
    if options.check_sharding:
        _check_sharding(control, counts, context, say)
    val_plan = None
    if options.validation_data:
        val_shards, val_counts = _file_counts(options.validation_data)
        def real(path):
            return path if "://" in path else os.path.realpath(path)
        shared = sorted({real(s.path) for s in shards} & {real(s.path) for s in val_shards})
        if shared:
            raise ConfigError(f"{len(shared)} file(s) are both training and validation data (e.g. {shared[0]}): "
                              "validation would score records the model trained on")
        spec_lib.validate_spec(spec, val_shards)
        try:
            val_plan = plan_lib.make_plan(val_counts, workers=context.num_workers,
                                          replicas_per_worker=context.replicas_per_worker,
                                          per_replica_batch_size=plan.per_replica_batch_size)
        except BatchSizeError as e:
            raise BatchSizeError(f"validation data: {e}") from None
        say(f"validation: {val_plan.steps_per_epoch} steps, {sum(val_plan.dropped)} records dropped")

    def dataset_fn(sh, training, records_per_epoch=None):
        def fn(input_context):
            ds = pipeline_lib.build_dataset(
                sh, spec, per_replica_batch_size=plan.per_replica_batch_size, training=training,
                input_pipeline_id=input_context.input_pipeline_id,
                num_input_pipelines=input_context.num_input_pipelines, records_per_epoch=records_per_epoch,
                shuffle_buffer=options.shuffle_buffer, cache=options.cache, cache_dir=options.cache_dir,
                augment=options.augment and training, seed=options.seed)
            if options.data_service:
                from harness.data import service
                job = f"harness-{'train' if training else 'eval'}-p{input_context.input_pipeline_id}"
                ds = service.distribute(ds, options.data_service, job_name=job)
            return ds
        return fn

    # Statistics for the model's Normalization layer and the classes, from a shuffled sample of the training
    # records (records of every file, not the first file's first batches).
    sample = pipeline_lib.build_dataset(shards, spec, per_replica_batch_size=plan.per_replica_batch_size,
                                        training=True, cache="none", seed=options.seed, validate=False
                                        ).take(SAMPLE_BATCHES)
    try:
        mean, variance = models.band_moments(sample, batches=SAMPLE_BATCHES)
        labels = tf.concat([y for _, y in sample], axis=0).numpy()
    except tf.errors.InvalidArgumentError as e:
        raise _named_error(e, spec, options.num_classes or spec.num_classes or 0, shards) from e
    num_classes = options.num_classes or spec.num_classes or int(labels.max()) + 1
    if not (options.num_classes or spec.num_classes):
        say(f"classes: {num_classes} (largest label + 1 in a shuffled sample of {labels.size} label values; "
            "declare --num-classes if a class is rarer than that)")
        seen = sorted(int(v) for v in set(labels.ravel().tolist()))
        if len(seen) > 1 and seen[-1] >= 10 and seen[-1] > 2 * seen[-2] + 1:
            say(f"warning: label {spec.label!r}: the largest value {seen[-1]} is far above the others "
                f"({', '.join(map(str, seen[:-1][:10]))}): a nodata value? It makes {num_classes} classes; mask it "
                "before export or declare --num-classes")
    if num_classes < 2:
        raise ConfigError(f"label {spec.label!r}: only class 0 found in a sample of {labels.size} labels; "
                          "classification needs at least 2 classes (--num-classes)")
    class_weights = _class_weights(options.class_weights, num_classes, labels)

    def distribute(fn):
        if horovod:  # one replica per rank: this rank's own pipeline, sharded by its global rank
            return fn(tf.distribute.InputContext(context.num_workers, context.rank, context.replicas_in_sync))
        return strategy.distribute_datasets_from_function(fn)

    records_per_epoch = plan.steps_per_epoch * plan.per_worker_batch_size
    train_ds = distribute(dataset_fn(shards, True, records_per_epoch))
    val_ds = distribute(dataset_fn(val_shards, False)) if val_plan else None

    with strategy.scope():
        model = (model_fn or _builtin_model)(spec, num_classes, mean, variance)
        optimizer = precision.wrap_optimizer(keras.optimizers.Adam(options.learning_rate), policy)
        backup = checkpoint.Backup(options.output, context, fingerprint=_fingerprint(plan, spec, policy),
                                   model=model, optimizer=optimizer)
        if horovod:
            optimizer.build(model.trainable_variables)  # slots exist before the restore and the broadcast
        initial_step = backup.restore()
    if horovod:
        initial_step = horovod.broadcast_backup(backup)

    # tf.distribute sums the replicas' gradients (divide by the global batch); Horovod's tape averages the ranks'.
    config = LoopConfig(epochs=options.epochs, steps_per_epoch=plan.steps_per_epoch,
                        global_batch_size=plan.global_batch_size,
                        loss_divisor=plan.per_replica_batch_size if horovod else plan.global_batch_size,
                        validation_steps=val_plan.steps_per_epoch if val_plan else 0)
    profiler = _profile_session(options, context, strategy, config, plan)
    trainer = Trainer(model=model, optimizer=optimizer, strategy=strategy, context=context, config=config,
                      class_weights=class_weights,
                      **(profiler.trainer_kwargs() if profiler else {}),
                      **(horovod.trainer_kwargs() if horovod else {}))
    if initial_step >= options.epochs * plan.steps_per_epoch:
        say(f"{options.output}: already trained {options.epochs} epochs ({initial_step} steps); nothing to do "
            "(raise --epochs to train on, or use a new --output)")
        return {"initial_step": initial_step, "final_step": initial_step, "history": [], "done": True}
    if initial_step % plan.steps_per_epoch:
        # Backups are written at epoch ends; a step count between them means the plan changed.
        raise ConfigError(f"backup in {backup.chief_dir} is at step {initial_step}, not at an epoch end of "
                          f"{plan.steps_per_epoch} steps: the data or batch size changed since; use a new --output")
    on_epoch_end = ([horovod.epoch_end_sync(model)] if horovod else []) + [
        backup.on_epoch_end, summaries.EpochSummaries(options.output, context).on_epoch_end]
    if profiler:
        profiler.start()
    try:
        history = trainer.fit(iter(train_ds), validation=(lambda: iter(val_ds)) if val_ds else None,
                              initial_step=initial_step, on_epoch_end=on_epoch_end)
    except tf.errors.InvalidArgumentError as e:
        raise _named_error(e, spec, num_classes, [*shards, *(val_shards if val_plan else [])]) from e
    model_path = checkpoint.save_model(model, options.output, context)
    backup.close()

    summary = {"policy": policy, "context": str(context), "plan": plan.to_dict(),
               "weights_sha256": weights_digest(model),
               "initial_step": initial_step, "final_step": initial_step + len(history) * plan.steps_per_epoch,
               "optimizer_iterations": int(optimizer.iterations.numpy()),
               "history": history, "timing": trainer.timer.summary(), "model": model_path}
    if horovod:
        summary["ranks"] = _gather_rank_stats(control, context, plan, summary, say)
    if profiler:  # every worker: its steps travel to the chief, which writes report.json
        summary["profile"] = _finish_profile(profiler, options, context, plan, shards)
    if context.is_chief:
        _write_summary(summary, options.output)
    return summary


SAMPLE_BATCHES = 16  # batches sampled for band statistics and the class count


def _fingerprint(plan, spec, policy: str) -> dict:
    """What a backup must agree with to be resumed: the step arithmetic, the data and the model's inputs."""
    return {"steps_per_epoch": plan.steps_per_epoch, "global_batch_size": plan.global_batch_size,
            "records": sum(plan.records), "label": spec.label, "bands": list(spec.bands),
            "input_shape": str(spec.input_shape), "policy": policy}


def _check_class_labels(spec, shards, records: int = 16) -> None:
    """Classification labels must be class ids: integral values (Earth Engine stores them as floats, 3.0).

    Raises ConfigError naming the shard, record and value when the first `records` records of the first non-empty
    shard, or the first record of any other shard, hold a label that is not a non-negative integer (a continuous
    band given as --label, a negative nodata value). Records further in are checked by the training step, whose
    failure is traced by harness.data.scan.first_bad_label."""
    import math

    from harness.data.records import first_examples

    if spec.task != "classification":
        return
    checked = 0
    for shard in shards:
        examples = first_examples(shard, records if not checked else 1)
        for i, ex in enumerate(examples):
            values = ex.features.feature[spec.label].float_list.value
            bad = next((v for v in values if not math.isfinite(v) or v != int(v) or v < 0), None)
            if bad is not None:
                raise ConfigError(f"{shard.path}, record {i}: label {spec.label!r} holds {bad!r}, not a class id "
                                  "(a non-negative integer); is it the right --label?")
        checked += len(examples)


def _check_mixer(shards, options: TrainOptions, counts) -> None:
    """When the data is given as whole export folders, mixer.json's totalPatches must equal the counted records:
    otherwise a shard was lost (or added), and predictions would not line up with the patch grid. A glob or list
    may name a subset on purpose (a hold-out) and is not checked.

    Raises:
      MixerError: naming the mixer, totalPatches and the records counted, for a whole folder.
    """
    import tensorflow as tf

    from harness.data.shards import check_mixer
    from harness.errors import MixerError

    if not all(tf.io.gfile.isdir(d) for d in options.data):
        return
    mixer = find_mixer(shards, options.mixer)
    if mixer is not None:
        try:
            check_mixer(mixer, [n for _, n in counts])
        except MixerError as e:
            raise MixerError(f"{e}; a shard of the export is missing or extra (to train on a subset on purpose, "
                             "give the shards as a glob)") from None


def _named_error(error, spec, num_classes: int, shards=()) -> Exception:
    """A named error for TensorFlow errors whose cause the harness knows; else the error itself.

    A parse failure (a record after the first of its shard lacks a feature or holds another number of values)
    is traced to its file, record and feature by scanning `shards` (harness.data.scan.first_bad_record)."""
    import re

    from harness.data import scan
    from harness.data.pipeline import LABEL_CHECK_MESSAGE
    from harness.errors import MissingFeatureError

    text = str(error)
    m = re.search(r"Received a label value of (-?\d+) which is outside the valid range of \[0, (\d+)\)", text)
    if m or LABEL_CHECK_MESSAGE in text:
        named = scan.bad_label_error(spec, shards, num_classes or None) if shards else None
        if named is not None:
            return named
        if m:
            return ConfigError(f"label {spec.label!r}: value {m.group(1)} is outside the {num_classes} classes "
                               f"[0, {num_classes})")
        return ConfigError(f"label {spec.label!r}: a value is not a class id (an integer >= 0"
                           + (f" and < {num_classes})" if num_classes else ")"))
    if re.search(r"Feature: \S+ \(data type: \w+\) is required|Key: \S+[.,]|Can't parse serialized", text) and shards:
        found = scan.first_bad_record(spec, shards)
        if found is not None:
            return found
    m = re.search(r"Feature: (\S+) \(data type: (\w+)\) is required but could not be found", text)
    if m:
        return MissingFeatureError(f"feature {m.group(1)!r} ({m.group(2)}) is missing from a record after the "
                                   "first of its shard (the spec was checked against each shard's first record)")
    return error


def _builtin_model(spec, num_classes: int, mean, variance):
    """The U-Net for image specs, the per-pixel classifier for tables (`harness.train.models`)."""
    from harness.train import models

    if spec.kind == "table":
        return models.pixel_classifier(spec.input_shape[-1], num_classes, mean=mean, variance=variance)
    h, w, bands = spec.input_shape
    return models.unet(h, w, bands, num_classes, mean=mean, variance=variance)


def _write_summary(summary: dict, output: str) -> None:
    """Print the final line and write `output/summary.json` (the chief's job)."""
    t, history = summary["timing"], summary["history"]
    last = history[-1] if history else {}
    print(f"summary: {t['examples_per_s']:.1f} examples/s, input stall {100 * t['input_stall_share']:.1f}% "
          f"over {t['steps']} timed steps, final loss {last.get('loss', float('nan')):.4f}"
          + (f", val_accuracy {last['val_accuracy']:.4f}" if "val_accuracy" in last else "")
          + f"; model: {summary['model']}", flush=True)
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)


def _horovod(context):
    """`harness.distribute.horovod` when the context is a Horovod rank, else None."""
    from harness.distribute.context import Backend
    if context.backend is not Backend.HOROVOD:
        return None
    from harness.distribute import horovod
    return horovod


def _check_sharding(control, counts, context, say) -> None:
    """`--check-sharding`: gather every rank's file assignment (the pipeline's, `sharding.assign_nonempty`) and
    verify that they are disjoint and cover every non-empty file (`harness.distribute.mpi.check_sharding`)."""
    from harness.distribute import mpi
    from harness.distribute.sharding import assign_nonempty
    if control is None:
        if context.num_workers > 1:
            raise ConfigError("--check-sharding gathers file sets over Horovod or MPI: use --backend horovod")
        control = mpi.LocalControlPlane()
    files = [path for path, n in counts if n > 0]
    assignments = mpi.check_sharding(control, assign_nonempty(counts, context.num_workers, context.rank,
                                                               warn=False), files)
    say(mpi.describe_sharding(assignments, files))


def _gather_rank_stats(control, context, plan, summary, say) -> list[dict] | None:
    """Every rank's files, records, dropped records, steps, throughput and weights digest, gathered to rank 0
    (None elsewhere); rank 0 prints them and says whether the final weights are identical on all ranks."""
    import socket
    from harness.distribute.horovod import format_ranks
    timing = summary["timing"]
    mine = {"rank": context.rank, "host": socket.gethostname(), "local_rank": context.local_rank,
            "files": list(plan.files[context.rank]), "records": plan.records[context.rank],
            "dropped": plan.dropped[context.rank], "steps": timing["steps"] + timing["warmup_steps"],
            "examples_per_s": timing["examples_per_s"], "input_stall_share": timing["input_stall_share"],
            "weights_sha256": summary["weights_sha256"]}
    stats = control.gather(mine, root=0)
    if stats is not None:
        say(format_ranks(stats))
        digests = {s["weights_sha256"] for s in stats}
        if len(digests) == 1:
            say(f"final weights identical on all {len(stats)} ranks (sha256 {digests.pop()[:12]})")
        else:
            log.error("final weights differ between ranks: %s", [s["weights_sha256"][:12] for s in stats])
    return stats


def weights_digest(model) -> str:
    """SHA-256 over the model's weights in order: equal on every worker when the replicas are in sync."""
    import hashlib

    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(w.tobytes())
    return digest.hexdigest()


def _profile_session(options: TrainOptions, context, strategy, config, plan):
    """The `ProfileSession` for --profile / --profile-steps, or None."""
    if not (options.profile or options.profile_steps):
        return None
    from harness.profile.session import ProfileSession, default_window
    from harness.profile.trace import parse_step_window

    total = options.epochs * plan.steps_per_epoch
    window = (parse_step_window(options.profile_steps) if options.profile_steps
              else default_window(total, config.warmup_steps))
    return ProfileSession(context=context, strategy=strategy, output=options.output, trace_steps=window,
                          logdir=options.profile_dir, warmup_steps=config.warmup_steps)


def _finish_profile(profiler, options: TrainOptions, context, plan, shards) -> dict | None:
    """Gather and write the profile report; its summary on the chief, None elsewhere."""
    from harness.data.index import record_stats

    mine = set(plan.files[context.rank])
    nbytes = sum(st.bytes for s, st in zip(shards, record_stats(shards)) if s.path in mine)
    choice = pipeline_lib.choose_cache(options.cache, nbytes, cache_dir=options.cache_dir, name="profile")
    facts = {"compression": shards[0].compression or "none", "files_per_worker": len(plan.files[context.rank]),
             "cpu_count": os.cpu_count(), "cache": choice.kind, "data_service": bool(options.data_service)}
    config = dict(dataclasses.asdict(options), plan=plan.to_dict(), context=str(context))
    report = profiler.finish(kind="train", config=config, facts=facts)
    return report["summary"] if report else None


def options_from_args(args) -> tuple[TrainOptions, dict]:
    """Merge the YAML config (`--config`: `data:` and `train:` sections) with the flags given (flags win).

    Returns `(TrainOptions, data section)`. Raises `ConfigError` for unknown keys, naming them and the valid ones.
    """
    import yaml

    config = {}
    if getattr(args, "config", None):
        with open(args.config) as f:
            try:
                config = yaml.safe_load(f) or {}
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
                problem = getattr(e, "problem", None) or str(e).splitlines()[0]
                raise ConfigError(f"{args.config}:{where}: not valid YAML: {problem}") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{args.config}: expected a mapping with sections 'data:' and 'train:', got "
                              f"{type(config).__name__}")
        unknown = set(config) - {"data", "train"}
        if unknown:
            raise ConfigError(f"{args.config}: unknown sections {sorted(unknown)}; expected 'data' and 'train'")
        for section in ("data", "train"):
            if not isinstance(config.get(section) or {}, dict):
                raise ConfigError(f"{args.config}: section '{section}:' must be a mapping of keys to values, got "
                                  f"{config[section]!r}")
    train = dict(config.get("train") or {})
    data = dict(config.get("data") or {})
    given = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in ("command", "verbose",
                                                                                       "config")}
    for key in ("label", "bands"):
        if key in given:
            data[key] = given.pop(key)
    train.update(given)
    fields = {f.name for f in dataclasses.fields(TrainOptions)}
    unknown = set(train) - fields
    if unknown:
        raise ConfigError(f"unknown train options {sorted(unknown)}; valid: {sorted(fields)}")
    if "data" not in train:
        raise ConfigError("no training data: give --data or `train: {data: ...}` in the config")
    for key in ("data", "validation_data"):
        if isinstance(train.get(key), str):
            train[key] = [train[key]]
        if key in train:
            train[key] = tuple(train[key])
    return TrainOptions(**train), data


def main(args) -> int:
    """`harness train ...` (see `harness train --help`)."""
    options, data = options_from_args(args)
    run(options, data_config=data)
    return 0


def resolve_spec(data: dict, options: TrainOptions):
    """The spec inferred from the training shards, overridden by whatever the config or flags declare."""
    shards = discover_shards(list(options.data))
    inferred = spec_lib.infer_spec(shards, mixer=find_mixer(shards, options.mixer), label=data.get("label"))
    if not data:
        return inferred
    config = inferred.to_config()
    if "bands" in data or "band_groups" in data:
        config.pop("dtypes", None)
        config.pop("band_groups", None)
    config.update(data)
    return spec_lib.DataSpec.from_config(config)
