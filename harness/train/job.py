"""`harness train`: the main job, from shards on disk to a trained model: inputs -> `build_run` -> fit -> results.

Order (every step fails before training starts where it can): backend (strategy and worker context) -> the checks
that need no data (shared output folder, the user's model function and loss: `harness.train.model.parts.RunParts`,
`--monitor`, callbacks) -> precision policy -> inputs (`harness.train.inputs.plan`: shards counted once, spec checked,
epoch plan; every rank the same steps, `--check-sharding`; `inputs.finish`: validation, statistics) -> model, schedule
and optimizer (`RunParts.build`) under the strategy's scope -> the backup restored
(`harness.train.lifecycle.resume.restore`) -> a user's model saved and loaded again as `predict` will load it
(`RunParts.check_loadable`) -> with `--tune`, the input pipeline's levers (`harness.train.measure.tune`) -> a run
already at its last step: nothing to do, or its final model saved from the backup where that save failed -> the
datasets, from the restored step -> the loop (`harness.train.loop.factory.build_run`, the run's protections as its
actions: `harness.train.lifecycle.guard`) -> `Controller.fit` -> final model (written whole, then renamed: a failed
save keeps the previous one, and the summary says so) and `summary.json` (chief only).

The job never branches on the backend: tf.distribute and Horovod differ only inside
`harness.distribute.backend.TrainingBackend`.
"""
from __future__ import annotations

import functools
import os
import time

from harness.distribute import environment
from harness.distribute import resources as resources_lib
from harness.distribute.backend import TrainingBackend, check_same_weights, make_backend
from harness.errors import ConfigError
from harness.train.options import TrainOptions


def run(options: TrainOptions, spec=None, *, data_config: dict | None = None, model_fn=None,
        distribution=None, callbacks=()) -> dict:
    """Train; returns the summary dict (also written to `output/summary.json` by the chief).

    Args:
      options: `TrainOptions`.
      spec: a `DataSpec`; else inferred from the training shards and refined by `data_config` (the `data:`
        section of a config, see `DataSpec.from_config`).
      distribution: `(strategy, context)` already built by `make_strategy` (or `horovod.init`); built from
        `options` when None. The strategy must exist before any other TensorFlow op runs.
      model_fn: `fn(ModelInputs, **options.model_args) -> keras.Model` (Keras 3 or tf-keras) of logits (float32 last layer), a user's
        own model (`harness.train.model.user`), called under the strategy's scope once per worker; else
        `options.model` (`MODULE:FUNCTION`), else the built-in U-Net / pixel classifier.
      callbacks: Keras callbacks of the model's kind (`harness.train.loop.keras_callbacks.KerasCallbacks`: those that write files on
        the chief only; ModelCheckpoint, BackupAndRestore and EarlyStopping refused for the harness's own flags).
    Raises:
      HarnessError subclasses for bad input, cluster or batch configuration, or a non-finite loss.
      PeerLostError: TensorFlow or Horovod reported a peer gone during training (`harness.train.lifecycle.peers`:
        the peer, its host, the step, the backup a re-run resumes from). A worker with no step progress for
        `HARNESS_PEER_TIMEOUT_S` prints a `StalledWorkerError` line and exits 138 (`harness.train.lifecycle.watchdog`).
      RepeatedFaultError: a lost peer after the same step as the last attempt's (`harness.train.lifecycle.repeats`).
      StorageError: Cloud Storage gave up on an object after TensorFlow's retries (`harness.train.lifecycle.storage`:
        the object, this worker, its host and the step; never a peer).
    """
    import tensorflow as tf

    from harness.train import inputs as inputs_lib
    from harness.train.lifecycle import (attempts, backup as backups, early_stopping, faults, interrupt, peers, repeats,
                                         resume, shared_output)
    from harness.train.loop import keras_callbacks
    from harness.train.loop.controller import StopTraining
    from harness.train.model.parts import RunParts
    from harness.train.report import provenance, tracking

    started = time.time()
    backend, resources, peer_timeout_s = _start(options, distribution)
    context, say = backend.context, backend.say
    # Refused before any data is read: a folder private to each host, an import failure, a loss of the other task, a --monitor the task has not, a callback the harness does itself.
    shared_output.check(options.output, backend)
    declared = spec.to_config() if spec is not None else (data_config or {})  # task and nodata: declared, not inferred
    parts = RunParts.for_data(options, declared, model_fn)   # the model function and the loss, resolved
    early_stopping.check(options, parts.task)
    keras_callbacks.check_callbacks(callbacks)
    policy = parts.apply_policy()
    planned = inputs_lib.plan(options, backend, spec=spec, data_config=data_config, say=say)
    _agree_on_plan(backend, options, planned, say)   # before the statistics' collectives
    inputs = inputs_lib.finish(planned, backend, say=say, resources=resources)
    plan, spec = inputs.plan, inputs.spec
    parts.check_loss(spec.label_shape, inputs.num_classes, spec.task)
    with backend.scope():
        built = parts.build(inputs, say)   # the model, then the schedule and optimizer of its Keras kind
        model, optimizer = built.model, built.optimizer
        stopper = early_stopping.make(options, model, context,   # its state is backed up
                                      functools.partial(backups.save_model, code=parts.code))
        data_seed = tf.Variable(-1, dtype=tf.int64, trainable=False, name="data_seed")  # the epochs' order
        fingerprint = backups.Fingerprint.of(plan, spec, policy, context, built.kind)
        backup = backups.Backup(options.output, context, fingerprint=fingerprint, model=model, optimizer=optimizer,
                                data_seed=data_seed, **({"stopping": stopper.state} if stopper else {}))
        initial_step = resume.restore(backend, backup, model, optimizer, plan, say)
    parts.check_loadable(model, inputs)   # saved and loaded again as predict will: refused now, not after training
    cluster = peers.Cluster.gather(backend)   # the workers' hosts, for a fault's message (a collective on Horovod)
    last_fault = repeats.previous(backup)     # the last attempt's lost peer: one after the same step is no peer's
    attempt = (attempts.begin(backup, context, initial_step, environment.read_max_attempts())   # 137/138 bounded
               if initial_step < options.epochs * plan.steps_per_epoch else None)
    seed = resume.data_seed(backend, int(data_seed.numpy()), options.seed)   # the epochs' order
    data_seed.assign(seed)
    loop_args = _loop_args(options, parts, inputs, model)

    probe_run = _probe_run(backend, parts, inputs, built.schedule, loop_args)

    tuned = None
    if options.tune:  # before the datasets: each worker probes its files, every worker applies the chief's levers
        from harness.train.measure import tune as tune_lib
        inputs, tuned = tune_lib.tune(inputs, backend, probe_run, say, resuming=initial_step > 0,
                                      compute_on_cpu=not tf.config.list_physical_devices("GPU"))
    if initial_step >= options.epochs * plan.steps_per_epoch:
        missing = _final_model_missing(options.output, backend)
        if missing is None:
            say(f"{options.output}: already trained {options.epochs} epochs ({initial_step} steps); nothing to do "
                "(raise --epochs to train on, or use a new --output)")
            return {"initial_step": initial_step, "final_step": initial_step, "history": [], "done": True}
        say(f"{options.output}: already trained {options.epochs} epochs ({initial_step} steps), but {missing}: "
            "saving the model from the backup")
        return _save_from_backup(options, backend, parts, inputs, model, policy=policy, kind=built.kind,
                                 step=initial_step)
    train_ds, val_ds = inputs.datasets(backend, start_step=initial_step, seed=seed)
    # the training input pipeline as this worker built it, once per worker (its line names the worker)
    print(inputs.pipeline_plan(True, context.rank).describe(), flush=True)
    if val_ds is not None:   # its cache decided on the memory the training cache leaves
        print("validation " + inputs.pipeline_plan(False, context.rank).describe(), flush=True)
    ran = provenance.provenance(options, context, started=started, hosts=list(cluster.hosts),   # what runs
                                model=_model_name(options, model_fn, inputs.spec.kind), code=parts.code)
    tracker = _tracker(options, backend, inputs, ran, policy=policy, initial_step=initial_step)   # MLflow, if named
    loop, guard, profiler = _loop(options, backend, parts, inputs, built, backup, loop_args, validating=val_ds is not None,
                                  initial_step=initial_step, cluster=cluster, stopper=stopper,
                                  peer_timeout_s=peer_timeout_s, callbacks=callbacks, tracker=tracker)
    with tracking.ended(tracker):   # FINISHED after the summary; FAILED where anything raised
        controller = loop.controller
        try:
            with interrupt.handling():  # Ctrl-C ends the run within one call, also when TensorFlow swallows it
                history = controller.fit(iter(train_ds), validation=(lambda: val_ds) if val_ds else None,
                                         initial_step=initial_step)
        except StopTraining as stop:
            say(str(stop))
            history = stop.history
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:   # bad input met mid-run
            raise inputs.named_error(e) from e
        except Exception as e:   # storage, a lost peer, a repeated fault: one named line (lifecycle.faults)
            fault = faults.translate(e, cluster=cluster, step=controller.step, backup=backup, context=context,
                                     optimizer=optimizer, last_fault=last_fault, initial_step=initial_step)
            if fault is None:
                raise
            raise attempt.judge(fault) from None
        finally:
            guard.close()
            backup.close()   # a non-chief's copy: no backup is written after the last epoch, nor after a fault
        controller.end()
        if last_fault is not None:
            repeats.clear(backup, context)
        attempts.clear(backup, context)
        summary = _finish(options, backend, inputs, loop, history, initial_step=initial_step, seed=seed,
                          policy=policy, schedule=built.schedule, preemption=guard.preemption, stopper=stopper,
                          tuned=tuned, ran=provenance.finished(ran, started, time.time()), profiler=profiler,
                          probe_run=probe_run, code=parts.code)
    return summary


def _loop_args(options: TrainOptions, parts, inputs, model) -> dict:
    """What every run of the job's step takes besides its model and optimizer: the loss of the model's outputs
    (`RunParts.loss_for`: probabilities where its last layer applies softmax), the class weights, the clipping (the
    main run's and the probes')."""
    return dict(loss_fn=parts.loss_for(model), class_weights=inputs.class_weights, clip_norm=options.clip_norm)


def _probe_run(backend, parts, inputs, schedule, loop_args: dict):
    """`fn(schedule, timer) -> Run`: the probes' run (the input-cost probe, `--tune`, `harness tune`): a fresh
    model and optimizer from the run's parts (the trained weights untouched), the run's step, loss and backend, no
    epoch lines."""
    from harness.train.loop.factory import build_run

    def probe_run(probe_schedule, timer):
        with backend.scope():
            fresh = parts.build(inputs, schedule=schedule)
        return build_run(backend, fresh.model, fresh.optimizer, inputs.plan, probe_schedule, timer=timer,
                         epoch_lines=False, **loop_args)
    return probe_run


def tune(options: TrainOptions, data_config: dict | None = None, *, workers: int = 1, records: int | None = None,
         compute: float | None = None, say=print) -> tuple:
    """`harness tune`: the run's start as `run` makes it (backend, parts, inputs, model), then the tuner of
    `harness train --tune` (`harness.train.measure.tune.measure`: the stages probed on the whole export, the step
    on synthetic batches of the run's model) for `workers` workers on one host each (each 1/workers of the files
    and records; this host's CPUs and memory); returns `(Decision, spec)`. Nothing is trained or written.

    Args:
      records: records each stage's probe reads (None: `stage_rates.PROBE_RECORDS`).
      compute: one worker's examples/s on synthetic batches measured before (the step is not probed again).
    Raises:
      the data layer's errors (discovery, spec), ConfigError (no label, no records), the model's as `run`'s.
    """
    import math

    import tensorflow as tf

    from harness.data.tune.stage_rates import PROBE_RECORDS
    from harness.train import inputs as inputs_lib
    from harness.train.measure import tune as tune_lib
    from harness.train.model.parts import RunParts

    backend = make_backend(options.backend, strategy=options.strategy, cpu_replicas=options.cpu_replicas)
    resources = resources_lib.detect(backend.context.local_size)
    parts = RunParts.for_data(options, data_config or {})
    parts.apply_policy()
    planned = inputs_lib.plan(options, backend, data_config=data_config)
    inputs = inputs_lib.finish(planned, backend, resources=resources)
    train = inputs.train
    say(f"tune: {len(train.files_with_records)} files, {train.records} records; {resources.describe()}")
    parts.check_loss(inputs.spec.label_shape, inputs.num_classes, inputs.spec.task)
    probe_run = None
    if compute is None:   # the step is probed: the run's model, built once
        with backend.scope():
            built = parts.build(inputs)
        probe_run = _probe_run(backend, parts, inputs, built.schedule,
                               _loop_args(options, parts, inputs, built.model))
    tuning = tune_lib.measure(inputs, backend, probe_run, share=train, records_per_worker=train.records // workers,
                              files=math.ceil(len(train.files_with_records) / workers), workers=workers,
                              records=records or PROBE_RECORDS, compute=compute,
                              compute_on_cpu=not tf.config.list_physical_devices("GPU"))
    for line in (*tune_lib.measured_lines(tuning, resources.cpus), *tuning.decision.lines()):
        say(line)
    return tuning.decision, inputs.spec


def _start(options: TrainOptions, distribution) -> tuple:
    """`(backend, resources, peer timeout)`: the backend (strategy and worker context) before any other TensorFlow
    op, `HARNESS_PEER_TIMEOUT_S` read (a bad value fails before any data is read), and every worker's lines: who
    it is (a launcher prefixes its lines), its CPUs and memory (each host's, and each process's affinity mask)."""
    backend = make_backend(options.backend, strategy=options.strategy, cpu_replicas=options.cpu_replicas,
                           distribution=distribution)
    peer_timeout_s = environment.read_peer_timeout_s()
    print(f"worker: {backend.context}", flush=True)
    resources = resources_lib.detect(backend.context.local_size)
    print(f"resources: {resources.describe()}", flush=True)
    return backend, resources, peer_timeout_s


def _loop(options, backend, parts, inputs, built, backup, loop_args: dict, *, validating: bool, initial_step: int,
          cluster, stopper, peer_timeout_s, callbacks, tracker=None) -> tuple:
    """`(Run, Guard, profiler or None)`: the run's loop (`build_run`) with its protections (`Guard`: backups,
    preemption, the step-progress watchdog, early stopping), the profiler's hooks under `--profile`, TensorBoard's
    epoch summaries, the MLflow run's (`tracker`) and the user's callbacks; the profiler started."""
    from harness.train.lifecycle.guard import Guard
    from harness.train.loop import keras_callbacks
    from harness.train.loop.controller import Schedule
    from harness.train.loop.factory import build_run
    from harness.train.measure import profiling
    from harness.train.report import tensorboard

    context, plan = backend.context, inputs.plan
    run_schedule = Schedule(epochs=options.epochs, steps_per_epoch=plan.steps_per_epoch,
                            steps_per_loop=options.loop_steps)
    profiler = profiling.session(options, backend, run_schedule, plan)
    epoch_summaries = tensorboard.EpochSummaries(options.output, context, schedule=built.schedule,
                                                 class_names=inputs.spec.class_names)
    guard = Guard(backend, backup, initial_step=initial_step, cluster=cluster, stopper=stopper,
                  peer_timeout_s=peer_timeout_s, data_service=options.data_service or "")
    loop = build_run(backend, built.model, built.optimizer, plan, run_schedule, guard=guard, backup=backup,
                     metrics=parts.build_metrics(inputs.num_classes, inputs.spec.task) if validating else None,
                     actions=(*(profiler.hooks if profiler else ()), epoch_summaries,
                              *((tracker,) if tracker is not None else ())),
                     timer=profiler.timer if profiler else None,
                     callbacks=keras_callbacks.KerasCallbacks(callbacks, built.model, context, built.optimizer)
                     if callbacks else None, progress_s=options.progress_every, **loop_args)
    if profiler:
        profiler.start()
    return loop, guard, profiler


def _finish(options, backend, inputs, loop, history, *, initial_step, seed, policy, schedule, preemption, stopper,
            tuned, profiler, probe_run, ran, code=None) -> dict:
    """After the last epoch (or an early stop): the weights checked equal on every worker, the final model saved
    (with `code`, the model file, recorded in it), and the summary (`summary.json`, the chief's) with the profile
    report under `--profile`.

    Raises:
      ModelError: the final model could not be saved (after the summary is written, saying so in "model_error";
        the previous `model.keras`, if any, is kept, and the same command run again saves it from the backup).
    """
    from harness.train.lifecycle import backup as backups
    from harness.train.measure import profiling
    from harness.train.model import metrics
    from harness.train.report import run_summary

    context, plan, spec = backend.context, inputs.plan, inputs.spec
    model, optimizer, controller = loop.trainer.model, loop.trainer.optimizer, loop.controller
    digest = run_summary.weights_digest(model)
    workers_digests = check_same_weights(backend, digest)
    try:
        model_path, save_error = backups.save_model(model, options.output, context, code=code), None
    except Exception as e:  # Keras or the file system: the summary says so, then the run fails
        model_path, save_error = None, f"{type(e).__name__}: {_first_line(e)}"
    summary = {"policy": policy, "keras": loop.trainer.kind, "context": str(context), "plan": plan.to_dict(),
               "weights_sha256": digest, "workers_weights_sha256": workers_digests,
               "initial_step": initial_step, "final_step": history[-1]["step"] if history else initial_step,
               "preemption_check": preemption.stats(), "data_seed": seed,
               "optimizer_iterations": int(optimizer.iterations.numpy()),
               "updates": {"steps": controller.steps_run, "skipped": controller.updates_skipped},
               "learning_rate": schedule.get_config(),
               "loss": {"name": options.loss, "focal_gamma": options.focal_gamma},   # what val_loss is of
               "history": history, "timing": controller.timer.summary(), "model": model_path,
               "evaluation": _evaluation_counts(history, inputs.validation_plan),
               "spec": spec.replace(num_classes=inputs.num_classes).to_config(),  # what `harness predict` reads
               "facts": inputs.worker_facts(context.rank)}  # this worker's CPUs, memory and pipeline
    summary["run"] = ran   # what ran: data, model file, optimizer, times, versions (report.provenance)
    if tuned is not None:
        summary["tune"] = tuned
        from harness.train.measure import tune as tune_measure

        line = tune_measure.measured_against_predicted(tuned, history, context.num_workers)
        if line and context.is_chief:
            backend.say(line)
    summary["ranks"] = run_summary.rank_stats(backend, plan, summary, backend.say)  # None but on Horovod's rank 0
    summary["workers"] = run_summary.worker_epochs(backend, history)    # every worker's epochs (harness report)
    if spec.task == "classification" and history and "val_iou" in history[-1]:
        summary["class_names"] = list(spec.class_names) or [str(c) for c in range(inputs.num_classes)]
        summary["per_class"] = metrics.by_class(history[-1], summary["class_names"])
    if stopper:
        best = os.path.join(options.output, "best", "model.keras")
        summary["best"] = stopper.summary(best if context.is_chief and stopper.best_epoch else None)
    if profiler:  # every worker: its steps travel to the chief, which writes report.json
        probe = profiling.probe(probe_run, controller, backend, inputs)
        summary["profile"] = profiling.finish(profiler, options, context, inputs, probe=probe)
    if save_error:
        summary["model_error"] = save_error
    if context.is_chief:
        run_summary.write_summary(summary, options.output)
    if save_error:
        from harness.errors import ModelError
        from harness.run_folder import MODEL_FILE

        path = os.path.join(options.output, MODEL_FILE)
        kept = "the previous one is kept" if context.is_chief and _exists(path) else "none was written"
        raise ModelError(f"{path}: the final model was not saved ({save_error}); {kept}, and summary.json says so "
                         f"(model_error): run the same command again to save it from the backup of step "
                         f"{summary['final_step']}")
    return summary


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[0].strip() if lines else type(error).__name__


def _exists(path: str) -> bool:
    import tensorflow as tf

    return tf.io.gfile.exists(path)


def _final_model_missing(output: str, backend) -> str | None:
    """Why a run folder whose backup is at its last step holds no usable final model, or None when it does: its
    `model.keras` missing or not a Keras file, no `summary.json`, or a summary saying the last save failed. The
    chief looks; every worker gets its answer (one all-gather), so all save, or none.
    """
    import json

    import tensorflow as tf

    from harness import keras_kinds
    from harness.run_folder import MODEL_FILE

    reason = None
    if backend.context.is_chief:
        path, summary = os.path.join(output, MODEL_FILE), os.path.join(output, "summary.json")
        if not tf.io.gfile.exists(path):
            reason = f"it holds no {MODEL_FILE}"
        elif keras_kinds.of_file(path) is None:
            reason = f"its {MODEL_FILE} is not a Keras file"
        elif not tf.io.gfile.exists(summary):
            reason = "it holds no summary.json"
        else:
            with tf.io.gfile.GFile(summary) as f:
                error = json.load(f).get("model_error")
            reason = f"its last save failed ({error})" if error else None
    if backend.context.num_workers > 1 and int(backend.allgather([1.0 if reason else 0.0])[0, 0]) and reason is None:
        reason = "the chief found no usable final model"
    return reason


def _save_from_backup(options: TrainOptions, backend, parts, inputs, model, *, policy: str, kind: str,
                      step: int) -> dict:
    """The final model of a run trained to its last step whose save failed (or never ran), saved from the restored
    backup; its `summary.json` updated ("model" set, "model_error" gone), or, where none was written, one with what
    the commands that read a run need (the spec, the policy, the Keras kind, the step). Every worker calls it.

    Raises:
      ModelError: the save failed again (the summary still says so).
    """
    import json

    import tensorflow as tf

    from harness.errors import ModelError
    from harness.train.lifecycle import backup as backups
    from harness.train.report import run_summary

    context, spec = backend.context, inputs.spec
    try:
        path = backups.save_model(model, options.output, context, code=parts.code)
    except Exception as e:
        raise ModelError(f"{options.output}: the final model was not saved again ({type(e).__name__}: "
                         f"{_first_line(e)}); the backup of step {step} is kept") from e
    summary_path = os.path.join(options.output, "summary.json")
    summary = {"initial_step": step, "final_step": step, "history": [], "policy": policy, "keras": kind,
               "plan": inputs.plan.to_dict(), "spec": spec.replace(num_classes=inputs.num_classes).to_config()}
    if context.is_chief and tf.io.gfile.exists(summary_path):
        with tf.io.gfile.GFile(summary_path) as f:
            summary = json.load(f)
    summary.pop("model_error", None)
    summary.update(model=path, done=True)
    if context.is_chief:
        run_summary.write_summary(summary, options.output)
        backend.say(f"saved {path} from the backup of step {step}")
    return summary


def _tracker(options: TrainOptions, backend, inputs, ran: dict, *, policy, initial_step: int):
    """The run's MLflow run (`harness.train.report.tracking`), opened by the chief where a tracking server is
    named (`--mlflow`, else MLFLOW_TRACKING_URI), before any step, with the run's provenance `ran` as its
    parameters; None where none is. Every worker learns the
    chief's outcome (one allgather): a server the chief cannot reach stops every worker, named.

    Raises:
      ConfigError: the chief could not open the MLflow run (its message on the chief).
    """
    from harness.train.report import tracking

    context = backend.context
    uri = tracking.tracking_uri(options.mlflow)
    tracker, error = None, None
    if uri and context.is_chief:
        tracker = tracking.MLflowRun(uri, context, backend.say, experiment=options.mlflow_experiment,
                                     class_names=inputs.spec.class_names)
        try:
            tracker.start(options.output, tracking.params_of(ran, inputs.plan.to_dict(), policy),
                          {"harness.output": options.output, "harness.initial_step": str(initial_step)},
                          output=options.output, resuming=initial_step > 0)
        except ConfigError as e:
            error = e
    if context.num_workers > 1 and int(backend.allgather([1.0 if error else 0.0])[0, 0]) and error is None:
        raise ConfigError("the chief could not open its MLflow run (its line names the tracking server)")
    if error is not None:
        raise error
    return tracker


def _model_name(options: TrainOptions, model_fn, kind: str) -> str:
    """What built the run's model, as the report names it: the model function given in Python, `--model`, or the
    built-in model of the data kind (`harness.train.model.builtin.builtin_model`)."""
    if model_fn is not None:
        return f"{getattr(model_fn, '__module__', '?')}.{getattr(model_fn, '__qualname__', repr(model_fn))}"
    return options.model or ("built-in U-Net" if kind == "image" else "built-in pixel classifier")


def _agree_on_plan(backend: TrainingBackend, options: TrainOptions, planned, say) -> None:
    """Right after the epoch plan (`harness.train.inputs.plan`): ranks agree on the steps, and `--check-sharding`
    gathers every worker's files and checks that they are disjoint and cover every non-empty file
    (`harness.distribute.mpi.check_sharding`)."""
    plan = planned.plan
    backend.agree_steps(plan.steps_per_epoch)
    line = backend.describe()
    if line:
        say(f"{line}; learning rate {options.learning_rate} (not scaled with the ranks unless --scale-lr)")
    from harness.train.model import optim
    say(optim.describe_peak(options.learning_rate, options.scale_lr, plan.global_batch_size, options.base_batch_size))
    if not options.check_sharding:
        return
    from harness.distribute import mpi

    control = backend.control_plane()
    if control is None:
        raise ConfigError("--check-sharding gathers file sets over Horovod or MPI: use --backend horovod")
    files = planned.train.files_with_records
    assignments = mpi.check_sharding(control, plan.assignments[backend.context.rank], files)
    say(mpi.describe_sharding(assignments, files))


def _evaluation_counts(history: list, validation_plan) -> dict | None:
    """What each epoch's evaluation counted: `{"records_expected": N, "per_epoch": [{"epoch", "records",
    "pixels"}]}` (records: every validation record once; pixels: labels counted, nodata left out), or None
    without validation."""
    if validation_plan is None:
        return None
    return {"records_expected": sum(validation_plan.records),
            "per_epoch": [{"epoch": h["epoch"], "records": h["val_records"], "pixels": h["val_pixels"]}
                          for h in history if "val_records" in h]}
