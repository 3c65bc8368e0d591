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
