"""Test driver: `harness train ARGS...` in one worker or rank, then one line `RESULT {json}` for the fault tests.

Runs the job as the CLI does (tf.distribute from TF_CONFIG, or `--backend horovod` under horovodrun) and prints
what tests/launch/test_fault_tolerance.py compares: the rank, the final weights' digest, the steps, and the
batches drawn from the input pipeline (the data position), counted where the training loop draws them: inside its
`tf.function`, at each `next(iterator)` (`Trainer._next_batch`), whatever the steps per call. With
HARNESS_TEST_STEP_DELAY_S set, every step waits that many seconds for its batch, so a test can kill a worker in
the middle of an epoch. With HARNESS_TEST_RECORDS_DIR set, every batch drawn is also kept as its records (each
row of the inputs, as text: a record's identity): appended as it is drawn, one line `[row, ...]` per batch in the
order drawn, to `records-<rank>-<pid>.jsonl` there (one write each, unbuffered: what a process drew is on file
whenever and however it ends, a launcher's SIGKILL included). With HARNESS_TEST_EXIT_DELAY_S set, rank 0 waits that
many seconds at exit, so the stop a launcher sends the workers still running (after another one exited) arrives
while it exits, then (with HARNESS_TEST_RECORDS_DIR) writes `exited-<rank>-<pid>` there: it finished its exit.

Errors end the process as `harness train` does (`harness.cli.main`): a `ClusterFault` (a preemption) prints one
line and exits 138, a `HarnessError` (a resume refused) one line and 2.
"""
import atexit
import json
import os
import sys
import time

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
import tensorflow as tf

from harness import exit_codes
from harness.cli import build_parser
from harness.commands.train import options_from_args
from harness.distribute import environment
from harness.errors import ClusterFault, HarnessError
from harness.train import job
from harness.train.loop.trainer import Trainer

delay = float(os.environ.get("HARNESS_TEST_STEP_DELAY_S", "0"))
records_dir = os.environ.get("HARNESS_TEST_RECORDS_DIR")
exit_delay = float(os.environ.get("HARNESS_TEST_EXIT_DELAY_S", "0"))
drawn = []   # batches this process took from its input pipeline: the data position
_next_batch = Trainer._next_batch
config, launcher = environment.read_tf_config(), environment.read_launcher()
rank = config.tasks().index((config.task_type, config.task_index)) if config else launcher.rank if launcher else 0
records = os.open(os.path.join(records_dir, f"records-{rank}-{os.getpid()}.jsonl"),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND) if records_dir else None


def _drew(inputs):
    drawn.append(1)
    if records is not None:   # one write(2) per batch, before the step that trains on it
        rows = [",".join(f"{v:.7g}" for v in row) for row in inputs.numpy().reshape(len(inputs), -1)]
        os.write(records, (json.dumps(rows) + "\n").encode())
    time.sleep(delay)
    return 0


def _exit():
    if exit_delay and rank == 0:
        time.sleep(exit_delay)
        if records_dir:
            open(os.path.join(records_dir, f"exited-{rank}-{os.getpid()}"), "w").close()


atexit.register(_exit)


def counted_next_batch(self, iterator):
    batch = _next_batch(self, iterator)
    flat = tf.nest.flatten(batch, expand_composites=True)
    with tf.control_dependencies(flat):
        count = tf.py_function(_drew, [flat[0]], tf.int32)   # runs once per batch drawn, in the graph
    with tf.control_dependencies([count]):
        return tf.nest.map_structure(tf.identity, batch, expand_composites=True)


Trainer._next_batch = counted_next_batch
args = build_parser().parse_args(["train", *sys.argv[1:]])
options, data = options_from_args(args)
try:
    summary = job.run(options, data_config=data)
except ClusterFault as e:   # as harness.cli.main: one line, the retryable code
    print(f"harness train: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    sys.exit(exit_codes.RETRYABLE)
except HarnessError as e:   # bad input or configuration (a refused resume): one line, the permanent code
    print(f"harness train: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    sys.exit(exit_codes.PERMANENT)
print("RESULT " + json.dumps({
    "rank": rank, "weights_sha256": summary["weights_sha256"], "initial_step": summary["initial_step"],
    "final_step": summary["final_step"], "optimizer_iterations": summary["optimizer_iterations"],
    "epochs_run": [h["epoch"] for h in summary["history"]], "batches_drawn": len(drawn),
    "steps_per_epoch": summary["plan"]["steps_per_epoch"], "preemption_check": summary.get("preemption_check")}),
    flush=True)
