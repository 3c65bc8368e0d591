"""`PredictOptions`: what `harness predict` is asked to do, frozen, one object passed to `harness.predict.job.run`."""
from __future__ import annotations

import dataclasses
from typing import Optional

from harness.choices import PREDICTION_FORMATS, TASKS
from harness.errors import ConfigError

CLASSIFICATION, REGRESSION = TASKS
CSV, TFRECORD = PREDICTION_FORMATS


@dataclasses.dataclass(frozen=True)
class PredictOptions:
    """Options of one prediction run.

    Attributes:
      model: a run folder (`model.keras` + `summary.json`, whose `spec` gives the bands and patch size) or a
        `.keras` file (any Keras model: a `summary.json` beside it is read when present, else the spec is
        inferred from the export and `bands` declares the model's inputs).
      data: the export: a folder, glob or paths (local or gs://), as `harness train --data`.
      output: the folder written: one output shard per non-empty input shard, same index, in input order.
      mixer: the export's mixer.json when not beside the shards (image exports).
      batch_size: patches (or rows) per model call; the last batch of each shard may be smaller.
      bands: the model's input bands in channel order (default: the run's spec, else every band inferred).
      task: "classification" (the model returns logits or probabilities per class: the class band is their
        argmax, int64) or "regression" (each output channel written as a float band as it is). Default: the
        run's spec, else classification.
      probabilities: also write one float32 band per class (softmax of the model's outputs; classification).
      output_bands: names of the written bands: the class band then the probability bands (classification), or
        one per output channel (regression). Default: `class`, `probability_<i>`; `prediction` (one channel) or
        `prediction_<i>`.
      format: table exports: "csv" (default; one part per input shard and, when every part is written, the
        whole table as `<prefix>.csv`) or "tfrecord". Image exports are always written as TFRecord.
      keep: table exports: input properties copied into every output row (an id, coordinates), in this order.
      prefix: output file name prefix (default: the input shards' prefix).
      overwrite: replace the files of another run in `output` instead of refusing them.
    """

    model: str
    data: tuple[str, ...]
    output: str
    mixer: Optional[str] = None
    batch_size: int = 16
    bands: Optional[tuple[str, ...]] = None
    task: Optional[str] = None
    probabilities: bool = False
    output_bands: Optional[tuple[str, ...]] = None
    format: str = CSV
    keep: tuple[str, ...] = ()
    prefix: Optional[str] = None
    overwrite: bool = False

    def __post_init__(self):
        for name in ("data", "keep"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        for name in ("bands", "output_bands"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.task not in (None, CLASSIFICATION, REGRESSION):
            raise ConfigError(f"--task must be {CLASSIFICATION} or {REGRESSION}, got {self.task!r}")
        if self.format not in (CSV, TFRECORD):
            raise ConfigError(f"--format must be {CSV} or {TFRECORD}, got {self.format!r}")
        if not self.data:
            raise ConfigError("--data: no export given")
        if self.output_bands is not None and len(set(self.output_bands)) != len(self.output_bands):
            raise ConfigError(f"--output-bands repeats a name: {list(self.output_bands)}")

    def identity(self) -> dict:
        """The options that decide the bytes written: a re-run with the same identity resumes, another is
        refused unless `overwrite`."""
        return {"batch_size": self.batch_size, "bands": list(self.bands or ()), "task": self.task,
                "probabilities": self.probabilities, "output_bands": list(self.output_bands or ()),
                "format": self.format, "keep": list(self.keep), "prefix": self.prefix}
