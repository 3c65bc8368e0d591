"""`harness predict`: a trained run (or any Keras model) over an export, written back for Earth Engine."""
from __future__ import annotations


def predict(args) -> int:
    """`harness predict --model RUN_DIR|MODEL.keras --data EXPORT --output OUT [...]` (see `harness predict -h`)."""
    from harness.predict.options import PredictOptions
    from harness.predict.run import run

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
    from harness.data.spec import DataSpec
    from harness.errors import ConfigError
    from harness.predict import model as model_lib
    from harness.predict.serving import export_savedmodel, format_arguments, size_lines

    loaded = model_lib.load(args.model)
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
