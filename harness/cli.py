"""The `harness` command line: each subcommand's parser and handler live in `harness.commands.<name>`.

Handlers import the library inside the function, so `harness --help` does not import TensorFlow.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys

from harness.commands import bench as bench_cmd, data as data_cmd, evaluate as evaluate_cmd, launch as launch_cmd
from harness.commands import plan as plan_cmd
from harness.commands import predict as predict_cmd, report as report_cmd, train as train_cmd, tune as tune_cmd
from harness import exit_codes
from harness.commands.args import unknown_flag
from harness.errors import ClusterFault, HarnessError


DESCRIPTION = """Train TensorFlow models on Google Earth Engine TFRecord exports, on one GPU or many, and write the
predictions back as Earth Engine and a GIS read them.

from an export to a map:
  harness inspect EXPORT                                   what the export holds
  harness train --data EXPORT --label NAME --output RUN    a run folder: model.keras, summary.json
  harness predict --model RUN --data EXPORT --output OUT   predictions in order, the map, the upload line
  harness launch local --workers 2 -- harness train ...    the same on several workers"""


def build_parser() -> argparse.ArgumentParser:
    """The `harness` parser: each command's own parser, built beside its handler (`harness.commands.<name>`)."""
    parser = argparse.ArgumentParser(prog="harness", description=DESCRIPTION, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for commands in (data_cmd, plan_cmd, train_cmd, tune_cmd, predict_cmd, evaluate_cmd, report_cmd, bench_cmd,
                     launch_cmd):
        commands.add_parsers(sub)
    return parser


def main(argv=None) -> int:
    # A native crash (SIGSEGV, SIGABRT from a heap check, SIGBUS) in TensorFlow or a library prints every Python
    # thread's stack before the process dies, so the worker's line names the step and the call that was running
    # (the signal is raised again: the launcher still sees it).
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extras = parser.parse_known_args(argv)
    if extras:
        unknown_flag(parser, argv, extras)
    quiet(args.verbose)
    name = " ".join(filter(None, [args.command, getattr(args, "launcher", None)]))
    try:
        try:
            if args.command != "launch":   # a launcher's workers check for themselves
                _check_cloud_storage(args)
            return int(args.handler(args) or 0)
        except BaseException as e:
            # a training attempt counted beside the backup, which ended permanent or by Ctrl-C: not counted
            # (harness.train.lifecycle.attempts; loaded only where a run counted one)
            counted = sys.modules.get("harness.train.lifecycle.attempts")
            if counted is not None:
                counted.settle(e)
            raise
    except KeyboardInterrupt:
        print(f"harness {name}: interrupted; run the same command again to resume from the last backup",
              file=sys.stderr)
        # Leave now: TensorFlow's threads may still deliver the interrupt during interpreter shutdown, which
        # would end the process by SIGINT instead of with the exit code the shell convention gives it (128 + 2).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_codes.INTERRUPTED)
    except ClusterFault as e:
        # A fault of the cluster (lost, stuck or late peer, preemption): one line, and a code the Kubernetes
        # operators retry (harness.exit_codes); the same command resumes from the last backup.
        if args.verbose:
            raise
        print(f"harness {name}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        return exit_codes.RETRYABLE
    except (HarnessError, OSError) as e:
        # Bad input or configuration: the message, not a traceback (-v shows it). Anything else is a bug: its
        # traceback shows.
        if args.verbose:
            raise
        print(f"harness {name}: {type(e).__name__}: {_for_flags(e, args)}", file=sys.stderr)
        # A launcher passes on the code of the worker that failed first (WorkerFailedError.exit_code).
        return getattr(e, "exit_code", exit_codes.PERMANENT)


class _Short(logging.Formatter):
    """`warning: message` (what a person reads), not `WARNING harness.data.input.pipeline: message`."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def quiet(verbose: bool) -> None:
    """Quiet by default: the harness's own lines, its warnings, and nothing else's INFO. `-v` shows everything:
    DEBUG and INFO logs (each worker's input pipelines, record counting, the strategy) with their logger's name,
    and the banners TensorFlow's C++ libraries print while they load (`harness.heavy_imports`)."""
    import warnings

    if verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(_Short())
        logging.basicConfig(level=logging.WARNING, handlers=[handler])
    for noisy in ("tensorflow", "absl", "h5py", "matplotlib", "PIL"):   # their INFO and DEBUG lines (matplotlib's
        logging.getLogger(noisy).setLevel(logging.WARNING)                # font search: hundreds) drown ours
    # google-api-core (with earthengine-api) warns at import that it will drop Python 3.11 in 2027: not the user's
    # business on every command
    warnings.filterwarnings("ignore", message="You are using a Python version", category=FutureWarning)


def _check_cloud_storage(args: argparse.Namespace) -> None:
    """Credentials and buckets for every gs:// path among the flags, checked before any work
    (`harness.data.export.gcs`)."""
    from harness.data.export import gcs

    values = []
    for value in vars(args).values():
        values += value if isinstance(value, (list, tuple)) else [value]
    gcs.check(values)


def _for_flags(error: Exception, args: argparse.Namespace) -> str:
    """The error's message, its advice to declare `label:` in a config turned into `--label` for the commands that
    take no config (`bench input`, `bench train`)."""
    text = str(error)
    if hasattr(args, "label") and not hasattr(args, "config"):
        text = text.replace("declare `label:`", "give --label NAME (no label feature was inferred)")
    return text


if __name__ == "__main__":
    sys.exit(main())
