"""Test driver: `harness train ARGS...` in one worker or rank, then one line `RESULT {json}` for the fault tests.

Runs the job as the CLI does (tf.distribute from TF_CONFIG, or `--backend horovod` under horovodrun) and prints
what tests/launch/test_fault_tolerance.py compares: the rank, the final weights' digest, the steps, and the
batches drawn from the input pipeline (the data position), counted where the training loop draws them: inside its
`tf.function`, at each `next(iterator)` (`Trainer._next_batch`), whatever the steps per call. With
HARNESS_TEST_STEP_DELAY_S set, every step waits that many seconds for its batch, so a test can kill a worker in
the middle of an epoch.
"""
import json
import os
import sys
import time

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
import tensorflow as tf

from harness.cli import build_parser
from harness.commands.train import options_from_args
from harness.distribute import environment
from harness.train import job
from harness.train.trainer import Trainer

delay = float(os.environ.get("HARNESS_TEST_STEP_DELAY_S", "0"))
drawn = []   # batches this process took from its input pipeline: the data position
_next_batch = Trainer._next_batch


def _drew():
    drawn.append(1)
    time.sleep(delay)
    return 0


def counted_next_batch(self, iterator):
    batch = _next_batch(self, iterator)
    with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
        count = tf.py_function(_drew, [], tf.int32)   # runs once per batch drawn, in the graph
    with tf.control_dependencies([count]):
        return tf.nest.map_structure(tf.identity, batch, expand_composites=True)


Trainer._next_batch = counted_next_batch
args = build_parser().parse_args(["train", *sys.argv[1:]])
options, data = options_from_args(args)
summary = job.run(options, data_config=data)
config, launcher = environment.read_tf_config(), environment.read_launcher()
rank = config.tasks().index((config.task_type, config.task_index)) if config else launcher.rank if launcher else 0
print("RESULT " + json.dumps({
    "rank": rank, "weights_sha256": summary["weights_sha256"], "initial_step": summary["initial_step"],
    "final_step": summary["final_step"], "optimizer_iterations": summary["optimizer_iterations"],
    "epochs_run": [h["epoch"] for h in summary["history"]], "batches_drawn": len(drawn),
    "steps_per_epoch": summary["plan"]["steps_per_epoch"]}), flush=True)
