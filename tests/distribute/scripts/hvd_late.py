"""Test driver for a late rank: rank 1 sleeps HARNESS_TEST_LATE_S seconds before it starts Horovod (a pod scheduled
late, an image pulled slowly), then every rank joins one all-reduce and prints `LATE {json}` with the sum and the
Gloo timeout it ran under. Arguments are ignored (the launcher asks for `--backend horovod`)."""
import json
import os
import time

import harness  # noqa: F401
import tensorflow as tf

from harness.distribute import horovod

rank = int(os.environ["HOROVOD_RANK"])
if rank == 1:   # after the imports: the lateness is at hvd.init, where Gloo's rendezvous starts its clock
    time.sleep(float(os.environ.get("HARNESS_TEST_LATE_S", "0")))
horovod.init()
import horovod.tensorflow as hvd  # noqa: E402

total = hvd.allreduce(tf.constant(1.0), op=hvd.Sum)
print("LATE " + json.dumps({"rank": rank, "sum": float(total),
                            "gloo_timeout_s": os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS")}), flush=True)
