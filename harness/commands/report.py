"""`harness report`: a finished run as one self-contained HTML page, opened offline."""
from __future__ import annotations

from harness.commands.args import command


def report(args) -> int:
    """`harness report RUN_DIR [--predictions OUT] [--output FILE]`."""
    from harness.train.report import page

    path = page.write(args.run_dir, predictions=args.predictions, output=args.output)
    print(f"report: {path} (one file, nothing loaded from the network: open it in any browser)")
    return 0


def add_parsers(sub) -> None:
    """`harness report`."""
    p = command(sub, "report", report,
                "Write a run's report.html: plan, metrics per epoch and per class, confusion matrix, throughput, "
                "profile, tuning, the map; offline", example="harness report runs/points --predictions preds")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's folder (summary.json)")
    p.add_argument("--predictions", metavar="OUT", help="a `harness predict` folder whose map quick-look to show")
    p.add_argument("--output", help="where to write it (default RUN_DIR/report.html)")
