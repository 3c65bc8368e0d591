"""The input pipeline tuned: `stage_rates` (each stage's examples/s per core, measured), `model` (Plumber's model of
the pipeline on them) and `levers` (each lever decided on the model, against `harness train`'s defaults)."""
