"""`harness predict`: a model over an export, predictions written back in the export's order.

Order (every check before the first prediction): who am I (`WorkerContext`: TF_CONFIG or launcher variables, no
strategy and no collective) → the model and its run's spec → the shards, discovered and counted once
(`ShardSet`) → the export's spec and the model's geometry (`harness.predict.model.check`) → the mixer's
totalPatches against the records (images) → the output folder (refused when it holds another run's files) →
this worker's contiguous run of shards (`contiguous_runs`) → per shard: skip when complete, else predict every
record in order and write `<prefix>-<index>` under a temporary name, renamed when whole.

Workers share nothing but the output folder: each writes the output shards of its own input shards, with the
same indices, so the sorted files are the input order for any number of workers; a re-run redoes only the
shards whose final file is missing.

This module is the command's flow; each step has its room: what the model is fed (`reader`), the model and its
checks (`model`), the prediction stream (`stream`), the files and the output folder's rules (`writer`), the maps
(`maps`), the upload commands (`upload`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional

import tensorflow as tf

from harness.data.spec import dataspec as spec_lib, validate
from harness.data.export.shards import check_mixer
from harness.data.export.source import ShardSet, open_shards
from harness.distribute.context import WorkerContext
from harness.distribute.sharding import contiguous_runs
from harness.errors import MixerError
from harness.predict import identity, maps as maps_lib, model as model_lib, reader, stream, upload, writer
from harness.predict.options import CLASSIFICATION, CSV, PredictOptions


@dataclasses.dataclass(frozen=True)
class Job:
    """What every worker derives the same way from the options, the model and the shards."""

    options: PredictOptions
    loaded: model_lib.LoadedModel
    shards: ShardSet
    spec: spec_lib.DataSpec           # the read spec: the model's bands, no label
    geometry: model_lib.Geometry
    task: str
    band_names: tuple[str, ...]       # written bands / prediction columns
    kept: dict                        # table: property -> storage dtype, the truth's label last
    truth: Optional[str]              # table: the run's label, written as `<label>_true`, or None
    prefix: str
    outputs: tuple[str, ...]          # output path per input shard, in order
    maps: Optional[maps_lib.MapPaths]  # image exports with a mixer: the GeoTIFFs and the PNG (`maps`)

    @property
    def image(self) -> bool:
        return self.spec.kind == spec_lib.IMAGE

    @property
    def mixer_copy(self) -> str:
        return os.path.join(self.options.output, f"{self.prefix}-mixer.json")

    @property
    def merged_csv(self) -> str:
        return os.path.join(self.options.output, f"{self.prefix}.csv")

    @property
    def kept_columns(self) -> list[str]:
        """The table's columns before the predictions: the kept properties, the truth as `<label>_true`."""
        return [f"{k}{reader.TRUTH_SUFFIX}" if k == self.truth else k for k in self.kept]

    def manifest(self) -> dict:
        return {"model_sha256": self.loaded.sha256, "options": self.options.identity(),
                "data": [[os.path.basename(p), n] for p, n in self.shards.counts],
                "bands": list(self.spec.bands), "outputs": [os.path.basename(p) for p in self.outputs]}


def run(options: PredictOptions, *, context: Optional[WorkerContext] = None,
        say: Callable[[str], None] = print) -> dict:
    """Predict this worker's shards; the chief (rank 0) also writes the mixer copy and prints the upload commands.

    Returns:
      {"rank", "workers", "shards": this worker's input shard indices, "written": output paths written,
       "skipped": complete outputs left as they were, "outputs": every output path in order, "upload": the
       printed upload commands in order (chief; `upload.upload_lines`) or []}.
    Raises:
      the data layer's errors (discovery, counts, spec: a band missing from the export names it), MixerError
      (totalPatches differing from the records; an export without a mixer is predicted in order, and NO_MIXER
      said instead of the upload commands), ModelMismatchError (model vs
      export, before any prediction), OutputExistsError (another run's files in the output folder), ConfigError
      (bad `--output-bands` or `--keep`).
    """
    context = context or WorkerContext.from_environment()
    job = prepare(options)
    counts = [n for _, n in job.shards.counts]
    mine = contiguous_runs(counts, context.num_workers)[context.rank]
    writer.prepare_output(job, mine, context)
    say(f"predict: worker {context.rank}/{context.num_workers}: input shards "
        f"{f'{mine.start}..{mine.stop - 1}' if len(mine) else 'none'} of {len(counts)} "
        f"({sum(counts[i] for i in mine)} of {sum(counts)} records)")
    skipped = [job.outputs[i] for i in mine if tf.io.gfile.exists(job.outputs[i])]
    for out in skipped:
        say(f"  {os.path.basename(out)}: complete, skipped")
    todo = [i for i in mine if job.outputs[i] not in skipped]
    written = []
    for i, n in stream.predict_shards(job, todo):
        written.append(job.outputs[i])
        say(f"  {os.path.basename(job.outputs[i])}: {n} {'patches' if job.image else 'rows'} from "
            f"{os.path.basename(job.shards.shards[i].path)}")
    complete = all(tf.io.gfile.exists(p) for p in job.outputs)   # the last worker to finish sees every part
    if not job.image and options.format == CSV and complete:
        rows = writer.concatenate_csv(job.merged_csv, job.outputs)
        say(f"  {os.path.basename(job.merged_csv)}: {rows} rows (the whole table)")
    if job.maps is not None and complete and (written or not all(map(tf.io.gfile.exists, job.maps.all()))):
        for line in maps_lib.write_maps(job):
            say(line)
    upload_cmds = upload.upload_lines(job) if context.is_chief else []
    for line in upload_cmds:
        say(line)
    if context.is_chief and job.image and job.shards.mixer is None:
        say(upload.NO_MIXER)
    if context.is_chief and not job.image and identity.location_flags(job.kept_columns) is None:
        say(identity.NO_LOCATION)
    if upload_cmds:
        pending = [p for p in job.outputs if not tf.io.gfile.exists(p)]
        if pending:
            say(f"  ({len(pending)} of these files are still being written by other workers: upload when every "
                "worker has finished)")
    return {"rank": context.rank, "workers": context.num_workers, "shards": list(mine), "written": written,
            "skipped": skipped, "outputs": list(job.outputs), "upload": upload_cmds}


def prepare(options: PredictOptions) -> Job:
    """Load the model, open the shards and check everything that can be checked before predicting."""
    # On a host without a GPU a mixed-precision model predicts in float32 (float16 kernels are slow on CPUs).
    loaded = model_lib.load(options.model, float32=not tf.config.list_physical_devices("GPU"))
    shards = open_shards(options.data, mixer=options.mixer)
    spec = reader.read_spec(options, loaded, shards)
    where = shards.shards[0].path
    # every band in every shard's first record, S*S values (the first records read once: ShardSet.first_examples)
    validate.validate_shards(spec, shards)
    geometry = model_lib.check(loaded, spec, where)
    if spec.kind == spec_lib.IMAGE and shards.mixer is not None:
        try:
            check_mixer(shards.mixer, [n for _, n in shards.counts])
        except MixerError as e:
            raise MixerError(f"{e}: the predictions would not fill the patch grid; nothing written") from None
        spec = spec.replace(crop_margin=geometry.input_side == spec.patch_size and spec.kernel_margin > 0)
    task = options.task or (loaded.spec.task if loaded.spec else CLASSIFICATION)
    names = reader.band_names(options, task, geometry.channels)
    kept, truth = reader.kept_properties(options, loaded, shards, spec, names)
    prefix = options.prefix or os.path.basename(shards.shards[0].prefix)
    ext = ".tfrecord" if spec.kind == spec_lib.IMAGE or options.format != CSV else ".csv"
    outputs = tuple(os.path.join(options.output, f"{prefix}-{i:05d}{ext}")
                    for i in writer.output_indices(shards.shards))
    maps = None
    if spec.kind == spec_lib.IMAGE and shards.mixer is not None:
        maps_lib.Grid.from_mixer(shards.mixer, geometry.patch)   # a mixer without a projection fails here, first
        maps = maps_lib.MapPaths.under(options.output, prefix, task == CLASSIFICATION and len(names) > 1,
                                       classification=task == CLASSIFICATION)
    return Job(options=options, loaded=loaded, shards=shards, spec=spec, geometry=geometry, task=task,
               band_names=names, kept=kept, truth=truth, prefix=prefix, outputs=outputs, maps=maps)
