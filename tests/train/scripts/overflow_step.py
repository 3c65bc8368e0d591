"""One worker (or Horovod rank) of the overflow-on-one-share steps (tests/overflow_support.py), for both Keras kinds in
turn; prints `OVERFLOW {json}` per kind.

Usage: overflow_step.py tf|horovod   (tf: MultiWorkerMirroredStrategy from TF_CONFIG, with a collective timeout of
COLLECTIVE_TIMEOUT_S so that a step that waits for a peer that skipped it fails in seconds; horovod: under horovodrun)
"""
import json
import pathlib
import sys

import harness  # noqa: F401

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # tests/: overflow_support

COLLECTIVE_TIMEOUT_S = 30

mode = sys.argv[1]
if mode == "horovod":
    from harness.distribute import horovod
    strategy, context = horovod.init()
else:
    import tensorflow as tf

    from harness.distribute import environment
    from harness.distribute.context import WorkerContext
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=COLLECTIVE_TIMEOUT_S))
    context = WorkerContext.from_tf_config(environment.read_tf_config())

import overflow_support  # noqa: E402

from harness.distribute.backend import HorovodBackend, TrainingBackend  # noqa: E402

backend = (HorovodBackend if mode == "horovod" else TrainingBackend)(strategy, context)
for kind in ("tf_keras", "keras3"):
    result = overflow_support.run(kind, backend)
    print("OVERFLOW " + json.dumps({"rank": context.rank, **result}), flush=True)
