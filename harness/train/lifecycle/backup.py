"""Chief-only writes and resume after a restart (the semantics of Keras' `BackupAndRestore`).

Under MultiWorkerMirroredStrategy every worker must take part in a save (reading sync-on-read variables, such as
BatchNorm statistics, is an all-reduce), so non-chief workers save into a private temporary folder outside the
output folder and delete it (tensorflow.org/tutorials/distribute/multi_worker_with_keras, "Model saving and
loading") at the run's end or exit; the next worker on the host deletes those a killed worker left
(`sweep_copies`). Only the chief writes under `output_dir`. Under Horovod there is no tf.distribute and no
collective in a save: the other ranks neither save nor restore; rank 0's restored state reaches them by broadcast
(`harness.distribute.horovod.broadcast_backup`), so their hosts need not see the output folder.

A backup holds the model, the optimizer (with its step counter and loss scale) and the global step, written at the
end of every epoch, and at a preemption at the step every worker stopped at (`harness.train.lifecycle.preemption`). A
restarted job restores it and continues at the next step: the steps of an epoch interrupted otherwise are rolled
back with the weights and run again from the epoch's first batch; a preempted epoch goes on at its next batch
(`harness.train.lifecycle.resume`). In the final model each epoch's steps are applied exactly once (the global step and
the optimizer's iteration count prove it).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
import weakref

import tensorflow as tf

from harness.errors import ConfigError


log = logging.getLogger(__name__)


FINGERPRINT = "run.json"  # beside the backup: what it was trained with


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """What a backup must agree with to be resumed (`run.json` beside it): the step arithmetic, the data, the
    model's inputs and its Keras kind (`harness.keras_kinds`: a Keras 3 model's variables are not a tf-keras
    model's); and the workers and replicas it was written by (compared by
    `harness.train.lifecycle.resume.check_workers`, which allows another worker count at an epoch end). A fact an
    older backup did not record is not compared."""

    steps_per_epoch: int
    global_batch_size: int
    records: int
    label: str
    bands: list
    input_shape: str
    policy: str
    workers: int
    replicas_per_worker: int
    keras: str = "tf_keras"

    @classmethod
    def of(cls, plan, spec, policy: str, context, keras: str = "tf_keras") -> "Fingerprint":
        """The run's, from its epoch plan, `DataSpec`, precision policy, `WorkerContext` and Keras kind."""
        return cls(steps_per_epoch=plan.steps_per_epoch, global_batch_size=plan.global_batch_size,
                   records=sum(plan.records), label=spec.label, bands=list(spec.bands),
                   input_shape=str(spec.input_shape), policy=policy, workers=context.num_workers,
                   replicas_per_worker=context.replicas_per_worker, keras=keras)


class Backup:
    """The job's restart point.

    Args:
      output_dir: the job's output folder (shared by all workers when they run on several hosts).
      context: the `WorkerContext`; decides who writes where.
      fingerprint: JSON-able facts the backup must agree with to be resumed (steps per epoch, global batch,
        records, label, ...); written beside it by the chief and compared on restore.
      trackables: objects to save, e.g. `model=model, optimizer=optimizer`.
    Attributes:
      step: int64 scalar variable, the global step (optimizer steps taken so far).
      saved_step: the global step of the last backup this process restored or wrote (0: none), what a re-run
        resumes from (`harness.train.lifecycle.peers.resume_from`).
    """

    def __init__(self, output_dir: str, context, *, fingerprint: Fingerprint | None = None, **trackables):
        self.context = context
        self.fingerprint = dataclasses.asdict(fingerprint) if fingerprint is not None else None
        self.saved_step = 0
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.checkpoint = tf.train.Checkpoint(step=self.step, **trackables)
        self.chief_dir = os.path.join(output_dir, "backup")
        self._idle = _skips_writes(context)
        self._write_dir = None if self._idle else self.chief_dir if context.is_chief else _private_copy_dir(
            context.rank)
        self.manager = None if self._idle else tf.train.CheckpointManager(self.checkpoint, self._write_dir,
                                                                          max_to_keep=2)
        # a non-chief's copy goes at `close`, or when the interpreter exits (an error before the run's end)
        self._delete_copy = (weakref.finalize(self, shutil.rmtree, self._write_dir, True)
                             if self._write_dir and not context.is_chief else lambda: None)

    def variables(self) -> list[tf.Variable]:
        """Every variable the backup holds (model, optimizer with its slots, step counter and loss scale, global
        step), in an order that is the same in every process that built the same objects; a Keras 3 variable as
        the `tf.Variable` it holds (`.value`)."""
        _ = self.checkpoint.save_counter  # a restore creates it: create it everywhere, so every rank lists it
        found = []
        for t in tf.train.TrackableView(self.checkpoint).descendants():
            if isinstance(t, tf.Variable):
                found.append(t)
            elif isinstance(getattr(t, "value", None), tf.Variable):   # a Keras 3 variable
                found.append(t.value)
        return found

    def latest_step(self) -> int:
        """The global step this worker's restore would continue from, read without restoring (no collective):
        0 without a backup, -1 when the latest backup cannot be read (half-written, or its files edited). Horovod
        ranks other than 0 read nothing (rank 0's state is broadcast to them): -2.

        Compared over the workers before the restore (`harness.distribute.backend.check_same_step`), since a
        restore under MultiWorkerMirroredStrategy is itself a collective that a worker without a backup skips."""
        if self._idle:
            return -2
        latest = tf.train.latest_checkpoint(self.chief_dir)
        if latest is None:
            return 0
        try:
            return int(tf.train.load_checkpoint(latest).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
        except (tf.errors.OpError, ValueError) as e:
            log.error("backup %s cannot be read: %s", latest, str(e).splitlines()[0])
            return -1

    def restore(self) -> int:
        """Restore the chief's latest backup, if any. Returns the global step to continue from (0: fresh start)."""
        if self._idle:
            return 0  # Horovod: rank 0 restores and broadcasts
        latest = tf.train.latest_checkpoint(self.chief_dir)
        if latest is None:
            return 0
        step = int(tf.train.load_checkpoint(latest).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
        self._check_fingerprint(step)
        self.checkpoint.restore(latest).expect_partial()
        step = self.saved_step = int(self.step.numpy())
        log.info("resumed from %s at global step %d", latest, step)
        return step

    @property
    def restores(self) -> bool:
        """Whether this process reads the backup (not a Horovod rank other than 0, which gets rank 0's state)."""
        return not self._idle

    saved_fingerprint = None
    """The fingerprint the restored backup was written with (`run.json`), None without one."""
    resume_note = None
    """A line saying the backup continues on other workers than wrote it (`resume.check_workers`), or None."""

    def _check_fingerprint(self, step: int) -> None:
        """Raise ConfigError when the backup (at global step `step`) was written by a run with other steps per
        epoch, data or inputs, or on other workers where `harness.train.lifecycle.resume.check_workers` refuses it:
        resuming it would count epochs wrongly or train another model."""
        from harness.train.lifecycle import resume

        path = os.path.join(self.chief_dir, FINGERPRINT)
        if self.fingerprint is None or not tf.io.gfile.exists(path):
            return
        with tf.io.gfile.GFile(path) as f:
            saved = json.load(f)
        self.saved_fingerprint = saved
        self.resume_note = resume.check_workers(saved, self.fingerprint, step, self.chief_dir)
        changed = {k: (saved[k], v) for k, v in self.fingerprint.items()
                   if k in saved and saved[k] != v and k not in resume.COUNT_KEYS}
        if changed:
            what = "; ".join(f"{k}: backup {a!r}, now {b!r}" for k, (a, b) in changed.items())
            raise ConfigError(f"{self.chief_dir} was written by a different run ({what}); resume with the same "
                              "data, batch size, precision and model, or use a new --output")

    def save(self, step: int) -> None:
        """Write the backup at global step `step` (every worker calls this; only the chief's copy is kept)."""
        self.step.assign(step)
        self.saved_step = step
        if self._idle:
            return
        if self.context.is_chief and self.fingerprint is not None:
            # Before the checkpoint, and whole or not at all (renamed into place): a run killed while writing it
            # left an empty file beside a complete checkpoint, and the resume failed on its JSON. tf.io.gfile: the
            # output may be on gs:// (where the rename is a copy, and each object is whole or absent anyway).
            final = os.path.join(self.chief_dir, FINGERPRINT)
            tf.io.gfile.makedirs(self.chief_dir)
            with tf.io.gfile.GFile(final + ".tmp", "w") as f:
                json.dump(self.fingerprint, f, indent=1)
            tf.io.gfile.rename(final + ".tmp", final, overwrite=True)
        path = self.manager.save(checkpoint_number=step)
        if self.context.is_chief:
            log.debug("backup written: %s", path)

    def close(self) -> None:
        """Delete a non-chief worker's temporary copy (again: nothing)."""
        self._delete_copy()


# A non-chief worker's copy: `harness-backup-worker<rank>-pid<pid>-ns<pid namespace>-<random>` in the temporary
# folder. A worker killed (SIGKILL, a lost peer's `os._exit`) cannot delete it, and each left a whole checkpoint
# of the model behind in /tmp; the next worker on the host deletes those of processes gone (`sweep_copies`).
_COPY = re.compile(r"harness-backup-worker\d+-pid(\d+)-ns(\d+)-")


def _pid_namespace() -> str:
    """This process's PID namespace (the inode of /proc/self/ns/pid), "0" where it cannot be read."""
    try:
        return re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        return "0"


def _private_copy_dir(rank: int) -> str:
    sweep_copies()
    return tempfile.mkdtemp(prefix=f"harness-backup-worker{rank}-pid{os.getpid()}-ns{_pid_namespace()}-")


def sweep_copies(folder: str | None = None) -> list[str]:
    """Delete the non-chief workers' backup copies in `folder` (default: the temporary folder) whose process is
    gone: named with a PID of this PID namespace that no process has. A copy of another PID namespace (a container
    sharing the folder) or of a live process is kept.

    Returns the paths deleted."""
    folder = folder or tempfile.gettempdir()
    ns, gone = _pid_namespace(), []
    try:
        names = os.listdir(folder)
    except OSError:
        return gone
    for name in names:
        m = _COPY.match(name)
        if not m or m.group(2) != ns or ns == "0" or _alive(int(m.group(1))):
            continue
        path = os.path.join(folder, name)
        shutil.rmtree(path, ignore_errors=True)
        gone.append(path)
    if gone:
        log.info("deleted %d backup copies of workers gone: %s", len(gone), ", ".join(gone))
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def save_model(model, output_dir: str, context, code=None) -> str | None:
    """Save the model as `output_dir/model.keras` on the chief, with `code` (`harness.model_code.ModelCode`, the
    model file the run was trained with) recorded in it; every worker must call it (see module doc).

    The chief writes the whole file first, then puts it in place in one step (a rename in the same folder; on
    `gs://` one object upload, which replaces the object only once complete): a save that fails leaves the previous
    `model.keras` as it was (or none), never a partial or empty file.

    Returns the chief's path, None on other workers.
    Raises:
      Whatever Keras raises for a model it cannot save (a class without `get_config`), or the file system.
    """
    from harness import model_code

    if _skips_writes(context):
        return None
    if context.is_chief:
        path = os.path.join(output_dir, "model.keras")
        if "://" not in path:
            partial = os.path.join(output_dir, f".model-{os.getpid()}.partial.keras")   # Keras wants `.keras`
            try:
                model.save(partial)
                model_code.write(partial, code)
                os.replace(partial, path)
            finally:
                if os.path.exists(partial):
                    os.remove(partial)
            return path
        # tf_keras 2.18 saves a gs:// path into a local temporary folder and never copies it there
        # (`_support_gcs_uri`, tf_keras/src/saving/saving_api.py): the job ended with no model in the bucket.
        scratch = tempfile.mkdtemp(prefix="harness-model-")
        try:
            model.save(os.path.join(scratch, "model.keras"))
            model_code.write(os.path.join(scratch, "model.keras"), code)
            tf.io.gfile.copy(os.path.join(scratch, "model.keras"), path, overwrite=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return path
    scratch = tempfile.mkdtemp(prefix=f"harness-model-worker{context.rank}-")
    try:
        model.save(os.path.join(scratch, "model.keras"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return None


def _skips_writes(context) -> bool:
    """Non-chief Horovod ranks: their saves would hold no collective, so they do not save at all."""
    return not context.is_chief and context.chief_writes_alone
