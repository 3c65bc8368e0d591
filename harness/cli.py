"""The `harness` command line: each subcommand's parser and handler live in `harness.commands.<name>`.

Handlers import the library inside the function, so `harness --help` does not import TensorFlow.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from harness.commands import bench as bench_cmd, data as data_cmd, evaluate as evaluate_cmd, launch as launch_cmd
from harness.commands import plan as plan_cmd
from harness.commands import predict as predict_cmd, train as train_cmd, tune as tune_cmd
from harness import exit_codes
from harness.errors import ClusterFault, HarnessError


def build_parser() -> argparse.ArgumentParser:
    """The `harness` parser: each command's own parser, built beside its handler (`harness.commands.<name>`)."""
    parser = argparse.ArgumentParser(prog="harness", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for commands in (data_cmd, plan_cmd, train_cmd, tune_cmd, predict_cmd, evaluate_cmd, bench_cmd, launch_cmd):
        commands.add_parsers(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("tensorflow", "absl", "h5py"):   # their INFO lines drown ours
        logging.getLogger(noisy).setLevel(logging.WARNING)
    name = " ".join(filter(None, [args.command, getattr(args, "launcher", None)]))
    try:
        if args.command != "launch":   # a launcher's workers check for themselves
            _check_cloud_storage(args)
        return int(args.handler(args) or 0)
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


def _check_cloud_storage(args: argparse.Namespace) -> None:
    """Credentials and buckets for every gs:// path among the flags, checked before any work (`harness.data.gcs`)."""
    from harness.data import gcs

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
