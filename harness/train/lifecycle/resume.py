"""What a resumed run must keep from the run that wrote the backup: the epochs' order, and the rule for resuming
on another number of workers.

The rule (`check_workers`). A step is one global batch; an epoch is `steps_per_epoch` steps of it, each record
of the epoch once. A backup resumes on another number of workers or replicas when
  - the global batch and the records are the same and so are the steps per epoch (the plan made on the new
    workers agrees), and
  - the backup is at an epoch end: the next epoch is planned afresh on the new workers (their own files, each
    record once), and the learning-rate schedule, a function of the optimizer's step, goes on where it was.
A backup inside an epoch (a preemption's) is continued only by the workers that wrote it: the rest of that epoch
is each of those workers' files in its own seeded order, past the batches each trained on. Anything else is
refused, naming the old and new worker counts and the flags that would resume it.
"""
from __future__ import annotations

import random

from harness.errors import ConfigError

COUNT_KEYS = ("workers", "replicas_per_worker")   # compared by check_workers, not as a plain fingerprint key


def restore(backend, backup, model, optimizer, plan, say) -> int:
    """Restore `backup` (under the strategy's scope; broadcast from rank 0 under Horovod) and return the global step
    the run continues from, the same on every worker.

    Raises:
      ClusterConfigError: the workers see backups at different steps (`check_same_step`).
      ConfigError: a backup written by another run (`Backup.restore`), on workers it cannot continue on
        (`check_workers`), or inside an epoch without `run.json` (the data or batch size changed since).
    """
    from harness.distribute.backend import check_same_step

    backend.prepare_restore(model, optimizer)
    check_same_step(backend, backup.latest_step())  # before the restore, itself a collective
    step = backup.restore()
    if backup.resume_note:
        say(backup.resume_note)
    step = backup.saved_step = backend.broadcast_backup(backup, step)
    if step:
        say(f"resumed from the backup in {backup.chief_dir} at step {step}")
    if step % plan.steps_per_epoch and backup.saved_fingerprint is None and backup.restores:
        # Without run.json a step between epoch ends cannot be told from a plan that changed (a preemption's
        # backup inside an epoch has one: its plan was compared on restore).
        raise ConfigError(f"backup in {backup.chief_dir} is at step {step}, not at an epoch end of "
                          f"{plan.steps_per_epoch} steps: the data or batch size changed since; use a new --output")
    return step


def data_seed(backend, restored: int, option_seed) -> int:
    """The seed of the epochs' order (`harness.data.input.pipeline._epochs`), the same on every worker: the one the
    backup holds (`restored` >= 0), else `--seed` (`option_seed`), else rank 0's random draw (an all-gather)."""
    if restored >= 0:
        return restored
    if option_seed is not None:
        return int(option_seed)
    mine = random.randrange(2 ** 31)
    if backend.context.num_workers == 1:
        return mine
    return int(backend.allgather([mine])[0, 0])


def check_workers(saved: dict, now: dict, step: int, where: str) -> str | None:
    """Refuse to resume the backup in `where` at global step `step`, written with the fingerprint `saved`, on the
    workers of `now` (`harness.train.lifecycle.backup.Fingerprint`), when the rule of the module docstring forbids it.

    Returns:
      None when the workers are those that wrote it, else the line that says the resume continues on other
      workers (the job prints it).

    Raises:
      ConfigError: naming the old and new worker counts (and replicas), the global batch and steps per epoch of
        both, and the flags that would resume: the old `--workers`, or the `--global-batch-size` (or the
        `--per-replica-batch-size`) that keeps the old global batch on the new workers.
    """
    if "workers" not in saved or all(saved.get(k) == now.get(k) for k in COUNT_KEYS):
        return None
    old_w, old_r = saved["workers"], saved.get("replicas_per_worker", 1)
    new_w, new_r = now["workers"], now["replicas_per_worker"]
    old_g, new_g = saved.get("global_batch_size"), now.get("global_batch_size")
    old_s, new_s = saved.get("steps_per_epoch"), now.get("steps_per_epoch")
    if old_g == new_g and old_s == new_s and saved.get("records") == now.get("records"):
        if step % old_s == 0:  # an epoch end: the next epoch is planned on the new workers
            return (f"{where}: written by {_count(old_w, old_r)} at the end of epoch {step // old_s}, continued on "
                    f"{_count(new_w, new_r)}: the same global batch {new_g} and {new_s} steps per epoch; epoch "
                    f"{step // old_s + 1} on is planned on the {new_w} worker{'s' if new_w > 1 else ''}")
        epoch, done = step // old_s + 1, step % old_s
        raise ConfigError(
            f"{where} is at step {step}, {done} of the {old_s} steps of epoch {epoch} (a preemption's backup), "
            f"written by {_count(old_w, old_r)}; now {_count(new_w, new_r)}: the rest of that epoch is the "
            f"{old_w} workers' own files past the batches each trained on, so only {old_w} workers continue it: "
            f"run the same command on {old_w} workers (harness launch local --workers {old_w}, horovodrun -np "
            f"{old_w * old_r})")
    keep = []
    replicas = new_w * new_r
    if old_g is not None and old_g % replicas == 0:
        keep.append(f"--global-batch-size {old_g} (--per-replica-batch-size {old_g // replicas} on "
                    f"{replicas} replica{'s' if replicas > 1 else ''})")
    keep.append(f"{old_w} workers (harness launch local --workers {old_w}, horovodrun -np {old_w * old_r})")
    raise ConfigError(
        f"{where} was written by {_count(old_w, old_r)} (global batch {old_g}, {old_s} steps per epoch); now "
        f"{_count(new_w, new_r)} (global batch {new_g}, {new_s} steps per epoch): resuming would change the "
        f"steps of an epoch; resume with {' or on '.join(keep)}, or use a new --output")


def _count(workers: int, replicas: int) -> str:
    return f"{workers} worker{'s' if workers > 1 else ''}" + (f" x {replicas} replicas" if replicas > 1 else "")
