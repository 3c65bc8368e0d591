"""Test driver: `harness.train.job.run` with early stopping, killed (SIGKILL, no cleanup) at the end of a chosen
epoch, after that epoch's backup is written.

Usage: early_stop_worker.py OUTPUT TRAIN VAL KILL_AT_EPOCH (0: never). Prints `EPOCH {logs}` per epoch and
`RESULT {json}` at the end.
"""
import json
import os
import signal
import sys

import harness  # noqa: F401
import tf_keras as keras

from harness.train import job


class KillAt(keras.callbacks.Callback):
    """Prints each epoch's numbers; SIGKILLs this process at the end of epoch `epoch` (the harness calls user
    callbacks after the backup of the epoch)."""

    def __init__(self, epoch: int):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        print("EPOCH " + json.dumps({"epoch": epoch + 1, **logs}), flush=True)
        if epoch + 1 == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    output, train, val, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    options = job.TrainOptions(data=(train,), validation_data=(val,), output=output, epochs=6,
                               per_replica_batch_size=32, monitor="val_mean_iou", early_stopping=2, min_delta=1.0,
                               steps_per_loop=4)
    summary = job.run(options, data_config={"label": "class"}, callbacks=[KillAt(kill_at)])
    print("RESULT " + json.dumps({"epochs": [h["epoch"] for h in summary["history"]], "best": summary.get("best"),
                                  "initial_step": summary["initial_step"], "final_step": summary["final_step"]}),
          flush=True)


if __name__ == "__main__":
    main()
