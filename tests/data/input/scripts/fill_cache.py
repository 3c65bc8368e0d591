"""Test driver: read an export once through a file cache, one record per batch, and print what the test checks.

Usage: fill_cache.py EXPORT CACHE_DIR [--hold N]
With --hold, prints `HOLDING` after N records (the cache half filled) and waits for a line on stdin before reading
on. Prints `RESULT {json}` with the band values of every record read, in order.
"""
import argparse
import json
import sys

import harness  # noqa: F401

from harness.data.input import pipeline as P, stages
from harness.data.export import shards as S
from harness.data.spec import infer as SP


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("export")
    parser.add_argument("cache_dir")
    parser.add_argument("--hold", type=int, default=None)
    args = parser.parse_args()
    stages.READ_BATCH_MAX = 8  # many small cache elements, so the fill is partial when the reader stops
    found = S.discover_shards(args.export)
    ds = P.build_dataset(found, SP.infer_spec(found), stages.PipelineOptions(
        per_replica_batch_size=1, training=False, cache="file", cache_dir=args.cache_dir))
    ids = []
    for x, _ in ds:
        ids.append([float(v) for v in x[0]])
        if len(ids) == args.hold:
            print("HOLDING", flush=True)
            sys.stdin.readline()
    print("RESULT " + json.dumps({"ids": ids}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
