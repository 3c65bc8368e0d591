"""Build a strategy with make_strategy in a fresh process and print one JSON line about it.

Usage: python build_strategy.py KIND [--num-cpu-replicas N] [--allreduce] [--init-tf-first] [--hold S]
                                      [--agree-gpus N]

--allreduce sums 1.0 over all replicas (proves the workers are connected); --init-tf-first runs a TensorFlow op
before make_strategy (the too-late case); --hold sleeps S seconds after printing (a worker in training);
--agree-gpus compares N as this worker's GPU count with the other workers' (`strategy.agree_devices`, under keys
of its own: the strategy's own comparison ran already) and reports the error it raises.
TF_CONFIG, if any, comes from the environment.
"""
import argparse
import json
import sys

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
import tensorflow as tf

from harness.distribute.strategy import make_strategy, strategy_name
from harness.errors import HarnessError

p = argparse.ArgumentParser()
p.add_argument("kind")
p.add_argument("--num-cpu-replicas", type=int)
p.add_argument("--allreduce", action="store_true")
p.add_argument("--init-tf-first", action="store_true")
p.add_argument("--hold", type=float, default=0.0)
p.add_argument("--agree-gpus", type=int)
args = p.parse_args()
if args.init_tf_first:
    tf.constant(1.0) + 1.0
try:
    strategy, ctx = make_strategy(args.kind, num_cpu_replicas=args.num_cpu_replicas)
except HarnessError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
    sys.exit(3)
out = {"strategy": strategy_name(strategy), "default": strategy is tf.distribute.get_strategy(), "replicas_in_sync": strategy.num_replicas_in_sync,
       "rank": ctx.rank, "num_workers": ctx.num_workers, "local_rank": ctx.local_rank,
       "replicas_per_worker": ctx.replicas_per_worker, "is_chief": ctx.is_chief, "task_type": ctx.task_type,
       "task_index": ctx.task_index, "backend": ctx.backend.value}
if args.allreduce:
    per_replica = strategy.run(lambda: tf.constant(1.0))
    out["allreduce"] = float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))
if args.agree_gpus is not None:
    from tensorflow.python.eager import context

    from harness.distribute import environment
    from harness.distribute.strategy import agree_devices
    store = context.context()
    try:
        agree_devices(environment.read_tf_config(), args.agree_gpus, timeout_s=30,
                      publish=lambda key, value: store.set_config_key_value("test/" + key, value),
                      read=lambda key, timeout_in_ms: store.get_config_key_value("test/" + key, timeout_in_ms))
        out["agree"] = None
    except HarnessError as e:
        out["agree"] = f"{type(e).__name__}: {e}"
print(json.dumps(out), flush=True)
if args.hold:
    import time
    time.sleep(args.hold)
