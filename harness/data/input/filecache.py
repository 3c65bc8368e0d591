"""One live filler per tf.data file cache; what a dead filler left is cleared: `claim`.

tf.data's file cache (`Dataset.cache(path)`, cache_dataset_ops.cc) writes `<path>_<shard>.lockfile` and partial
`<path>_<shard>.data-*` files while the first pass fills it, and `<path>.index` with `<path>.data-*` once the pass
is complete. A process killed mid-fill leaves its lockfile behind, and every later iterator on the path fails with
AlreadyExistsError ("cache lockfile already exists"); two live jobs on one path fail the same way.

`claim` keeps an owner file `<path>.owner` beside the cache, locked with `fcntl.flock` by the process that fills
the cache and held until that process ends. The kernel drops the lock when its owner dies, whatever the signal
(SIGKILL included), so a lock that can be taken means there is no live filler: what a dead one left is removed and
this process fills the cache again. The file records the filler's pid, host and start time for the message of
whoever finds the cache in use. (A pid alone cannot tell a live owner from a reused pid, and two processes
taking over one stale pid file race; a kernel lock has neither problem.) Local file systems only: a `gs://` cache
keeps tf.data's own lockfile alone.
"""
from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import socket
import time

from harness.errors import CacheInUseError

log = logging.getLogger(__name__)

OWNER_SUFFIX = ".owner"
_HELD: dict[str, int] = {}  # cache path -> the locked owner file's descriptor, held for the life of this process


def complete(path: str) -> bool:
    """Whether the file cache at `path` holds a finished pass (tf.data writes `<path>.index` last)."""
    return os.path.exists(path + ".index")


def claim(path: str) -> None:
    """Make this process the filler of the file cache at `path`, unless the cache is complete (then it is read and
    needs no owner). Files a dead filler left (its lockfile, partial data) are removed first.

    Raises:
      CacheInUseError: if another live process holds the unfinished cache; the message names the cache, the
        owner file and the owner's pid, host and start time.
    """
    if "://" in path or path in _HELD or complete(path):
        return
    owner = path + OWNER_SUFFIX
    fd = os.open(owner, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        if complete(path):  # finished while we looked: read it
            return
        raise CacheInUseError(
            f"file cache {path} is being filled by {holder} (owner file {owner}); it can be read once that pass "
            "is complete: wait for the other job's first epoch to end, or give this job another --cache-dir")
    except OSError as e:  # a file system without flock: tf.data's own lockfile still refuses a second filler
        os.close(fd)
        log.warning("cannot lock %s (%s): a cache left by a killed run must be removed by hand", owner, e)
        return
    if complete(path):
        os.close(fd)
        return
    stale = glob.glob(glob.escape(path) + "_*") + glob.glob(glob.escape(path) + ".data-*")
    if stale:
        log.warning("file cache %s: removing %d file(s) of an unfinished fill whose process is gone (%s): %s",
                    path, len(stale), _read(fd), ", ".join(sorted(os.path.basename(f) for f in stale)))
        for f in stale:
            os.remove(f)
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                         "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode(), 0)
    _HELD[path] = fd


def _read(fd: int) -> str:
    """The owner record as words: "pid P on host H since T", or "another process" when unreadable."""
    try:
        r = json.loads(os.pread(fd, 4096, 0).decode())
        return f"pid {r['pid']} on host {r['host']} since {r['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
