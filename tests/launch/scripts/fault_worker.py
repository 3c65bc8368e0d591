"""Test driver: `harness train ARGS...` in one worker or rank, then one line `RESULT {json}` for the fault tests.

Runs the job as the CLI does (tf.distribute from TF_CONFIG, or `--backend horovod` under horovodrun) and prints
what tests/launch/test_fault_tolerance.py compares: the rank, the final weights' digest, the steps, and the
batches drawn from the input pipeline (the data position). With HARNESS_TEST_STEP_DELAY_S set, every step waits
that many seconds for its batch, so a test can kill a worker in the middle of an epoch.
"""
import json
import os
import sys
import time

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)

from harness.cli import build_parser
from harness.commands.train import options_from_args
from harness.distribute import environment
from harness.train import job
from harness.train.loop import Trainer

delay = float(os.environ.get("HARNESS_TEST_STEP_DELAY_S", "0"))
drawn = []   # batches this process took from its input pipeline: the data position
_fit = Trainer.fit


def counted(iterator):
    for batch in iterator:
        drawn.append(1)
        time.sleep(delay)
        yield batch


def fit(self, train_iterator, **kwargs):
    return _fit(self, counted(train_iterator), **kwargs)


Trainer.fit = fit
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
