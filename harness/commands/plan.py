"""`harness plan`: the epoch plan of a job, before any machine is started."""
from __future__ import annotations

import json

from harness.choices import LR_SCALINGS
from harness.commands.args import POSITIVE, command


def plan(args) -> int:
    """`harness plan DATA --workers N --replicas-per-worker M (--global-batch-size B | --per-replica-batch-size b)`.

    Discovers the shards and counts their records (`harness.data.export.source`), then prints the plan (`--json`: as
    JSON)."""
    from harness.data.export.source import open_shards
    from harness.distribute.plan import make_plan
    from harness.train.model import optim

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


def add_parsers(sub) -> None:
    """`harness plan`."""
    p = command(sub, "plan", plan,
                "Print files and records per worker, batch sizes, steps per epoch and dropped records",
                example="harness plan points --workers 2 --global-batch-size 64")
    p.add_argument("data", nargs="+", metavar="DATA")
    p.add_argument("--workers", type=int, default=1, help="training workers (hosts or processes)")
    p.add_argument("--replicas-per-worker", type=int, default=1, help="devices per worker")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--global-batch-size", type=int, help="examples per step over all replicas")
    g.add_argument("--per-replica-batch-size", type=int, help="examples per step per replica")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--learning-rate", type=float, help="with it, the effective peak learning rate is printed")
    p.add_argument("--scale-lr", choices=LR_SCALINGS, default="none",
                   help="as harness train: scale the learning rate with global / --base-batch-size")
    p.add_argument("--base-batch-size", type=POSITIVE, help="the batch the learning rate was tuned for")
