"""`harness predict`: a trained run (or any Keras model) over an export, written back for Earth Engine."""
from __future__ import annotations

from harness.choices import EXPORT_FORMATS, PREDICTION_FORMATS, TASKS
from harness.commands.args import NON_NEGATIVE, POSITIVE, command, defaults
from harness.predict.options import PredictOptions


def predict(args) -> int:
    """`harness predict --model RUN_DIR|MODEL.keras --data EXPORT --output OUT [...]` (see `harness predict -h`)."""
    from harness.predict.options import PredictOptions
    from harness.predict.job import run

    options = PredictOptions(
        model=args.model, data=tuple(args.data), output=args.output, mixer=args.mixer, batch_size=args.batch_size,
        bands=tuple(args.bands) if args.bands else None, task=args.task, probabilities=args.probabilities,
        output_bands=tuple(args.output_bands) if args.output_bands else None, format=args.format,
        keep=tuple(args.keep or ()), prefix=args.prefix, overwrite=args.overwrite)
    run(options, say=lambda line: print(line, flush=True))
    return 0


def export(args) -> int:
    """`harness export --format savedmodel --model RUN_DIR|MODEL.keras --output DIR [--probabilities]`: the
    SavedModel and the `ee.Model.fromVertexAi` arguments that match it."""
    from harness.data.spec.dataspec import DataSpec
    from harness.errors import ConfigError
    from harness.predict import model as model_lib
    from harness.predict.serving import export_savedmodel, format_arguments, size_lines

    loaded = model_lib.load(args.model, float32=True)   # a serving host: float32 compute (model_lib.load)
    spec = loaded.spec
    if args.bands:
        spec = (spec.replace(bands=tuple(args.bands), band_groups={}) if spec else
                DataSpec(kind="image" if args.patch_size else "table", bands=tuple(args.bands),
                         patch_size=args.patch_size, kernel_margin=args.kernel_margin or 0))
    if spec is None:
        raise ConfigError(f"{args.model}: no run spec (summary.json) beside the model: give --bands (and "
                          "--patch-size, --kernel-margin for an image model)")
    arguments, facts = export_savedmodel(loaded, spec.replace(label=None), args.output,
                                         probabilities=args.probabilities)
    print(f"wrote {args.output} (signatures serving_default: {arguments['payloadFormat']}, grpc: GRPC_TF_TENSORS; "
          f"inputs {', '.join(spec.bands)}; TensorFlow {facts['tensorflow_version']})")
    for line in size_lines(facts):
        print(line)
    print(format_arguments(arguments))
    return 0


def add_parsers(sub) -> None:
    """`harness predict`: predictions in the export's order, ready for `earthengine upload`; `harness export`."""
    p = command(sub, "predict", predict,
                "Predict every record of an export in order and write it back as Earth Engine uploads it",
                description="Predict every record of an export in order and write it back as Earth Engine uploads "
                            "it; an image export with a mixer also as <prefix>.tif, a Cloud-Optimized GeoTIFF, and "
                            "<prefix>.png, a quick-look",
                example="harness predict --model runs/series --data series --output series-preds")
    D = defaults(PredictOptions)   # each default below is the library's
    p.add_argument("--model", required=True, help="a run folder (model.keras + summary.json) or a .keras file")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH",
                   help="the export: a folder, a glob, or paths (local or gs://)")
    p.add_argument("--mixer", help="mixer.json when not beside the shards as <prefix>-mixer.json")
    p.add_argument("--output", required=True, help="folder of the predictions (one file per input shard)")
    p.add_argument("--batch-size", type=POSITIVE, default=D["batch_size"], help="patches or rows per model call")
    p.add_argument("--bands", nargs="+", help="the model's input bands in order (default: the run's spec, else "
                                              "every band of the export)")
    p.add_argument("--task", choices=TASKS,
                   help="default: the run's; classification: class ids (argmax); regression: the raw outputs")
    p.add_argument("--probabilities", action="store_true", help="also one float band per class (softmax; images: "
                                                                "also <prefix>-probabilities.tif)")
    p.add_argument("--output-bands", nargs="+", metavar="NAME",
                   help="names of the written bands: class band, then one per class (default class, "
                        "probability_<i>; regression: prediction or prediction_<i>)")
    p.add_argument("--format", choices=PREDICTION_FORMATS, default=D["format"], help="table exports' output")
    p.add_argument("--keep", nargs="+", metavar="PROPERTY",
                   help="table exports: input properties copied to each row (default: ids and coordinates by name, "
                        "e.g. system:index, longitude, latitude; the run's label is written as <label>_true)")
    p.add_argument("--prefix", help="output file prefix (default: the input shards')")
    p.add_argument("--overwrite", action="store_true", help="replace another run's files in --output")

    p = command(sub, "export", export,
                "Write a SavedModel for Earth Engine's hosted models (ee.Model.fromVertexAi) and print its arguments",
                example="harness export --format savedmodel --model runs/exp1 --output sm")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="savedmodel", help="what to write")
    p.add_argument("--model", required=True, help="a run folder (model.keras + summary.json) or a .keras file")
    p.add_argument("--output", required=True, help="SavedModel folder")
    p.add_argument("--probabilities", action="store_true", help="also return per-class probabilities")
    p.add_argument("--bands", nargs="+", help="input bands in channel order (default: the run's spec)")
    p.add_argument("--patch-size", type=POSITIVE, help="a bare image model: P (without margin)")
    p.add_argument("--kernel-margin", type=NON_NEGATIVE, help="a bare image model: k (default 0)")
