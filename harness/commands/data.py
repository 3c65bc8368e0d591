"""`harness inspect`, `harness synth`, `harness reshard` and `harness data-service`."""
from __future__ import annotations

import json
import os
import sys


def inspect(args) -> int:
    """`harness inspect PATH... [--mixer M] [--kernel-margin K] [--records N] [--json]`."""
    from harness.data import inspect as inspect_lib

    rep = inspect_lib.report(args.paths, mixer_path=args.mixer, kernel_margin=args.kernel_margin,
                             records_to_read=args.records)
    print(json.dumps(rep, indent=2) if args.json else inspect_lib.format_text(rep))
    return 0


def synth(args) -> int:
    """`harness synth OUTPUT ...`: write the export and print its files."""
    from harness.data import synth as synth_lib

    common = dict(prefix=args.prefix, shards=args.shards, records=args.records, bands=args.bands,
                  label=args.label or None, classes=args.classes, dtype=args.dtype,
                  compressed=not args.uncompressed, seed=args.seed)
    if args.kind == "image":
        paths = synth_lib.write_image_export(args.output, patch_size=args.patch_size, kernel_size=args.kernel_size,
                                             **common)
    else:
        paths = synth_lib.write_table_export(args.output, **common)
    for p in paths:
        print(p)
    return 0


def reshard(args) -> int:
    """`harness reshard SRC... --output DIR --workers N [--shards-per-worker K]`."""
    from harness.data import reshard as reshard_lib

    result = reshard_lib.reshard(args.sources, args.output, workers=args.workers,
                                 shards_per_worker=args.shards_per_worker, prefix=args.prefix, mixer=args.mixer)
    sizes = sorted({e["records"] for e in result["shards"]})
    print(f"{result['records']} records from {len(result['sources'])} shard(s) -> {len(result['shards'])} "
          f"uncompressed shards of {'/'.join(map(str, sizes))} records ({result['workers']} workers x "
          f"{result['shards_per_worker']}) in {args.output}")
    for e in result["shards"]:
        print(f"  {os.path.basename(e['path'])}: records {e['first_record']}..{e['first_record'] + e['records'] - 1}")
    return 0


def data_service(args) -> int:
    """`harness data-service dispatcher|worker ...`; serves until SIGINT/SIGTERM. `server` stays referenced until
    the process exits: a collected server stops serving, and its destructor waits for the job's tasks."""
    from harness.data import service

    if args.role == "dispatcher":
        server = service.start_dispatcher(args.port, work_dir=args.work_dir)
        print(service.open_port_note("dispatcher", server.target), file=sys.stderr, flush=True)
        service.serve_until_signal(f"tf.data service dispatcher at {server.target}")
    else:
        server = service.start_worker(args.dispatcher, args.port, worker_address=args.worker_address)
        print(service.open_port_note("worker", server._address), file=sys.stderr, flush=True)
        service.serve_until_signal(f"tf.data service worker on port {args.port or '(any)'}, dispatcher "
                                   f"{args.dispatcher}")
    # Exit at once: a worker's task threads for an endless training job would keep the interpreter's shutdown
    # waiting (up to the dispatcher's job timeout), and a server keeps no state to save (the fault-tolerant
    # dispatcher journals as it goes).
    sys.stdout.flush()
    os._exit(0)
