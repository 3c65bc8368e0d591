"""A small JSON record the chief keeps beside a run's backup, for the next attempt to read (`fault.json`: the last
lost peer, `harness.train.lifecycle.repeats`; `attempts.json`: the attempts from one backup step,
`harness.train.lifecycle.attempts`). Local or `gs://` (tf.io.gfile); written whole (a temporary name, then a
rename), so a reader sees the old record or the new one; a record that cannot be read or written is none (the
attempt then runs as the first would: these records refine a fault's verdict, they never stop a run by themselves).
"""
from __future__ import annotations

import json
import os
from typing import Optional


def path(backup, name: str) -> Optional[str]:
    """The record `name` beside `backup`'s chief folder (`Backup.chief_dir`), or None for a run without a backup."""
    folder = getattr(backup, "chief_dir", None)
    return os.path.join(folder, name) if folder else None


def read(where: Optional[str]) -> Optional[dict]:
    """The record at `where` (a JSON object), or None: no path, no file, not JSON, or not an object."""
    import tensorflow as tf

    try:
        if where and tf.io.gfile.exists(where):
            with tf.io.gfile.GFile(where) as f:
                found = json.load(f)
            return found if isinstance(found, dict) else None
    except (OSError, ValueError, tf.errors.OpError):
        return None
    return None


def write(where: Optional[str], record: dict) -> None:
    """Write `record` at `where` whole (`where`.tmp, then renamed over it); nothing on a failure or without a path."""
    import tensorflow as tf

    if not where:
        return
    try:
        tf.io.gfile.makedirs(os.path.dirname(where))
        with tf.io.gfile.GFile(where + ".tmp", "w") as f:
            json.dump(record, f)
        tf.io.gfile.rename(where + ".tmp", where, overwrite=True)
    except (OSError, tf.errors.OpError):
        pass


def remove(where: Optional[str], context) -> None:
    """Delete the record at `where` on the chief (`context.is_chief`), once a run ends well; nothing elsewhere."""
    import tensorflow as tf

    if context.is_chief and where:
        try:
            if tf.io.gfile.exists(where):
                tf.io.gfile.remove(where)
        except (OSError, tf.errors.OpError):
            pass
