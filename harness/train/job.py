"""`harness train`: the main job, from shards on disk to a trained model.

Order (every step fails before training starts where it can): backend (strategy and worker context) → the
user's model function and loss resolved (`user_model`, `losses`: import errors and Keras 3 refused before any data
is read) → precision policy → inputs (`harness.train.inputs.prepare`: shards counted once, spec checked, epoch
plan, statistics) → model (checked, `--init-from`), schedule and optimizer (`optim`) under the strategy's scope →
restore the backup (broadcast from rank 0 under Horovod) → with `--tune`, the input pipeline's levers
(`harness.train.tune`: probed on each worker's files, the chief's decision applied on all) → the datasets, from
the restored step (a preempted epoch goes on at its next batch) → train (`harness.train.factory` builds the trainer and
the evaluator, `harness.train.controller.Controller` runs the epochs; `control` stops early) → final model and
`summary.json` (chief only).

The job never branches on the backend: tf.distribute and Horovod differ only inside
`harness.distribute.backend.TrainingBackend`.
"""
from __future__ import annotations

import os

from harness.distribute import environment
from harness.distribute import resources as resources_lib
from harness.distribute.backend import TrainingBackend, check_same_step, check_same_weights, make_backend
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
      model_fn: `fn(ModelInputs, **options.model_args) -> tf_keras.Model` of logits (float32 last layer), a user's
        own model (`harness.train.user_model`), called under the strategy's scope once per worker; else
        `options.model` (`MODULE:FUNCTION`), else the built-in U-Net / pixel classifier.
      callbacks: tf_keras callbacks (`harness.train.control.KerasCallbacks`: those that write files on the chief
        only; ModelCheckpoint, BackupAndRestore and EarlyStopping refused for the harness's own flags).
    Raises:
      HarnessError subclasses for bad input, cluster or batch configuration, or a non-finite loss.
      PeerLostError: TensorFlow or Horovod reported a peer gone during training (`harness.train.faults`: the
        peer, its host, the step, the backup a re-run resumes from). A worker with no step progress for
        `HARNESS_PEER_TIMEOUT_S` prints a `StalledWorkerError` line and exits 138 (`harness.train.watchdog`).
    """
    import tensorflow as tf

    from harness.train import (checkpoint, control, inputs as inputs_lib, interrupt, losses, metrics, optim,
                               precision, profiling, results, summaries, user_model)
    from harness.train import factory, faults, resume, watchdog
    from harness.train.controller import Controller, Schedule
    from harness.train.preemption import Preemption

    backend = make_backend(options.backend, strategy=options.strategy, cpu_replicas=options.cpu_replicas,
                           distribution=distribution)
    context, say = backend.context, backend.say
    peer_timeout_s = environment.read_peer_timeout_s()   # a bad value fails before any data is read
    say(f"worker: {context}")
    # Every worker prints its own: the CPUs and memory are each host's (and each process's affinity mask).
    resources = resources_lib.detect(context.local_size)
    print(f"resources: {resources.describe()}", flush=True)
    from harness.train import shared_output
    shared_output.check(options.output, backend)  # a folder private to each host: refused before any data is read
    builder = user_model.resolve(options, model_fn)  # an import failure or a Keras 3 function: before any data
    declared = spec.to_config() if spec is not None else (data_config or {})  # task and nodata: declared, not inferred
    task = declared.get("task") or "classification"
    loss_fn = losses.resolve(options, task, ignore=declared.get("ignore_label") is not None)
    control.check(options, task)  # --monitor of the task's metrics, --min-delta not ignored: before any data
    control.check_callbacks(callbacks)
    policy = precision.apply_policy(options.precision)
    inputs = inputs_lib.prepare(options, backend, spec=spec, data_config=data_config, say=say,
                                resources=resources,
                                on_plan=lambda plan, train: _on_plan(backend, options, plan, train, say))
    plan, spec = inputs.plan, inputs.spec
    losses.probe(loss_fn, spec.label_shape, inputs.num_classes, spec.task)

    with backend.scope():
        model = builder.build(inputs, policy, say)
        schedule = optim.make_schedule(optim.schedule_config(options, plan))  # of optimizer.iterations only
        optimizer = precision.wrap_optimizer(optim.make_optimizer(options, schedule), policy)
        stopper = control.make(options, model, context, checkpoint.save_model)  # its state is backed up
        data_seed = tf.Variable(-1, dtype=tf.int64, trainable=False, name="data_seed")  # the epochs' order
        backup = checkpoint.Backup(options.output, context, fingerprint=_fingerprint(plan, spec, policy, context),
                                   model=model, optimizer=optimizer, data_seed=data_seed,
                                   **({"stopping": stopper.state} if stopper else {}))
        backend.prepare_restore(model, optimizer)
        check_same_step(backend, backup.latest_step())  # before the restore, itself a collective
        initial_step = backup.restore()
    if backup.resume_note:
        say(backup.resume_note)
    initial_step = backup.saved_step = backend.broadcast_backup(backup, initial_step)
    cluster = faults.Cluster.gather(backend)   # the workers' hosts, for a fault's message (a collective on Horovod)
    # The epochs' order: the backup's seed (a resume reads each epoch in the order the first run read it), else
    # --seed, else rank 0's random one; then the datasets, from the epoch and batch the run continues at.
    seed = resume.data_seed(backend, int(data_seed.numpy()), options.seed)
    data_seed.assign(seed)
    def make_trainer(model, optimizer):
        return factory.make_trainer(backend, model, optimizer, plan, loss_fn=loss_fn,
                                    class_weights=inputs.class_weights, clip_norm=options.clip_norm)

    def probe_trainer():  # the input-cost probe's: a fresh model and optimizer, the same step
        with backend.scope():
            fresh = builder.build(inputs, policy)
            fresh_optimizer = precision.wrap_optimizer(optim.make_optimizer(options, schedule), policy)
        return make_trainer(fresh, fresh_optimizer)

    tuned = None
    if options.tune:  # before the datasets: each worker probes its files, every worker applies the chief's levers
        from harness.train import tune as tune_lib
        inputs, tuned = tune_lib.tune(inputs, backend, probe_trainer, say,
                                      compute_on_cpu=not tf.config.list_physical_devices("GPU"),
                                      resuming=initial_step > 0)
    train_ds, val_ds = inputs.datasets(backend, start_step=initial_step, seed=seed)

    run_schedule = Schedule(epochs=options.epochs, steps_per_epoch=plan.steps_per_epoch,
                            steps_per_loop=options.loop_steps)
    profiler = profiling.session(options, backend, run_schedule, plan)
    tensorboard = summaries.EpochSummaries(options.output, context, schedule=schedule, class_names=spec.class_names)
    hooks = dict(profiler.controller_kwargs()) if profiler else {}
    hooks["step_hooks"] = (*hooks.get("step_hooks", ()), tensorboard)

    trainer = make_trainer(model, optimizer)
    evaluator = (factory.make_evaluator(backend, model, metrics.for_task(spec.task, inputs.num_classes),
                                        loss_fn=loss_fn) if val_ds is not None else None)
    if initial_step >= options.epochs * plan.steps_per_epoch:
        say(f"{options.output}: already trained {options.epochs} epochs ({initial_step} steps); nothing to do "
            "(raise --epochs to train on, or use a new --output)")
        return {"initial_step": initial_step, "final_step": initial_step, "history": [], "done": True}
    if initial_step % plan.steps_per_epoch and backup.saved_fingerprint is None and backup.restores:
        # Without run.json a step between epoch ends cannot be told from a plan that changed (a preemption's
        # backup inside an epoch has one: its plan was compared on restore).
        raise ConfigError(f"backup in {backup.chief_dir} is at step {initial_step}, not at an epoch end of "
                          f"{plan.steps_per_epoch} steps: the data or batch size changed since; use a new --output")
    users = control.KerasCallbacks(callbacks, model, context, optimizer) if callbacks else None
    # The stopper decides before the backup (which then holds its state) and stops after it; the user's callbacks
    # see the epoch after the backup (the controller calls them last).
    on_epoch_end = [*backend.epoch_end_callbacks(model), *([stopper.record] if stopper else []), backup.on_epoch_end,
                    tensorboard.on_epoch_end, *([stopper.stop_if_done] if stopper else [])]
    guard = None
    if context.num_workers > 1:   # one process has no peer to wait for
        describe = watchdog.stalled(cluster, backup, peer_timeout_s, trainer.progress)
        guard = watchdog.Watchdog(describe, bound_s=peer_timeout_s, linger_s=describe.linger_s)
    preempt = Preemption(backend, backup, initial_step, hosts=cluster.hosts)  # SIGTERM: every worker backs up at one step and exits 138
    controller = Controller(trainer, run_schedule, context=context, evaluator=evaluator, callbacks=users,
                            on_epoch_end=on_epoch_end, watchdog=guard, on_call_end=preempt.after_call, **hooks)
    if profiler:
        profiler.start()
    try:
        with interrupt.handling():  # Ctrl-C ends the run within one call, also when TensorFlow swallows it
            history = controller.fit(iter(train_ds), validation=(lambda: val_ds) if val_ds else None,
                                     initial_step=initial_step)
    except control.StopTraining as stop:
        say(str(stop))
        history = stop.history
    except tf.errors.InvalidArgumentError as e:
        raise inputs.named_error(e) from e
    except Exception as e:   # a peer gone: one named line (harness.train.faults), else as it is
        lost = faults.peer_lost(e, cluster, controller.step, backup) if context.num_workers > 1 else None
        if lost is None:
            raise
        raise lost from None
    finally:
        if guard is not None:
            guard.close()
        backup.close()   # a non-chief's copy: no backup is written after the last epoch, nor after a fault
    controller.end()
    digest = results.weights_digest(model)
    workers_digests = check_same_weights(backend, digest)
    model_path = checkpoint.save_model(model, options.output, context)

    summary = {"policy": policy, "context": str(context), "plan": plan.to_dict(),
               "weights_sha256": digest, "workers_weights_sha256": workers_digests,
               "initial_step": initial_step, "final_step": history[-1]["step"] if history else initial_step,
               "preemption_check": preempt.stats(), "data_seed": seed,
               "optimizer_iterations": int(optimizer.iterations.numpy()),
               "updates": {"steps": controller.steps_run, "skipped": controller.updates_skipped}, "learning_rate": schedule.get_config(),
               "history": history, "timing": controller.timer.summary(), "model": model_path,
               "evaluation": _evaluation_counts(history, inputs.validation_plan),
               "spec": spec.replace(num_classes=inputs.num_classes).to_config(),  # what `harness predict` reads
               "facts": inputs.worker_facts(context.rank)}  # this worker's CPUs, memory and pipeline
    if tuned is not None:
        summary["tune"] = tuned
    summary["ranks"] = results.rank_stats(backend, plan, summary, say)  # None but on Horovod's rank 0
    if spec.task == "classification" and history and "val_iou" in history[-1]:
        summary["class_names"] = list(spec.class_names) or [str(c) for c in range(inputs.num_classes)]
        summary["per_class"] = metrics.by_class(history[-1], summary["class_names"])
    if stopper:
        best = os.path.join(options.output, "best", "model.keras")
        summary["best"] = stopper.summary(best if context.is_chief and stopper.best_epoch else None)
    if profiler:  # every worker: its steps travel to the chief, which writes report.json
        probe = profiling.probe(probe_trainer, controller, backend, inputs)
        summary["profile"] = profiling.finish(profiler, options, context, inputs, probe=probe)
    if context.is_chief:
        results.write_summary(summary, options.output)
    return summary


def _on_plan(backend: TrainingBackend, options: TrainOptions, plan, train, say) -> None:
    """Right after the epoch plan: ranks agree on the steps, and `--check-sharding` gathers every worker's files
    and checks that they are disjoint and cover every non-empty file (`harness.distribute.mpi.check_sharding`)."""
    backend.agree_steps(plan.steps_per_epoch)
    line = backend.describe()
    if line:
        say(f"{line}; learning rate {options.learning_rate} (not scaled with the ranks unless --scale-lr)")
    from harness.train import optim
    say(optim.describe_peak(options.learning_rate, options.scale_lr, plan.global_batch_size, options.base_batch_size))
    if not options.check_sharding:
        return
    from harness.distribute import mpi

    control = backend.control_plane()
    if control is None:
        raise ConfigError("--check-sharding gathers file sets over Horovod or MPI: use --backend horovod")
    files = train.files_with_records
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


def _fingerprint(plan, spec, policy: str, context) -> dict:
    """What a backup must agree with to be resumed: the step arithmetic, the data and the model's inputs; and the
    workers and replicas it was written by (compared by `harness.train.resume.check_workers`)."""
    return {"steps_per_epoch": plan.steps_per_epoch, "global_batch_size": plan.global_batch_size,
            "records": sum(plan.records), "label": spec.label, "bands": list(spec.bands),
            "input_shape": str(spec.input_shape), "policy": policy,
            "workers": context.num_workers, "replicas_per_worker": context.replicas_per_worker}

