"""Test driver for one worker on a bed host: tests/launch/scripts/fault_worker.py (`harness train ARGS...` as the
CLI runs it, then its `RESULT {json}` line), and one line `HOST {json}` with what the multi-host tests add:
  rank, hostname (socket.gethostname()), context (the WorkerContext as the job printed it: rank, task, chief),
  params (the model's parameter count), and records: one key per record drawn from the input pipeline, in the
  order drawn (a digest of the record's feature and label values, taken where the training loop draws each batch,
  `Trainer._next_batch`), so a test can count every record once per epoch over all workers.
"""
import hashlib
import json
import pathlib
import runpy
import socket
import sys

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
import numpy as np
import tensorflow as tf

from harness.train.report import run_summary
from harness.train.loop.trainer import Trainer

FAULT_WORKER = pathlib.Path(__file__).resolve().parents[2] / "launch" / "scripts" / "fault_worker.py"
records = []
params = []
_next_batch = Trainer._next_batch
_weights_digest = run_summary.weights_digest


def _keep(*tensors):
    rows = np.concatenate([np.asarray(t).reshape(len(t), -1).astype(np.float64) for t in tensors], axis=1)
    records.extend(hashlib.sha256(row.tobytes()).hexdigest()[:16] for row in rows)
    return 0


def recorded_next_batch(self, iterator):
    batch = _next_batch(self, iterator)
    flat = tf.nest.flatten(batch, expand_composites=True)
    kept = tf.py_function(_keep, flat, tf.int32)   # once per batch drawn, in the graph
    with tf.control_dependencies([kept]):
        return tf.nest.map_structure(tf.identity, batch, expand_composites=True)


def counted_digest(model):
    params.append(int(model.count_params()))
    return _weights_digest(model)


Trainer._next_batch = recorded_next_batch   # fault_worker wraps this one with its own count
run_summary.weights_digest = counted_digest
sys.argv = [str(FAULT_WORKER), *sys.argv[1:]]
ran = runpy.run_path(str(FAULT_WORKER), run_name="__main__")
print("HOST " + json.dumps({"rank": ran["rank"], "hostname": socket.gethostname(),
                            "context": ran["summary"]["context"], "params": params[0], "records": records}),
      flush=True)
