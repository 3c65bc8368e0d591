"""A run's inputs, prepared once: shards -> record counts -> feature spec -> epoch plan -> statistics -> datasets.

`prepare` does, in order, every check that can fail before training (each names the file, record and feature):
discover and count the training shards once (`ShardSet`), infer the spec and refine it with what the config
declares, check it against the first record of every shard and the first labels, check the mixer of a whole
export folder, plan the epoch (same steps on every worker), check the validation shards, and sample the band
statistics and the classes. `Inputs.datasets` then builds every worker's input pipeline from the plan's own shard
assignment. `harness train`, `harness bench train` and the coming `predict` all come through here: one path.
`plan` and `finish` are `prepare`'s two halves: `harness train` acts on the epoch plan between them (every rank the
same steps, `--check-sharding`), before the statistics' collectives.
"""
from __future__ import annotations

import dataclasses
import json
import os
import uuid
from typing import Callable, Optional

from harness.data.input import pipeline as pipeline_lib, stages as stages_lib
from harness.data.export import scan
from harness.data.spec import dataspec as spec_lib, infer, validate
from harness.data.export.source import ShardSet, open_shards
from harness.distribute import plan as plan_lib
from harness.distribute import resources as resources_lib
from harness.distribute.sharding import FILE, ShardAssignment
from harness.errors import BatchSizeError, ConfigError, MixerError
from harness.train.options import TrainOptions, class_weights

SAMPLE_BATCHES = 16  # batches sampled for band statistics and the class count
SAMPLE_SHUFFLE = 4   # the sample's shuffle buffer: this many times its records (a training pipeline's default fills
#                      up to 256 MB of records before its first batch: the sample read that much, twice, per worker)


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What the job trains on, decided once per run.

    Attributes:
      train, validation: the training and validation `ShardSet`s (validation None when not given).
      spec: the checked `DataSpec`.
      plan, validation_plan: the epoch plans (`harness.distribute.plan.Plan`): each worker's shard assignment,
        batch sizes and steps.
      num_classes: classes of the label (declared, else the largest label + 1 in a shuffled sample, nodata left
        out); for regression the outputs per pixel (1 unless declared).
      mean, variance: per-band statistics `[bands]` of a sample, for the model's Normalization layer
        (`harness.train.model.builtin.band_moments`): with group_delivery "time" `[bands per group]` over every time
        step, with group_delivery "dict" a dict `{group: [bands of the group]}`.
      class_weights: `[num_classes]` loss weights, or None.
      pipelines: the `PipelinePlan` of every input pipeline this process built, by `(training,
        input_pipeline_id)`: what the profile reports (`worker_facts`), never decided again.
      start: where the training pipelines begin (`datasets`): `{"first_epoch", "skip_batches", "seed"}`.
      resources: this worker's CPUs and memory (`harness.distribute.resources.Resources`): every pipeline's
        parallel reads and cache decision; None: measured when a pipeline is planned.
    """

    train: ShardSet
    validation: Optional[ShardSet]
    spec: spec_lib.DataSpec
    plan: plan_lib.Plan
    validation_plan: Optional[plan_lib.Plan]
    num_classes: int
    mean: object
    variance: object
    class_weights: Optional[list]
    options: TrainOptions
    pipelines: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # This attempt's own tf.data service jobs: a resumed run or another run on the same dispatcher must not join
    # the jobs of an earlier one (a named job is shared: it would skip or split its data, tensorflow#63079).
    run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12], compare=False)
    start: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    resources: Optional[resources_lib.Resources] = dataclasses.field(default=None, compare=False)

    @property
    def all_shards(self) -> list:
        """Training then validation shards: where a failure found during training is searched for."""
        return [*self.train.shards, *(self.validation.shards if self.validation else ())]

    def pipeline_options(self, training: bool) -> stages_lib.PipelineOptions:
        """The input pipeline's options for training (records kept per epoch, shuffle, augment) or evaluation."""
        o, plan, start = self.options, self.plan, self.start if training else {}
        return stages_lib.PipelineOptions(
            per_replica_batch_size=plan.per_replica_batch_size, training=training,
            records_per_epoch=plan.records_kept_per_worker if training else None,
            shuffle_buffer=o.shuffle_buffer, cache=o.cache, cache_dir=o.cache_dir, augment=o.augment and training,
            seed=start.get("seed", o.seed), validate=False,  # validated once by prepare
            brightness=o.brightness if training else 0.0, contrast=o.contrast if training else 0.0,
            first_epoch=start.get("first_epoch", 0), skip_batches=start.get("skip_batches", 0),
            parse=o.parse, parallel_reads=o.parallel_reads, map_parallelism=o.map_parallelism, prefetch=o.prefetch)

    def dataset_fn(self, training: bool) -> Callable:
        """`fn(tf.distribute.InputContext) -> tf.data.Dataset` of one worker, reading the files its plan assigns."""
        plan = self.plan if training else self.validation_plan

        def fn(input_context):
            if input_context.num_input_pipelines != plan.batch.workers:
                raise ConfigError(f"{input_context.num_input_pipelines} input pipelines for a plan of "
                                  f"{plan.batch.workers} workers")
            ds = pipeline_lib.apply_plan(self.pipeline_plan(training, input_context.input_pipeline_id), self.spec)
            if self.options.data_service:
                from harness.data.input import service
                job = service.job_name(self.run_id, training, input_context.input_pipeline_id)
                ds = service.distribute(ds, self.options.data_service, job_name=job)
            return ds
        return fn

    def pipeline_plan(self, training: bool, input_pipeline_id: int) -> stages_lib.PipelinePlan:
        """The stages of one worker's input pipeline (`pipeline.plan_pipeline`), decided once per process: the
        plan `dataset_fn` applies and `worker_facts` reports."""
        key = (training, input_pipeline_id)
        if key not in self.pipelines:
            data, plan = (self.train, self.plan) if training else (self.validation, self.validation_plan)
            resources = self.resources or resources_lib.for_this_process()
            trained = self.pipelines.get((True, input_pipeline_id))
            if not training and trained is not None:   # the memory the training pipeline's cache takes (a run
                # builds it first) is not the validation's to take; `harness evaluate` plans no training pipeline
                held = trained.records * trained.decoded_record_bytes if trained.cache.kind == "memory" else 0
                resources = dataclasses.replace(resources, memory_bytes=max(0, resources.memory_bytes - held))
            self.pipelines[key] = pipeline_lib.plan_pipeline(data, self.spec, self.pipeline_options(training),
                                                             assignment=plan.assignments[input_pipeline_id],
                                                             resources=resources)
        return self.pipelines[key]

    def datasets(self, backend, *, start_step: int = 0, seed: Optional[int] = None) -> tuple:
        """`(training, validation or None)` distributed datasets for `backend` (`TrainingBackend.distribute`).

        Args:
          start_step: the global step training continues after (a resume's): the training pipelines begin at its
            epoch and skip the batches of that epoch already trained on (each replica draws one per step).
          seed: the seed of the epochs' order (`harness.train.lifecycle.resume.data_seed`); None: `options.seed`.
        """
        steps = self.plan.steps_per_epoch
        self.start.update(first_epoch=start_step // steps,
                          skip_batches=(start_step % steps) * self.plan.batch.replicas_per_worker,
                          **({"seed": seed} if seed is not None else {}))
        train = backend.distribute(self.dataset_fn(True))
        val = backend.distribute(self.dataset_fn(False)) if self.validation_plan else None
        return train, val

    def named_error(self, error: Exception) -> Exception:
        """A TensorFlow error raised by the input during training, traced to its file, record and feature
        (`harness.data.export.scan.named_error`)."""
        return scan.named_error(error, self.spec, self.num_classes, self.all_shards)

    def worker_facts(self, rank: int) -> dict:
        """What the profile's advice needs to know of this worker's input."""
        stages = self.pipeline_plan(True, rank)  # the training pipeline this worker built (the cache it applied)
        return {"compression": self.train.shards[0].compression or "none", "files_per_worker": len(stages.files),
                "cpu_count": self.resources.cpus if self.resources else resources_lib.for_this_process().cpus,
                "parallel_reads": stages.parallel_reads, "cache": stages.cache.kind,
                "input_pipeline": stages.describe(),
                "data_service": bool(self.options.data_service),
                "resources": self.resources.to_dict() if self.resources else None}


def resolve_spec(data: dict, train: ShardSet) -> spec_lib.DataSpec:
    """The spec inferred from the training shards, refined by whatever the config or flags declare
    (`infer.refine`: declared keys win, the rest stays as inferred)."""
    inferred = infer.infer_spec(list(train.shards), mixer=train.mixer, label=data.get("label"),
                                  read=train.first_examples, declared=data)
    return infer.refine(inferred, data) if data else inferred


@dataclasses.dataclass(frozen=True)
class Planned:
    """The first half of `prepare` (`plan`): the training shards discovered and counted once, the spec checked
    against their first records, the epoch plan made; nothing else read yet. `harness train` acts on the plan here
    (every rank the same steps, `--check-sharding`) before `finish` reads the statistics over every worker.

    Attributes:
      options: the run's `TrainOptions`.
      train: the training `ShardSet`.
      spec: the checked `DataSpec` (its input fill not yet set).
      plan: the epoch plan (`harness.distribute.plan.Plan`).
    """

    options: TrainOptions
    train: ShardSet
    spec: spec_lib.DataSpec
    plan: plan_lib.Plan


def prepare(options: TrainOptions, backend, *, spec: Optional[spec_lib.DataSpec] = None,
            data_config: Optional[dict] = None, say: Callable[..., None] = lambda *a, **k: None,
            resources: Optional[resources_lib.Resources] = None) -> Inputs:
    """Discover, count and check the data once, plan the epoch and sample the statistics: `plan`, then `finish`.

    Args:
      options: the run's `TrainOptions` (data, batch sizes, cache, ...).
      backend: the `TrainingBackend`: this process's `WorkerContext` (workers, replicas per worker, rank) and
        the all-gather through which every worker takes the same classes and band statistics.
      spec: a `DataSpec`; else inferred from the training shards and refined by `data_config` (the `data:`
        section of a config, see `DataSpec.from_config`).
      say: prints a job-wide line (the chief's print).
      resources: this worker's CPUs and memory, for every input pipeline's defaults; None: measured here
        (`resources.detect` for the context's local size).
    Raises:
      the data layer's errors (discovery, counts, spec, labels, mixer), BatchSizeError, ConfigError (no label,
      training data also used for validation, fewer than 2 classes).
    """
    planned = plan(options, backend, spec=spec, data_config=data_config, say=say)
    return finish(planned, backend, say=say, resources=resources)


def plan(options: TrainOptions, backend, *, spec: Optional[spec_lib.DataSpec] = None,
         data_config: Optional[dict] = None, say: Callable[..., None] = lambda *a, **k: None) -> Planned:
    """The training shards counted once, the spec inferred (or given) and checked against the first records of
    every shard and the first labels, the mixer of a whole export folder checked, the epoch plan made (same steps
    on every worker) and printed. Arguments and errors as `prepare`'s."""
    train = open_counted(options.data, backend, "training data", say, mixer=options.mixer)
    spec = spec or resolve_spec(data_config or {}, train)
    if spec.label is None:
        raise ConfigError(f"no label feature found in {train.shards[0].path}: give --label")
    say(f"spec: {json.dumps(spec.to_config())}")
    for line in spec_lib.layout_notes(spec, infer.read_schema(list(train.shards), read=train.first_examples)):
        say(line)
    check_first_records(spec, train, "training data", say, backend, labels=True)
    _check_mixer(train, options, per_pixel=spec.sequence)
    context = backend.context
    epoch_plan = plan_lib.make_plan(train.counts, workers=context.num_workers,
                                    replicas_per_worker=context.replicas_per_worker,
                                    global_batch_size=options.global_batch_size,
                                    per_replica_batch_size=options.per_replica_batch_size)
    say(epoch_plan.format(options.data))
    return Planned(options=options, train=train, spec=spec, plan=epoch_plan)


def _split(backend):
    """The job's workers as an `index.Split` (this worker's rank, the all-gather), or None on one worker."""
    from harness.data.export import index

    context = backend.context
    return index.Split(context.rank, context.num_workers, backend.allgather) if context.num_workers > 1 else None


def open_counted(sources, backend, what: str, say: Callable[..., None], *, mixer: Optional[str] = None) -> ShardSet:
    """`open_shards` with the record counts split across the job's workers (each counts, or takes from its record
    index, its share of the shards; `index.record_stats`: every worker calls this at the same point), then one
    line of what the counting did: `training data: 40 shard(s), 4,000 records: 20 counted here, 0 from the record
    index (PATH), 20 by the other workers; 0.4 s`."""
    from harness.data.export import index

    split = _split(backend)
    tally: dict = {}
    data = open_shards(sources, mixer=mixer, split=split, tally=tally)
    others = f", {tally['gathered']} by the other workers" if split else ""
    say(f"{what}: {tally['shards']} shard(s), {data.records:,} records: {tally['counted']} counted here, "
        f"{tally['cached']} from the record index ({os.path.join(index.cache_dir(), index.INDEX_NAME)}){others}; "
        f"{tally['seconds']:.1f} s")
    return data


def check_first_records(spec, data: ShardSet, what: str, say: Callable[..., None], backend, *,
                        labels: bool = False) -> None:
    """`validate.validate_shards` (every shard's first record against the spec, one parallel pass; with `labels`
    the label rule), the shards split across the job's workers (every worker calls this at the same point), then
    one line of what it read: `training data: first records of 20 shard(s) checked here, 0 passed the same checks
    in an earlier run (record index), 20 by the other workers; 0.3 s`."""
    import time

    split = _split(backend)
    start = time.perf_counter()
    report = validate.validate_shards(spec, data, labels=labels, split=split)
    others = f", {report.by_other_workers} by the other workers" if split else ""
    say(f"{what}: first records of {len(report.checked) + len(report.empty)} shard(s) checked here, "
        f"{report.passed_before} passed the same checks in an earlier run (record index){others}; "
        f"{time.perf_counter() - start:.1f} s")


def finish(planned: Planned, backend, *, say: Callable[..., None] = lambda *a, **k: None,
           resources: Optional[resources_lib.Resources] = None) -> Inputs:
    """The rest of `prepare` after `plan`: the validation shards checked and planned, the band statistics and the
    classes sampled (the same on every worker: collectives), the input fill of a declared input nodata."""
    options, train, spec, epoch_plan = planned.options, planned.train, planned.spec, planned.plan
    validation, val_plan = _validation(options, train, spec, epoch_plan, backend, say)
    mean, variance, labels, num_classes = _sample(options, train, spec, epoch_plan, backend, say)
    if spec.input_nodata is not None:   # the same on every worker: the chief's sample
        spec = spec.replace(input_fill=spec_lib.input_fill(spec, mean))
        say(f"input nodata {spec.input_nodata:g}: left out of the band statistics, delivered as each channel's mean")
    return Inputs(train=train, validation=validation, spec=spec, plan=epoch_plan, validation_plan=val_plan,
                  num_classes=num_classes, mean=mean, variance=variance,
                  class_weights=class_weights(options.class_weights, num_classes, labels), options=options,
                  resources=resources or resources_lib.detect(backend.context.local_size))


def _validation(options, train: ShardSet, spec, plan, backend, say):
    if not options.validation_data:
        return None, None
    validation = open_counted(options.validation_data, backend, "validation data", say)

    def real(path):
        return path if "://" in path else os.path.realpath(path)
    shared = sorted({real(s.path) for s in train.shards} & {real(s.path) for s in validation.shards})
    if shared:
        raise ConfigError(f"{len(shared)} file(s) are both training and validation data (e.g. {shared[0]}): "
                          "validation would score records the model trained on")
    check_first_records(spec, validation, "validation data", say, backend)
    try:
        val_plan = plan_lib.make_plan(validation.counts, workers=plan.batch.workers,
                                      replicas_per_worker=plan.batch.replicas_per_worker,
                                      per_replica_batch_size=plan.per_replica_batch_size, evaluation=True)
    except BatchSizeError as e:
        raise BatchSizeError(f"validation data: {e}") from None
    say(f"validation: {sum(val_plan.records)} records, each scored once per evaluation (records per worker: "
        f"{'/'.join(map(str, val_plan.records))}; the last batch partial)")
    return validation, val_plan


def _sample(options, train: ShardSet, spec, plan, backend, say):
    """Band statistics and the classes from a shuffled sample of the training records (records of every file,
    not the first file's first batches), the same on every worker: the classes are the largest label over every
    worker's sample + 1, the statistics the chief's (rank 0's). Each worker's own sample differs (the read order
    of a training pipeline is not deterministic), and workers that built models of other shapes would fail in
    their first collective."""
    import numpy as np
    import tensorflow as tf

    from harness.train.model import builtin

    every_file = ShardAssignment(files=tuple(train.files_with_records), policy=FILE, input_pipeline_id=0,
                                 num_input_pipelines=1)
    batch = plan.per_replica_batch_size
    sample = pipeline_lib.build_dataset(
        train, spec, stages_lib.PipelineOptions(per_replica_batch_size=batch, training=True, cache="none",
                                                  seed=options.seed, validate=False,
                                                  shuffle_buffer=SAMPLE_SHUFFLE * SAMPLE_BATCHES * batch),
        assignment=every_file).take(SAMPLE_BATCHES)
    declared = options.num_classes or spec.num_classes or len(spec.class_names) or None
    try:
        ys: list = []   # the sample read once: its labels taken as its moments are
        mean, variance = builtin.band_moments(sample, batches=SAMPLE_BATCHES, nodata=spec.input_nodata, labels_out=ys)
        labels = np.concatenate(ys, axis=0)
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
        raise scan.named_error(e, spec, declared or 0, list(train.shards)) from e
    if spec.task == spec_lib.REGRESSION:
        labels = labels[np.isfinite(labels)]  # nodata (NaN) left out
        largest = 0  # one output per pixel: num_classes 1
    else:
        labels = labels[labels >= 0]  # nodata (IGNORED) is not a class
        largest = int(labels.max()) if labels.size else 0
    if backend.context.num_workers > 1:
        stats = tf.nest.flatten((mean, variance))  # one array each, or one per group (dict delivery)
        rows = backend.allgather([largest, *np.concatenate([np.ravel(s) for s in stats])])
        largest = int(rows[:, 0].max())
        chief = np.split(rows[0, 1:], np.cumsum([np.size(s) for s in stats])[:-1])
        mean, variance = tf.nest.pack_sequence_as(
            (mean, variance), [c.reshape(np.shape(s)).astype(np.asarray(s).dtype) for c, s in zip(chief, stats)])
    if spec.task == spec_lib.REGRESSION:
        return mean, variance, labels, declared or 1
    num_classes = declared or largest + 1
    if declared:
        source = ("--num-classes" if options.num_classes else "data.num_classes" if spec.num_classes else
                  f"the {len(spec.class_names)} class_names {list(spec.class_names)}")
        if options.num_classes and spec.class_names and len(spec.class_names) != options.num_classes:
            raise ConfigError(f"--num-classes {options.num_classes} but {len(spec.class_names)} class_names "
                              f"{list(spec.class_names)}: give one name per class")
        if largest >= declared:
            found = scan.first_bad_label(spec, list(train.shards), declared)
            where = f" (first at {found[0]}: record {found[1]}, value {found[2]:g})" if found else ""
            raise ConfigError(f"label {spec.label!r}: a shuffled sample of {labels.size} label values holds class "
                              f"{largest}{where}, outside the {declared} classes [0, {declared}) of {source}; "
                              f"declare {largest + 1} classes or more" + (" (one name each)" if spec.class_names else ""))
    if spec.ignore_label is not None and 0 <= spec.ignore_label < num_classes:
        say(f"warning: ignore_label {spec.ignore_label:g} is inside the classes [0, {num_classes}): class "
            f"{spec.ignore_label:g} gets no loss and no metrics (its output is never trained); if it is a class, not "
            "nodata, drop ignore_label")
    if not declared:
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
    return mean, variance, labels, num_classes


def _check_mixer(train: ShardSet, options: TrainOptions, *, per_pixel: bool = False) -> None:
    """When the data is given as whole export folders, mixer.json's totalPatches must equal the counted records:
    otherwise a shard was lost (or added), and predictions would not line up with the patch grid. A glob or list
    may name a subset on purpose (a hold-out) and is not checked.

    Raises:
      MixerError: naming the mixer, totalPatches and the records counted, for a whole folder.
    """
    import tensorflow as tf

    from harness.data.export.shards import check_mixer

    if train.mixer is None or not all(tf.io.gfile.isdir(d) for d in options.data):
        return
    try:
        check_mixer(train.mixer, [st.records for st in train.stats], per_pixel=per_pixel)
    except MixerError as e:
        raise MixerError(f"{e}; a shard of the export is missing or extra (to train on a subset on purpose, "
                         "give the shards as a glob)") from None
