"""Start-up of the data layer against the number of shards (issue 62): what `harness train` reads of an export
before its first step, first run and second, beside TensorFlow's own read of the same records.

For each shard count N (`--shards`, the same `--records` records split over N GZIP shards of a table export,
`harness.data.export.synth`), `--runs` runs, each a child process of its own (a fresh TensorFlow, its own peak
memory: as each `harness train` is) on one `HARNESS_CACHE_DIR` (the record index), fresh for the first run:
  open      `open_shards`: discovery, the record counts (`index.record_stats`: counted on the first run, from the
            index on the later ones), the mixer;
  checks    the spec inferred from the first shard, then every shard's record 0 checked against it and its label
            (`validate.validate_shards`: one parallel pass, `ShardSet.heads`; on a later run only the shards whose
            identity did not pass the same checks before: `heads read`);
  per shard the same checks as they ran before issue 62 (`validate_spec` with one `records.first_examples` per
            shard, then `check_first_labels`): a dataset built and drained per shard;
  read all  one interleaved `TFRecordDataset` over every shard, drained inside TensorFlow: what reading the whole
            export costs, the floor a start-up that reads every shard is held against.
Printed per N: seconds of each (first run: counting; second run: from the index), per-shard ratio, and the
child's peak resident memory after open and checks. A cost that grows with N beyond the read's is what this
benchmark exists to show.

Then the same against the export's bytes (`--bytes`, GB; `--bytes-shards` shards of 64x64x8 float32 GZIP patches,
131 kB a record: an image export as Earth Engine writes it): open, checks and read all per size, first run and
second, and the child's peak resident memory after open and checks (before `read all`, whose batches of 4096
records are TensorFlow's, not the harness's), also above what it held once TensorFlow and the harness were
imported (`above imports`): the data layer's own memory, which must not grow with the bytes (issue 62: flat within 20%).

Then the same on 2 workers (`--workers-shards`, a table export of that many shards; two child processes joined by
MultiWorkerMirroredStrategy over loopback, TF_CONFIG as `harness launch local` writes it, private record indexes as
on pods that share no disk): each worker counts and checks its share (`index.Split`: the shards rank::2) and gathers
the others', so the shards read per worker fall as 1/N (`counted here`, `heads here`) beside one worker's run.

  python benchmarks/startup.py [--shards 10,100,1000] [--records 4000] [--runs 2] [--per-shard-max 1000]
                               [--bytes 0.1,1,4] [--bytes-shards 64] [--workers-shards 1000]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import _smoke as smoke  # noqa: E402  (benchmarks/_smoke.py, beside this script)

SMOKE = dict(shards="2,8", records=64, runs=2, bytes="0.002", bytes_shards=4, workers_shards=8, other_runs=1)
PATCH, BANDS = 64, 8   # the --bytes exports' patches: 64x64x8 float32, 131,072 B of values a record


def _child(folder: str, last: bool, per_shard: bool, label: str = "class", workers: bool = False) -> dict:
    """In a fresh process: open and checks timed on the export in `folder` (a run of `harness train` would do
    both); with `last`, also the read of every record and, with `per_shard`, the checks one shard at a time; with
    `workers`, as one worker of the job TF_CONFIG describes (its share of both, the rest gathered)."""
    import harness  # noqa: F401  (environment defaults before TensorFlow)
    import tensorflow as tf

    from harness.data.export.records import first_examples
    from harness.data.export.source import open_shards
    from harness.data.spec import labels, validate
    from harness.train.inputs import _split, resolve_spec

    split = None
    if workers:
        from harness.distribute.backend import make_backend
        split = _split(make_backend("tf", strategy="auto"))
    out = {"imports_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    tally: dict = {}
    t = time.perf_counter()
    train = open_shards([folder], split=split, tally=tally)
    out["open"] = time.perf_counter() - t
    out["counted"] = tally["counted"]
    t = time.perf_counter()
    spec = resolve_spec({"label": label}, train)
    report = validate.validate_shards(spec, train, labels=True, split=split)
    out["checks"] = time.perf_counter() - t
    out["read_heads"] = len(report.checked) + len(report.empty)
    out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # open and checks: the data layer
    shards = list(train.shards)
    if last and per_shard:
        t = time.perf_counter()
        validate.validate_spec(spec, shards, read=first_examples)
        labels.check_first_labels(spec, shards, read=first_examples)
        out["per_shard"] = time.perf_counter() - t
    if last:
        ds = tf.data.TFRecordDataset([s.path for s in shards], compression_type="GZIP",
                                     num_parallel_reads=min(16, len(shards))).batch(4096)
        t = time.perf_counter()
        ds.reduce(tf.constant(0, tf.int64), lambda n, b: n + tf.size(b, out_type=tf.int64))
        out["read_all"] = time.perf_counter() - t
    out["shards"], out["records"] = len(shards), train.records
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shards", default="10,100,1000", help="shard counts, comma-separated")
    p.add_argument("--records", type=int, default=4000, help="records of the export, split over its shards")
    p.add_argument("--runs", type=int, default=2,
                   help="runs per N, each a fresh process on the same record index: the first counts and checks, "
                        "the later read the index")
    p.add_argument("--per-shard-max", type=int, default=1000,
                   help="the checks one shard at a time only up to this many shards (20 ms a shard)")
    p.add_argument("--bytes", default="0.1,1", help="GB of the image exports of the second table, comma-separated "
                                                  "('' for none)")
    p.add_argument("--bytes-shards", type=int, default=64, help="shards of each --bytes export")
    p.add_argument("--workers-shards", type=int, default=1000,
                   help="shards of the table export the 2-worker runs read (0: none)")
    p.add_argument("--other-runs", type=int, help="runs per size (--bytes) and per worker count (default: --runs)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--label", default="class", help=argparse.SUPPRESS)
    p.add_argument("--last", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--per-shard", action="store_true", help=argparse.SUPPRESS)
    args = smoke.parse(p, argv, SMOKE)
    args.other_runs = args.other_runs or args.runs
    if args.child:
        print(json.dumps(_child(args.child, args.last, args.per_shard, args.label, args.worker)))
        return 0
    from harness.data.export import synth

    print(f"{args.records} records of a table export (4 float bands, a class), GZIP, split over N shards; "
          f"{args.runs} run(s) per N, each a process of its own on the N's record index (fresh for its first run)",
          flush=True)
    print(f"  {'N':>6} {'run':>4} {'open s':>8} {'checks s':>9} {'ms/shard':>9} {'heads read':>10}   "
          f"{'per shard s':>11} {'read all s':>10} {'checks/read':>11} {'peak MiB':>9}")
    rows, by_size = [], []
    with tempfile.TemporaryDirectory(prefix="harness-startup-") as tmp:
        for n in map(int, args.shards.split(",")):
            folder = os.path.join(tmp, f"n{n}")
            synth.write_table_export(folder, prefix="points", shards=n, records=max(args.records, n), seed=1)
            env = dict(os.environ, HARNESS_CACHE_DIR=os.path.join(tmp, f"cache{n}"), CUDA_VISIBLE_DEVICES="",
                       TF_CPP_MIN_LOG_LEVEL="2")
            runs = []
            for r in range(args.runs):
                last = r == args.runs - 1
                flags = (["--last"] if last else []) + (["--per-shard"] if last and n <= args.per_shard_max else [])
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", folder, *flags],
                                      capture_output=True, text=True, env=env, timeout=3600)
                if done.returncode != 0:
                    print(done.stdout[-2000:] + done.stderr[-3000:], file=sys.stderr)
                    return done.returncode
                run = json.loads(done.stdout.strip().splitlines()[-1])
                runs.append(run)
                per_shard = f"{run['per_shard']:>11.2f}" if "per_shard" in run else f"{'-':>11}"
                print((f"  {n:>6} {r + 1:>4} {run['open']:>8.2f} {run['checks']:>9.2f} "
                       f"{1e3 * run['checks'] / n:>9.2f} {run['read_heads']:>10}   "
                       + (f"{per_shard} {run['read_all']:>10.2f} "
                          f"{run['checks'] / max(run['read_all'], 1e-9):>11.2f} {run['peak_mib']:>9.0f}" if last
                          else "")).rstrip(), flush=True)
            rows.append({"shards": n, "runs": runs, **runs[-1]})
        if args.bytes:
            by_size = _by_bytes(args, tmp)
            if by_size is None:
                return 1
        if args.workers_shards and _two_workers(args, tmp) is None:
            return 1
    first, last = rows[0], rows[-1]
    which = "second run (the record index read)" if args.runs > 1 else "first run (counting)"
    grow = (last["runs"][-1]["open"] + last["runs"][-1]["checks"]) - (first["runs"][-1]["open"] +
                                                                      first["runs"][-1]["checks"])
    print(f"{which}, open + checks at {last['shards']} shards against {first['shards']}: {grow:+.2f} s "
          f"(target for the second run: within 5 s)")
    if "per_shard" in last:
        print(f"checks at {last['shards']} shards: one pass {last['runs'][0]['checks']:.2f} s (first run) against "
              f"{last['per_shard']:.2f} s one shard at a time "
              f"({last['per_shard'] / max(last['runs'][0]['checks'], 1e-9):.1f}x)")
    if by_size:
        low, high = by_size[0], by_size[-1]
        for name, key in (("first run (counting)", 0), ("second run (the record index read)", -1)):
            a, b = low["runs"][key], high["runs"][key]
            grow = (b["peak_mib"] - b["imports_mib"]) / max(a["peak_mib"] - a["imports_mib"], 1e-9) - 1
            print(f"{name}: peak memory above the imports at {high['gb']:g} GB against {low['gb']:g} GB: "
                  f"{b['peak_mib'] - b['imports_mib']:.0f} against {a['peak_mib'] - a['imports_mib']:.0f} MiB "
                  f"({grow:+.0%}; target: within 20%)")
    return 0


def _child_run(folder: str, env: dict, flags: list) -> dict | None:
    """One child process's figures (`_child`), or None after printing why it failed."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", folder, *flags],
                          capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        print(done.stdout[-2000:] + done.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _by_bytes(args, tmp: str) -> list | None:
    """The second table: one image export per --bytes size, `args.other_runs` child runs each (first: counting, later:
    the record index). Returns [{gb, runs}], or None after a child failed."""
    from harness.data.export import synth

    record = PATCH * PATCH * BANDS * 4
    print(f"image exports of 64x64x{BANDS} float32 patches ({record:,} B of values a record), GZIP, "
          f"{args.bytes_shards} shards; {args.other_runs} run(s) per size", flush=True)
    print(f"  {'GB':>6} {'records':>8} {'run':>4} {'open s':>8} {'checks s':>9} {'read all s':>10} {'peak MiB':>9} "
          f"{'above imports':>13}")
    out = []
    for gb in map(float, args.bytes.split(",")):
        folder = os.path.join(tmp, f"gb{gb:g}")
        n = max(args.bytes_shards, round(gb * 1e9 / record))
        synth.write_image_export(folder, prefix="img", shards=args.bytes_shards, records=n, patch_size=PATCH,
                                 bands=tuple(f"B{i}" for i in range(BANDS)), classes=4, seed=2)
        env = dict(os.environ, HARNESS_CACHE_DIR=os.path.join(tmp, f"cache-gb{gb:g}"), CUDA_VISIBLE_DEVICES="",
                   TF_CPP_MIN_LOG_LEVEL="2")
        runs = []
        for r in range(args.other_runs):
            run = _child_run(folder, env, ["--label", "landcover", "--last"])
            if run is None:
                return None
            runs.append(run)
            print(f"  {gb:>6g} {n:>8} {r + 1:>4} {run['open']:>8.2f} {run['checks']:>9.2f} {run['read_all']:>10.2f} "
                  f"{run['peak_mib']:>9.0f} {run['peak_mib'] - run['imports_mib']:>13.0f}", flush=True)
        out.append({"gb": gb, "runs": runs})
        shutil.rmtree(folder)
    return out


def _two_workers(args, tmp: str) -> list | None:
    """The third table: one worker, then 2 workers (each its own record index, fresh: a first run, then a second),
    on one table export of `args.workers_shards` shards. Returns the rows, or None after a child failed."""
    from harness.data.export import synth
    from harness.launch.local import free_ports

    n = args.workers_shards
    folder = os.path.join(tmp, f"workers{n}")
    synth.write_table_export(folder, prefix="points", shards=n, records=max(args.records, n), seed=3)
    print(f"{max(args.records, n)} records of a table export in {n} shards, on 1 worker and on 2 (MWMS over "
          f"loopback, a record index each); {args.other_runs} run(s) each", flush=True)
    print(f"  {'workers':>7} {'run':>4} {'worker':>6} {'open s':>8} {'checks s':>9} {'counted here':>12} "
          f"{'heads here':>10} {'peak MiB':>9}")
    rows = []
    for workers in (1, 2):
        caches = [os.path.join(tmp, f"cache-w{workers}-{r}") for r in range(workers)]
        for run in range(args.other_runs):
            ports = free_ports(workers)
            procs = []
            for rank in range(workers):
                env = dict(os.environ, HARNESS_CACHE_DIR=caches[rank], CUDA_VISIBLE_DEVICES="",
                           TF_CPP_MIN_LOG_LEVEL="2")
                env.pop("TF_CONFIG", None)
                if workers > 1:
                    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                                   "task": {"type": "worker", "index": rank}})
                procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", folder,
                                               *(["--worker"] if workers > 1 else [])], env=env, text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            outs = [p.communicate(timeout=3600) for p in procs]
            if any(p.returncode for p in procs):
                for p, (so, se) in zip(procs, outs):
                    print(f"worker exit {p.returncode}\n{so[-2000:]}{se[-3000:]}", file=sys.stderr)
                return None
            for rank, (so, _) in enumerate(outs):
                got = json.loads(so.strip().splitlines()[-1])
                rows.append({"workers": workers, "run": run + 1, "rank": rank, **got})
                print(f"  {workers:>7} {run + 1:>4} {rank:>6} {got['open']:>8.2f} {got['checks']:>9.2f} "
                      f"{got['counted']:>12} {got['read_heads']:>10} {got['peak_mib']:>9.0f}", flush=True)
    one = next(r for r in rows if r["workers"] == 1 and r["run"] == 1)
    two = [r for r in rows if r["workers"] == 2 and r["run"] == 1]
    print(f"first run, shards counted per worker: {one['counted']} on 1 worker, "
          f"{' and '.join(str(r['counted']) for r in two)} on 2 (1/N: {n / 2:g})")
    return rows


if __name__ == "__main__":
    sys.exit(main())
