"""A lost peer, named: TensorFlow's and Horovod's errors of a peer that is gone turned into one `PeerLostError`
line naming the worker (or rank), its host, the step and the backup a re-run resumes from.

Where the identity is: under MultiWorkerMirroredStrategy a collective whose peer died fails with gRPC's
`UnavailableError` ("... from remote target /job:worker/replica:0/task:1 while calling
/tensorflow.WorkerService/RecvBuf"), and the coordination service reports a peer whose heartbeats stopped with
its task name; the task name maps to the worker's index and its host in TF_CONFIG (`Cluster.from_tf_config`).
Horovod's errors ("Horovod has been shut down", Gloo's "Connection closed by peer") name no rank: the message then
lists the ranks and their hosts, gathered once at the start over the control plane (`Cluster.gather`).

A peer that is gone without an error (its link down under Horovod, a worker stuck in its input) is the
step-progress watchdog's (`harness.train.lifecycle.watchdog`), which uses the same `Cluster` and `resume_from` texts.
"""
from __future__ import annotations

import dataclasses
import re
import socket
from typing import Optional

from harness.distribute import environment
from harness.errors import HarnessError, PeerLostError

# TensorFlow's task names: /job:worker/replica:0/task:1
_TASK = re.compile(r"/job:(chief|worker)/replica:\d+/task:(\d+)")
# Error classes (by name: Horovod is optional) and texts of a peer that is gone.
_LOST_TYPES = ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError",
               "HorovodInternalError")
_LOST_TEXTS = ("Collective ops is aborted", "heartbeat", "unavailable", "Connection reset by peer",
               "Connection closed by peer", "Horovod has been shut down", "Gloo", "Socket closed")


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The training processes as the messages name them.

    Attributes:
      names: one per process in rank order, e.g. `("worker 0", "worker 1")` or `("rank 0", "rank 1")`.
      hosts: each one's host (TF_CONFIG's address without the port, or the rank's `socket.gethostname()`).
      me: this process's index in `names`.
    """

    names: tuple[str, ...]
    hosts: tuple[str, ...]
    me: int
    tasks: tuple[tuple[str, int], ...] = ()   # TF_CONFIG's (type, index) per name, empty under Horovod

    def describe(self, i: int) -> str:
        """`"worker 1 on host-b"`."""
        return f"{self.names[i]} on {self.hosts[i]}"

    def peers(self) -> str:
        """Every other process, described: `"worker 1 on host-b, worker 2 on host-c"`."""
        return ", ".join(self.describe(i) for i in range(len(self.names)) if i != self.me)

    @classmethod
    def from_tf_config(cls, config: environment.TFConfig) -> "Cluster":
        tasks = tuple(config.tasks())
        return cls(names=tuple(f"{t} {i}" for t, i in tasks),
                   hosts=tuple(config.cluster[t][i].rpartition(":")[0] for t, i in tasks),
                   me=tasks.index((config.task_type, config.task_index)), tasks=tasks)

    @classmethod
    def gather(cls, backend) -> "Cluster":
        """The cluster of `backend` (a `harness.distribute.backend.TrainingBackend`): from TF_CONFIG under
        tf.distribute; under Horovod every rank's hostname, all-gathered once over the control plane (a collective:
        every rank calls this at the same point)."""
        config = environment.read_tf_config()
        if config is not None and len(config.tasks()) > 1:
            return cls.from_tf_config(config)
        context = backend.context
        plane = backend.control_plane() if context.num_workers > 1 else None
        hosts = tuple(plane.allgather(socket.gethostname())) if plane is not None else (socket.gethostname(),)
        prefix = "rank" if plane is not None else "worker"
        return cls(names=tuple(f"{prefix} {i}" for i in range(len(hosts))), hosts=hosts,
                   me=context.rank if plane is not None else 0)

    def named_in(self, text: str) -> list[int]:
        """The indices of the other processes whose TensorFlow task names appear in `text`, in order."""
        found = []
        for task_type, index in _TASK.findall(text):
            key = (task_type, int(index))
            if key in self.tasks:
                i = self.tasks.index(key)
                if i != self.me and i not in found:
                    found.append(i)
        return found


def resume_from(backup) -> str:
    """What a re-run resumes from: `"a re-run resumes from /out/backup at step 32"` (the last backup this
    process wrote or restored, `checkpoint.Backup.saved_step`), or that it starts afresh."""
    step = getattr(backup, "saved_step", 0) if backup is not None else 0
    if not step:
        return "no backup written yet: a re-run starts at step 0"
    return f"a re-run resumes from {backup.chief_dir} at step {step}"


def is_peer_lost(error: BaseException) -> bool:
    """Whether `error` is how TensorFlow or Horovod report a peer that is gone (see the module docstring). Cloud
    Storage giving up after its retries raises the same types: `harness.train.lifecycle.faults` checks for that
    first."""
    if isinstance(error, HarnessError):   # the harness's own errors say what they are
        return False
    names = {c.__name__ for c in type(error).__mro__}
    if names.intersection(_LOST_TYPES):
        return True
    return bool(names.intersection({"OpError", "HorovodInternalError"})) and any(t in str(error) for t in _LOST_TEXTS)


def peer_lost(error: BaseException, cluster: Cluster, step: int, backup) -> Optional[PeerLostError]:
    """The `PeerLostError` for `error` raised at global step `step` (the last step completed), or None when
    `error` is not a lost peer's (then it is raised as it is).

    The message: `worker 1 on host-b is lost (UnavailableError from worker 0 on host-a after step 40: Connection
    reset by peer); a re-run resumes from /out/backup at step 32`."""
    if not is_peer_lost(error):
        return None
    text = str(error)
    named = cluster.named_in(text)
    if not named and len(cluster.names) == 2:   # one peer: the one lost (a heartbeat to it or a call timed out)
        named = [1 - cluster.me]
    who = (", ".join(cluster.describe(i) for i in named) + (" is" if len(named) == 1 else " are")) if named \
        else f"a peer ({cluster.peers() or 'none'}) is"
    cause = _first_line(text)
    stalled = _stall_inspector(text)
    return PeerLostError(f"{who} lost{stalled} ({type(error).__name__} on {cluster.describe(cluster.me)} after "
                         f"step {step}{': ' + cause if cause else ''}); {resume_from(backup)}")


def _stall_inspector(text: str, env=None) -> str:
    """Where Horovod's stall inspector may have ended the job: HOROVOD_STALL_SHUTDOWN_TIME_SECONDS set (and the
    check not disabled) and Horovod's shutdown in `text`, the words that say so; else ""."""
    import os

    env = os.environ if env is None else env
    try:
        bound = int(env.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0") or 0)
    except ValueError:
        return ""
    if bound <= 0 or env.get("HOROVOD_STALL_CHECK_DISABLE", "") not in ("", "0") \
            or "Horovod has been shut down" not in text:
        return ""
    return (f", or stalled: HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={bound} has Horovod's stall inspector end the job "
            f"when a rank waits longer than {bound} s in a collective (the late ranks are marked \"!\" in "
            "Horovod's lines above)")


def _first_line(text: str) -> str:
    """The first informative line of TensorFlow's error text (gRPC's message, the coordination service's), cut to
    160 characters."""
    for pattern in (r'"grpc_message":"([^"]+)"', r"(Collective ops is aborted by: [^\n]+)", r"(heartbeat[^\n]*)",
                    r"(Horovod has been shut down[^\n.]*)"):
        m = re.search(pattern, text)
        if m:
            return _cut(m.group(1))
    lines = [line.strip() for line in text.splitlines() if line.strip() and "Graph execution error" not in line]
    return _cut(lines[0]) if lines else ""


def _cut(line: str, limit: int = 160) -> str:
    """The first sentence of `line`, at most `limit` characters (cut with "...")."""
    line = line.strip().split(". ")[0].rstrip(".")
    return line if len(line) <= limit else line[:limit - 3] + "..."
