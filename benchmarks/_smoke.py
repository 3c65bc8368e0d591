"""`--smoke`, the flag every benchmark script takes: its tiny sizes (seconds), so `make test` checks that the script
starts and prints its figures (tests/bench/test_benchmarks_start.py); the figures then mean nothing."""
import argparse


def parse(parser: argparse.ArgumentParser, argv, sizes: dict) -> argparse.Namespace:
    """Add `--smoke` to `parser` and parse `argv`; with `--smoke`, `sizes` replace the defaults (flags given
    explicitly still apply)."""
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): checks that the benchmark runs; "
                        "its figures mean nothing (flags given explicitly still apply)")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**sizes)
        args = parser.parse_args(argv)
    return args
