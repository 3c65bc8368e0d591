"""Test driver: `harness train ARGS...` through the CLI (its one-line errors and exit codes) in one worker or rank.

Every batch drawn (inside the training loop's `tf.function`, `Trainer._next_batch`) waits HARNESS_TEST_STEP_DELAY_S
seconds, so a test can act in the middle of an epoch; on the worker or rank HARNESS_TEST_STALL_RANK, the batch
after HARNESS_TEST_STALL_AFTER batches blocks for an hour: an input pipeline stuck in a read, the process alive.
On the worker or rank HARNESS_TEST_CRASH_RANK, the batch of global step HARNESS_TEST_CRASH_AT_STEP + 1 ends the
process (exit 1), at that step on every attempt: a fault that a retry meets again. Rank 1 (of Horovod) sleeps
HARNESS_TEST_LATE_S seconds before `harness train` (after the imports: the lateness is at `hvd.init()`, where Gloo's
rendezvous starts its clock): a rank scheduled late.
"""
import json
import os
import sys
import time

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
import tensorflow as tf

from harness.cli import main
from harness.train.loop.trainer import Trainer

delay = float(os.environ.get("HARNESS_TEST_STEP_DELAY_S", "0"))
stall_rank = int(os.environ.get("HARNESS_TEST_STALL_RANK", "-1"))
stall_after = int(os.environ.get("HARNESS_TEST_STALL_AFTER", "0"))
_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
rank = int(_config["task"]["index"]) if _config else int(os.environ.get("HOROVOD_RANK", "0"))
crash_rank = int(os.environ.get("HARNESS_TEST_CRASH_RANK", "-1"))
crash_at = int(os.environ.get("HARNESS_TEST_CRASH_AT_STEP", "-1"))
drawn = [0]
_next_batch = Trainer._next_batch


def _drew(step):
    if rank == crash_rank and int(step) == crash_at:
        os._exit(1)
    drawn[0] += 1
    if rank == stall_rank and drawn[0] > stall_after:
        time.sleep(3600)
    time.sleep(delay)
    return 0


def counted_next_batch(self, iterator):
    batch = _next_batch(self, iterator)
    with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
        count = tf.py_function(_drew, [self.optimizer.iterations], tf.int32)
    with tf.control_dependencies([count]):
        return tf.nest.map_structure(tf.identity, batch, expand_composites=True)


Trainer._next_batch = counted_next_batch
if os.environ.get("HOROVOD_RANK") == "1":
    time.sleep(float(os.environ.get("HARNESS_TEST_LATE_S", "0")))
sys.exit(main(["train", *sys.argv[1:]]))
