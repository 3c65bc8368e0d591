"""Reads from a Cloud Storage bucket against local disk: the same files, through TensorFlow's own gs:// file system.

The bucket is the test bed's (tests/gcs_bed.py): gcp-storage-emulator in memory behind a TLS proxy on loopback, so
each gs:// read pays what a real one pays on the client (TLS, HTTP, TensorFlow's GCS file system, a media request
per fill of the reader's buffer, `shards.read_buffer_bytes`) but no network: what it measures is the client side's cost and how well the
pipeline hides the wait for each block, not a bucket's bandwidth. As a real bucket is served by other machines, the
bed (one Python process) runs on a core of its own and the client on the others (`os.sched_setaffinity`, both
places alike; on a 1-core machine they share it, and the line says so). The export is written once (synthetic
256x256x8 float GZIP patches, `harness.data.export.synth`, as Earth Engine lays them out), uploaded, and read by two
pipelines from both places, taking turns in each run (`time_round_robin`), both places with the files read at once
that the harness picks for gs:// (`stages.READERS_PER_CORE_REMOTE` per core; local reads are no slower for it):
  reader   the harness's reader alone (`pipeline.read_files`, records counted, not parsed): the read limit;
  harness  `pipeline.build_dataset` in evaluation mode (no shuffle, no cache): what training reads at.
Prints examples/s and MB/s per pipeline and place, then bucket / local per pipeline (median and range over the
runs, each run's pair back to back); the target is >= 0.8 for the harness pipeline. Also the client's CPU per
example (local / bucket) and the CPU seconds the bed used.

  python benchmarks/gcs_read.py [--records 32] [--shards 4] [--patch 256] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from gcs_bed import GcsBed  # noqa: E402
import _smoke as smoke  # noqa: E402  (benchmarks/_smoke.py, beside this script)

# --smoke: 4 patches of 16x16, one run; `make test` runs it (tests/bench/test_benchmarks_start.py)
SMOKE = dict(records=4, shards=2, patch=16, batch=2, passes=1, repeats=1)
TARGET = 0.8


def _ratio(secs, a, b):
    ratios = [sb / sa for sa, sb in zip(secs[a], secs[b])]       # rate(a) / rate(b), same examples
    return statistics.median(ratios), min(ratios), max(ratios)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--records", type=int, default=32, help="patches in the export")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--patch", type=int, default=256, help="patch side (pixels)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--passes", type=int, default=2, help="times the file list is read per run")
    p.add_argument("--repeats", type=int, default=5)
    args = smoke.parse(p, argv, SMOKE)
    with tempfile.TemporaryDirectory(prefix="harness-gcs-bench-") as tmp, GcsBed(os.path.join(tmp, "bed")) as bed:
        routed = bed.env()                    # before TensorFlow loads: its GCS file system reads them then
        os.environ.clear()
        os.environ.update(routed)
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > 1:                    # before TensorFlow sizes its thread pools
            os.sched_setaffinity(bed.proc.pid, cores[-1:])
            os.sched_setaffinity(0, cores[:-1])
            placed = f"the client on {len(cores) - 1} core(s), the bed on 1 of its own"
        else:
            placed = "the client and the bed sharing the one core"
        import harness  # noqa: F401  (environment defaults before TensorFlow)
        import tensorflow as tf

        from harness.bench.input import harness_dataset, reader_limit, time_round_robin
        from harness.data.export import index, shards as shards_lib, synth
        from harness.data.spec import infer as spec_lib
        from harness.data.input import stages

        local = os.path.join(tmp, "export")
        t = time.perf_counter()
        synth.write_image_export(local, prefix="bench", shards=args.shards, records=args.records,
                                 bands=[f"B{i}" for i in range(8)], classes=4, patch_size=args.patch, kernel_size=0,
                                 compressed=True, seed=0)
        objects = bed.upload_tree(local, bed.url("export"))
        size = sum(os.path.getsize(os.path.join(local, f)) for f in os.listdir(local))
        reads = stages.decide_parallel_reads([s.path for s in shards_lib.discover_shards(bed.url("export"))]
                                             * args.passes)      # as the harness reads the bucket, for both
        print(f"TensorFlow {tf.__version__}, {placed}; {args.records} patches of "
              f"{args.patch}x{args.patch}x8 float, GZIP, in {args.shards} shards ({size / 1e6:.1f} MB in "
              f"{len(objects)} objects), batch {args.batch}, files read {args.passes}x per run, {reads} at once, "
              f"GCS_READ_CACHE_BLOCK_SIZE_MB={os.environ['GCS_READ_CACHE_BLOCK_SIZE_MB']}, read buffers of "
              f"{shards_lib.read_buffer_bytes(bed.url('export')) >> 20} MiB (bucket) and "
              f"{shards_lib.read_buffer_bytes(local) >> 20} MiB (local), {args.repeats} runs "
              f"(written and uploaded in {time.perf_counter() - t:.0f} s)")
        runs, expected, mean_bytes = {}, {}, {}
        for place, source in (("local", local), ("bucket", bed.url("export"))):
            found = shards_lib.discover_shards(source)
            stats = index.record_stats(found)
            records = sum(s.records for s in stats)
            mean_bytes[place] = sum(s.bytes for s in stats) / records
            spec = spec_lib.infer_spec(found, mixer=shards_lib.find_mixer(found))
            found = list(found) * args.passes
            runs[f"reader {place}"] = reader_limit([s.path for s in found], found[0].compression, args.batch,
                                                   mean_bytes[place], parallel_reads=reads)
            runs[f"harness {place}"] = harness_dataset(found, spec, args.batch, parallel_reads=reads)
            expected[f"reader {place}"] = expected[f"harness {place}"] = records * args.passes
        import psutil

        bed_process = psutil.Process(bed.proc.pid)
        bed_cpu = sum(bed_process.cpu_times()[:2])
        secs, cpu = time_round_robin(runs, expected, args.repeats)
        bed_cpu = sum(bed_process.cpu_times()[:2]) - bed_cpu
        print(f"  {'pipeline':<16} {'examples/s':>11} {'spread':>7} {'MB/s':>8}")
        for label in runs:
            eps = [expected[label] / s for s in secs[label]]
            mean = statistics.mean(eps)
            spread = statistics.pstdev(eps) / mean if len(eps) > 1 else 0.0
            print(f"  {label:<16} {mean:>11,.1f} {spread:>6.0%} {mean * mean_bytes['local'] / 1e6:>8.1f}")
        print(f"  bucket / local, median [min-max] over the {args.repeats} runs:")
        for name in ("reader", "harness"):
            r = _ratio(secs, f"{name} bucket", f"{name} local")
            verdict = f"  (target >= {TARGET}: {'ok' if r[0] >= TARGET else 'MISSED'})" if name == "harness" else ""
            print(f"  {name + ' bucket / local':<24} = {r[0]:.2f} [{r[1]:.2f}-{r[2]:.2f}]{verdict}")
        per_example = {k: statistics.median(c / expected[k] for c in cpu[k]) for k in runs}
        client = per_example["harness local"] / per_example["harness bucket"]
        bucket_s = sum(sum(secs[k]) for k in runs if k.endswith("bucket"))
        print(f"  client CPU per example, local / bucket, harness = {client:.2f}")
        print(f"  the bed (TLS proxy and emulator, one Python process) used {bed_cpu:.1f} CPU s beside "
              f"{bucket_s:.1f} s of bucket reads")
        media = [r for r in bed.requests() if r.startswith("GET storage.googleapis.com")]
        print(f"  {len(media)} media reads through the proxy; {len(bed.refused())} refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
