"""`harness plan`: the epoch plan of a job, before any machine is started."""
from __future__ import annotations

import json


def plan(args) -> int:
    """`harness plan DATA --workers N --replicas-per-worker M (--global-batch-size B | --per-replica-batch-size b)`.

    Discovers the shards and counts their records (`harness.data.source`), then prints the plan (`--json`: as
    JSON)."""
    from harness.data.source import open_shards
    from harness.distribute.plan import make_plan
    from harness.train import optim

    shards = open_shards(args.data)
    result = make_plan(shards.counts, workers=args.workers, replicas_per_worker=args.replicas_per_worker,
                       global_batch_size=args.global_batch_size, per_replica_batch_size=args.per_replica_batch_size)
    lr = getattr(args, "learning_rate", None)
    if args.json:
        out = result.to_dict()
        if lr is not None:
            out["peak_learning_rate"] = optim.peak_learning_rate(lr, args.scale_lr, result.global_batch_size,
                                                                 args.base_batch_size)
        print(json.dumps(out, indent=2))
    else:
        print(result.format(args.data))
        if lr is not None:
            print(optim.describe_peak(lr, args.scale_lr, result.global_batch_size, args.base_batch_size))
    return 0
