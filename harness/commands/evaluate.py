"""`harness evaluate`: a trained run scored on a labelled export with validation's own metrics."""
from __future__ import annotations

from harness.choices import BACKENDS, STRATEGIES
from harness.commands.args import POSITIVE, command, defaults
from harness.evaluate.run import EvaluateOptions


def evaluate(args) -> int:
    """`harness evaluate --model RUN_DIR --data EXPORT [--output OUT.json|DIR] [...]`."""
    from harness.evaluate.run import run

    run(EvaluateOptions(model=args.model, data=tuple(args.data), output=args.output,
                        per_replica_batch_size=args.per_replica_batch_size, loss=args.loss, backend=args.backend,
                        strategy=args.strategy), say=lambda line: print(line, flush=True))
    return 0


def add_parsers(sub) -> None:
    """`harness evaluate`."""
    p = command(sub, "evaluate", evaluate,
                "Score a trained run on a labelled export with its validation metrics (every record once, any "
                "number of workers)",
                example="harness evaluate --model runs/points --data points/export-00003.tfrecord.gz --output "
                        "runs/points/test.json")
    D = defaults(EvaluateOptions)
    p.add_argument("--model", required=True, help="a run folder (model.keras + summary.json)")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH",
                   help="the labelled export: a folder, a glob, or paths (local or gs://)")
    p.add_argument("--output", help="the report as JSON: a .json path, or a folder (evaluation.json in it); in the "
                                    "run folder, `harness report` shows its scores")
    p.add_argument("--per-replica-batch-size", type=POSITIVE, default=D["per_replica_batch_size"],
                   help="records per replica per step")
    p.add_argument("--loss", help="the loss val_loss is of (default: the run's)")
    p.add_argument("--backend", choices=BACKENDS, default=D["backend"], help="tf.distribute, or horovod under "
                                                                            "a launcher's ranks")
    p.add_argument("--strategy", choices=STRATEGIES, default=D["strategy"], help="tf.distribute's strategy")
