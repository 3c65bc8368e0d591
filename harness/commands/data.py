"""`harness inspect`, `harness synth`, `harness reshard` and `harness data-service`."""
from __future__ import annotations

import json
import os
import sys

from harness import ports
from harness.choices import DATA_KINDS, DTYPES
from harness.commands.args import NON_NEGATIVE, POSITIVE, command, verbose
from harness.errors import ConfigError


def inspect(args) -> int:
    """`harness inspect PATH... [--mixer M] [--kernel-margin K] [--records N] [--json]`."""
    from harness.data.export import inspect as inspect_lib
    from harness.predict import describe

    predictions = describe.describe(args.paths)   # a predict output folder: read as predictions
    rep = inspect_lib.report(args.paths, mixer_path=args.mixer, kernel_margin=args.kernel_margin,
                             records_to_read=args.records, infer=predictions is None)
    if predictions is not None:
        rep["predictions"] = predictions
    text = inspect_lib.format_text(rep) + (f"\n{describe.format_text(predictions)}" if predictions else "")
    if args.quicklook:
        from harness.predict import maps

        rep["quicklook"] = _quicklook(args, rep)
        text += "\n" + maps.describe_quicklook(rep["quicklook"])
    print(json.dumps(rep, indent=2) if args.json else text)
    return 0


def _quicklook(args, rep: dict) -> dict:
    """`inspect --quicklook PNG`: the image export drawn (`harness.predict.maps.export_quicklook`: the one home of
    the map formats).

    Raises:
      ConfigError: not an image export of patches with its mixer.
    """
    from harness.data.export import shards as shards_lib
    from harness.data.spec.dataspec import DataSpec
    from harness.predict import maps

    data = (rep.get("config") or {}).get("data") or {}
    if data.get("kind") != "image" or rep.get("mixer") is None or data.get("sequence"):
        raise ConfigError(f"--quicklook draws an image export of patches with its mixer; {' '.join(args.paths)} "
                          f"is {'a table' if data.get('kind') == 'table' else 'not one'} (kind "
                          f"{data.get('kind')}, mixer {'found' if rep.get('mixer') else 'none'}"
                          f"{', per-pixel sequences' if data.get('sequence') else ''})")
    spec = DataSpec.from_config(data)
    shards = shards_lib.discover_shards(args.paths)
    mixer = shards_lib.find_mixer(shards, args.mixer)
    bands = args.quicklook_bands or maps.quicklook_bands(spec.channels)
    return maps.export_quicklook(shards, mixer, spec, bands, args.quicklook)


def synth(args) -> int:
    """`harness synth OUTPUT ...`: write the export and print its files."""
    from harness.data.export import synth as synth_lib

    if args.scene:
        written = synth_lib.write_scene(args.output, seed=args.seed)
        for path in [*written["points"].values(), *written["image"]]:
            print(path)
        return 0
    common = dict(prefix=args.prefix, shards=args.shards, records=args.records, bands=args.bands,
                  label=args.label or None, classes=args.classes, dtype=args.dtype,
                  compressed=not args.uncompressed, seed=args.seed, depths=dict(args.depths or []),
                  label_from=args.label_from)
    if args.kind == "image":
        paths = synth_lib.write_image_export(args.output, patch_size=args.patch_size, kernel_size=args.kernel_size,
                                             collapse=args.collapse_bands, sequence=args.sequence_data,
                                             mixer=not args.no_mixer, **common)
    else:
        if args.collapse_bands or args.sequence_data or args.no_mixer:
            raise ConfigError("--collapse-bands, --sequence-data and --no-mixer are image export options")
        paths = synth_lib.write_table_export(args.output, **common)
    for p in paths:
        print(p)
    return 0


def _depth(text: str) -> tuple[str, int]:
    """`BAND=D` -> (band, D) for --depths."""
    import argparse

    band, sep, depth = text.partition("=")
    if not sep or not band or not depth.isdigit() or int(depth) < 1:
        raise argparse.ArgumentTypeError(f"expected BAND=D with D a positive integer (ndvi=12), got {text!r}")
    return band, int(depth)


def reshard(args) -> int:
    """`harness reshard SRC... --output DIR --workers N [--shards-per-worker K]`."""
    from harness.data.export import reshard as reshard_lib

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
    from harness.data.input import service

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


def add_parsers(sub) -> None:
    """`harness inspect`, `harness synth`, `harness reshard` and `harness data-service dispatcher|worker`."""
    p = command(sub, "inspect", inspect,
                "Print the schema, patch shape, per-shard record counts and a ready-to-use config",
                example="harness inspect preds")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--mixer", help="mixer.json when not beside the shards as <prefix>-mixer.json")
    p.add_argument("--kernel-margin", type=NON_NEGATIVE, default=None,
                   help="kernel size k of the export (stored patch = patchDimensions + k); default: from mixer.json, "
                        "else 0")
    p.add_argument("--records", type=POSITIVE, default=8, help="records read per shard to infer the schema")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--quicklook", metavar="OUT.png",
                   help="draw an image export as one picture (its patches placed by the mixer, at most 1024 pixels "
                        "a side) into OUT.png")
    p.add_argument("--quicklook-bands", nargs="+", metavar="BAND",
                   help="1 band (grey) or 3 (red, green, blue) to draw; default B4 B3 B2 or the bands named red, "
                        "green, blue, else the first three")

    p = command(sub, "synth", synth,
                "Write a synthetic export laid out exactly as Earth Engine writes it",
                example="harness synth points --kind table --shards 4 --records 800 --bands a b c --label class "
                        "--classes 3")
    p.add_argument("output", help="folder to write into")
    p.add_argument("--kind", choices=DATA_KINDS, default="image", help="patches (image) or points (table)")
    p.add_argument("--prefix", default="export", help="file name prefix")
    p.add_argument("--shards", type=POSITIVE, default=4, help="files (at most --records)")
    p.add_argument("--records", type=POSITIVE, default=16, help="records (patches or rows) in all")
    p.add_argument("--bands", nargs="+", default=["B2", "B3", "B4", "B8"], help="band names")
    p.add_argument("--label", default="landcover", help="label feature name ('' for none)")
    p.add_argument("--classes", type=POSITIVE, default=4, help="label classes")
    p.add_argument("--patch-size", type=POSITIVE, default=64, help="patchDimensions P (without margin), pixels")
    p.add_argument("--kernel-size", type=NON_NEGATIVE, default=0,
                   help="kernelSize k: 0 or 1 store no margin, an even k a stored patch of P + k (k/2 per side)")
    p.add_argument("--dtype", choices=DTYPES, default="float", help="band storage")
    p.add_argument("--uncompressed", action="store_true", help="write .tfrecord without GZIP")
    p.add_argument("--seed", type=int, default=0, help="random fields and classes")
    p.add_argument("--scene", action="store_true",
                   help="stand-ins for the quick start's exports, in OUTPUT/gee-aces-points (training, validation, "
                        "testing) and OUTPUT/gee-aces-image: the points sampled from the image's pixels, one class "
                        "rule (the ACES bands, 5 classes; --seed alone applies)")
    lay = p.add_argument_group("Earth Engine layout options (TfRecordImageExportOptions; docs/GEE_FORMAT.md)")
    lay.add_argument("--depths", nargs="+", type=_depth, metavar="BAND=D",
                     help="tensorDepths: these bands are array bands of D values per pixel (row), e.g. ndvi=12")
    lay.add_argument("--collapse-bands", action="store_true",
                     help="collapseBands: every band, then the label, in one feature named after the first band")
    lay.add_argument("--sequence-data", action="store_true",
                     help="sequenceData: one SequenceExample per pixel, array bands as its feature lists")
    lay.add_argument("--no-mixer", action="store_true",
                     help="no mixer.json, as Earth Engine writes none when maxMaskedRatio drops patches")
    lay.add_argument("--label-from", metavar="CHANNEL",
                     help="the label as classes of this one channel (`band` or `band[i]`, e.g. ndvi[3]); default "
                          "a function of every band")

    p = command(sub, "reshard", reshard,
                "Rewrite (GZIP) shards into uncompressed shards balanced over a multiple of the workers, in order")
    p.add_argument("sources", nargs="+", metavar="SRC", help="shards: a folder, a glob, or paths")
    p.add_argument("--output", required=True, help="folder for the new shards")
    p.add_argument("--workers", type=int, required=True, help="training workers the output is balanced over")
    p.add_argument("--shards-per-worker", type=int, default=1, help="more files per worker: more parallel reads")
    p.add_argument("--prefix", help="output name prefix (default: the source's)")
    p.add_argument("--mixer", help="mixer.json when not beside the shards (default: <prefix>-mixer.json there)")

    ds = sub.add_parser("data-service", allow_abbrev=False, help="tf.data service servers for --data-service")
    verbose(ds)
    dsub = ds.add_subparsers(dest="role", required=True)
    p = command(dsub, "dispatcher", data_service, "Start a tf.data service dispatcher")
    p.add_argument("--port", type=NON_NEGATIVE, default=ports.DATA_SERVICE_PORT, help="port to listen on")
    p.add_argument("--work-dir", help="journal folder (fault-tolerant dispatcher); default: none, not fault-tolerant")
    p = command(dsub, "worker", data_service, "Start a tf.data service worker")
    p.add_argument("--dispatcher", required=True, help="HOST:PORT of the dispatcher")
    p.add_argument("--port", type=NON_NEGATIVE, default=0, help="0: any free port")
    p.add_argument("--worker-address", help="HOST:PORT the dispatcher gives consumers (default localhost:PORT)")
