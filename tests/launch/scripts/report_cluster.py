"""Test driver: join the cluster this process's environment describes and print one line `CLUSTER {json}`.

Usage: report_cluster.py tf        # make_strategy("auto") from TF_CONFIG / the Indexed Job variables, all-reduce
       report_cluster.py horovod   # WorkerContext from the MPI launcher's variables, hvd.init, all-reduce

The all-reduce sums 1.0 over every replica: it only returns once all workers are connected.
"""
import json
import sys

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)

from harness.distribute import environment
from harness.distribute.context import WorkerContext


def tf_cluster() -> dict:
    import tensorflow as tf

    from harness.distribute.strategy import make_strategy

    strategy, ctx = make_strategy("auto")  # before any other TensorFlow op
    config = environment.read_tf_config()
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
    return {"rank": ctx.rank, "num_workers": ctx.num_workers, "is_chief": ctx.is_chief,
            "multi_worker": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
            "replicas_in_sync": strategy.num_replicas_in_sync,
            "cluster": {t: list(a) for t, a in config.cluster.items()}, "task": [config.task_type, config.task_index],
            "allreduce": float(total)}


def horovod_cluster() -> dict:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    ctx = WorkerContext.from_environment()
    launcher = environment.read_launcher()
    hvd.init()
    total = hvd.allreduce(tf.constant(1.0), op=hvd.Sum)
    out = {"rank": ctx.rank, "num_workers": ctx.num_workers, "local_rank": ctx.local_rank,
           "backend": ctx.backend.value, "launcher": launcher.launcher, "local_size": launcher.local_size,
           "hvd": [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()], "allreduce": float(total)}
    hvd.shutdown()
    return out


if __name__ == "__main__":
    result = tf_cluster() if sys.argv[1] == "tf" else horovod_cluster()
    print("CLUSTER " + json.dumps(result), flush=True)
