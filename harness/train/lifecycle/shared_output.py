"""Is `--output` one folder for every worker? Checked before training, where a private folder would break later.

Under MultiWorkerMirroredStrategy every worker restores the chief's backup from `OUTPUT/backup`
(`harness.train.lifecycle.backup`): an output folder private to each host (a node's own `/tmp`, an `emptyDir`, a local
disk) trains without complaint and then, on the first resume, worker 0 continues at step N while the others start
again at step 0. Each worker writes a marker named by a nonce the workers agree on, waits for all (one
all-gather), and counts the markers it sees; a worker that sees fewer than all is told which workers it cannot see.
Horovod ranks other than 0 neither read nor write the output folder (rank 0's backup is broadcast), so their hosts
need not see it: nothing is checked there.
"""
from __future__ import annotations

import posixpath
import random
import socket

from harness.errors import ClusterConfigError

MARKER = ".harness-shared-{nonce}-worker{rank}"


def check(output_dir: str, backend) -> None:
    """Raise on every worker when some worker does not see every worker's marker in `output_dir`.

    Four small all-gathers over `backend` (`TrainingBackend.allgather`): the nonce (worker 0's), a barrier after
    the writes, the set of markers each worker sees (a bit mask), a barrier before the markers are removed. Every
    worker must call it at the same point. One worker, or Horovod: returns at once (see the module docstring).

    Raises:
      ClusterConfigError: naming `--output`, each worker that does not see the others, its host, and what to give
        instead (a folder every host mounts, or a gs:// path).
    """
    context = backend.context
    if context.num_workers == 1 or context.chief_writes_alone:
        return
    import tensorflow as tf   # tf.io.gfile: local folders and gs:// alike

    nonce = int(backend.allgather([random.randrange(1, 2 ** 31) if context.is_chief else 0])[0, 0])
    tf.io.gfile.makedirs(output_dir)
    mine = posixpath.join(output_dir, MARKER.format(nonce=nonce, rank=context.rank))
    host = socket.gethostname()
    with tf.io.gfile.GFile(mine, "w") as f:
        f.write(host)
    try:
        backend.allgather([0])   # every marker written before any is counted
        seen = [w for w in range(context.num_workers)
                if tf.io.gfile.exists(posixpath.join(output_dir, MARKER.format(nonce=nonce, rank=w)))]
        mask = sum(1 << w for w in seen)  # exact in float64 below 53 workers; more are not told apart
        masks = [int(m) for m in backend.allgather([mask if context.num_workers <= 52 else len(seen)])[:, 0]]
        backend.allgather([0])   # every count taken before any marker is removed
    finally:
        tf.io.gfile.remove(mine)
    full = (1 << context.num_workers) - 1 if context.num_workers <= 52 else context.num_workers
    blind = [w for w, m in enumerate(masks) if m != full]
    if blind:
        me = "" if context.rank not in blind else f"; this worker ({host}) sees only its own"
        raise ClusterConfigError(
            f"--output {output_dir} is not one folder for all workers: worker(s) {', '.join(map(str, blind))} do "
            f"not see the files the other workers write there{me}. Under MultiWorkerMirroredStrategy every worker "
            "restores the chief's backup from it: give a folder every host mounts (NFS, a shared volume) or a gs:// "
            "path")
