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
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
from typing import Callable, Iterator, Optional

import numpy as np
import tensorflow as tf

from harness.data.export import scan
from harness.data.spec import dataspec as spec_lib, infer, validate
from harness.data.export.shards import check_mixer
from harness.data.export.source import ShardSet, open_shards
from harness.distribute.context import WorkerContext
from harness.distribute.sharding import contiguous_runs, files_with_records
from harness.errors import ConfigError, MissingFeatureError, MixerError, OutputExistsError
from harness.predict import describe, geotiff, identity, model as model_lib, reader, upload, writer
from harness.predict.options import CLASSIFICATION, CSV, PredictOptions
from harness.tracing import graph_function, user_code

MANIFEST = describe.MANIFEST


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
    maps: Optional[geotiff.MapPaths]  # image exports with a mixer: the GeoTIFFs and the PNG (`geotiff`)

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
        return [f"{k}{TRUTH_SUFFIX}" if k == self.truth else k for k in self.kept]

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
       printed upload commands in order (chief; `upload_lines`) or []}.
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
    _prepare_output(job, mine, context)
    say(f"predict: worker {context.rank}/{context.num_workers}: input shards "
        f"{f'{mine.start}..{mine.stop - 1}' if len(mine) else 'none'} of {len(counts)} "
        f"({sum(counts[i] for i in mine)} of {sum(counts)} records)")
    skipped = [job.outputs[i] for i in mine if tf.io.gfile.exists(job.outputs[i])]
    for out in skipped:
        say(f"  {os.path.basename(out)}: complete, skipped")
    todo = [i for i in mine if job.outputs[i] not in skipped]
    written = []
    for i, n in predict_shards(job, todo):
        written.append(job.outputs[i])
        say(f"  {os.path.basename(job.outputs[i])}: {n} {'patches' if job.image else 'rows'} from "
            f"{os.path.basename(job.shards.shards[i].path)}")
    complete = all(tf.io.gfile.exists(p) for p in job.outputs)   # the last worker to finish sees every part
    if not job.image and options.format == CSV and complete:
        rows = writer.concatenate_csv(job.merged_csv, job.outputs)
        say(f"  {os.path.basename(job.merged_csv)}: {rows} rows (the whole table)")
    if job.maps is not None and complete and (written or not all(map(tf.io.gfile.exists, job.maps.all()))):
        for line in write_maps(job):
            say(line)
    upload_cmds = upload_lines(job) if context.is_chief else []
    for line in upload_cmds:
        say(line)
    if context.is_chief and job.image and job.shards.mixer is None:
        say(NO_MIXER)
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
    spec = _read_spec(options, loaded, shards)
    where = shards.shards[0].path
    # every band in every shard's first record, S*S values (the first records read once: ShardSet.first_examples)
    validate.validate_spec(spec, list(shards.shards), read=shards.first_examples)
    geometry = model_lib.check(loaded, spec, where)
    if spec.kind == spec_lib.IMAGE and shards.mixer is not None:
        try:
            check_mixer(shards.mixer, [n for _, n in shards.counts])
        except MixerError as e:
            raise MixerError(f"{e}: the predictions would not fill the patch grid; nothing written") from None
        spec = spec.replace(crop_margin=geometry.input_side == spec.patch_size and spec.kernel_margin > 0)
    task = options.task or (loaded.spec.task if loaded.spec else CLASSIFICATION)
    names = _band_names(options, task, geometry.channels)
    kept, truth = _kept(options, loaded, shards, spec, names)
    prefix = options.prefix or os.path.basename(shards.shards[0].prefix)
    ext = ".tfrecord" if spec.kind == spec_lib.IMAGE or options.format != CSV else ".csv"
    outputs = tuple(os.path.join(options.output, f"{prefix}-{i:05d}{ext}") for i in _indices(shards.shards))
    maps = None
    if spec.kind == spec_lib.IMAGE and shards.mixer is not None:
        geotiff.Grid.from_mixer(shards.mixer, geometry.patch)   # a mixer without a projection fails here, first
        maps = geotiff.MapPaths.under(options.output, prefix, task == CLASSIFICATION and len(names) > 1)
    return Job(options=options, loaded=loaded, shards=shards, spec=spec, geometry=geometry, task=task,
               band_names=names, kept=kept, truth=truth, prefix=prefix, outputs=outputs, maps=maps)


def _read_spec(options: PredictOptions, loaded: model_lib.LoadedModel, shards: ShardSet) -> spec_lib.DataSpec:
    """The export's spec (kind, P from the mixer, k from the records, storage dtypes) with the model's bands:
    `--bands`, else the run's, else every band inferred, and the run's band groups and their delivery. No label:
    predict reads none."""
    run = loaded.spec
    exported = infer.infer_spec(list(shards.shards), mixer=shards.mixer, read=shards.first_examples)
    if run is not None and run.kind != exported.kind and not (run.kind == spec_lib.TABLE and
                                                              exported.kind == spec_lib.IMAGE):
        raise model_lib.ModelMismatchError(
            f"{loaded.path}: the run was trained on a {run.kind} export, {shards.shards[0].path} is a "
            f"{exported.kind} export: a patch model maps patches, not table rows (a model trained on a table "
            "export maps an image export pixel by pixel)")
    bands = options.bands or (run.bands if run else exported.bands)
    schema = infer.read_schema(list(shards.shards), read=shards.first_examples)
    # The run's layout (array depths, collapsed features, sequences) is how its bands are stored: read the same.
    layout = run if run is not None and set(bands) == set(run.bands) else exported
    stored = exported.replace(bands=tuple(bands), label=None, band_groups={}, group_delivery=spec_lib.DICT,
                              depths={b: d for b, d in layout.depths.items() if b in bands},
                              collapsed=layout.collapsed, sequence=layout.sequence).features
    absent = [b for b in stored if b not in schema]
    if absent:
        hint = spec_lib._closest(absent[0], list(schema))
        raise MissingFeatureError(f"{shards.shards[0].path}: band {absent[0]!r} of the model is absent from the "
                                  f"export" + (f"; closest available key: {hint!r}" if hint else "") +
                                  f" (missing: {absent}; the records hold {sorted(schema)})")
    dtypes = {b: schema[b].dtype for b in stored}
    # The run's band groups shape the model's inputs (one tensor per group, or groups on a time axis): delivered
    # by the same `decode.decode` as in training. `--bands` other than the run's means a model without them.
    grouped = run is not None and run.band_groups and set(bands) == set(run.bands)
    # A run that resized its patches ran its model at R x R: predict reads and crops as it did, resizes to R, and
    # resizes the output back (model.Geometry.restore). Else the side is found from the model (`prepare`).
    resized = run is not None and run.kind == spec_lib.IMAGE and run.resize
    return exported.replace(bands=tuple(bands), label=None, dtypes=dtypes,
                            depths={b: d for b, d in layout.depths.items() if b in bands},
                            collapsed=layout.collapsed, sequence=layout.sequence,
                            input_nodata=run.input_nodata if run is not None else None,
                            input_fill=run.input_fill if run is not None else {},
                            band_groups=run.band_groups if grouped else {},
                            group_delivery=run.group_delivery if grouped else spec_lib.DICT,
                            crop_margin=bool(resized and run.crop_margin), resize=run.resize if resized else None)


def _band_names(options: PredictOptions, task: str, channels: int) -> tuple[str, ...]:
    if task == CLASSIFICATION:
        default = ("class", *(f"probability_{i}" for i in range(channels)))
        wanted = 1 + channels if options.probabilities else 1
    else:
        default = ("prediction",) if channels == 1 else tuple(f"prediction_{i}" for i in range(channels))
        wanted = channels
    given = options.output_bands
    if given is None:
        return default[:wanted]
    if len(given) not in (wanted, 1 if task == CLASSIFICATION else wanted):
        raise ConfigError(f"--output-bands: {len(given)} names {list(given)} for {wanted} written bands (" +
                          ("the class band, then one per class" if task == CLASSIFICATION else
                           "one per model output") + ")")
    return tuple(given) + default[len(given):wanted]


TRUTH_SUFFIX = "_true"   # the label's column beside the prediction: `class_true`, `landcover_true`


def _kept(options: PredictOptions, loaded: model_lib.LoadedModel, shards: ShardSet, spec,
          names) -> tuple[dict, Optional[str]]:
    """The properties copied into each table row (property -> storage dtype, in order) and the run's label when
    it is written as the truth (`<label>_true`) beside the prediction, else None. Without `--keep`: the
    identifying properties (`identity.identifying`: ids, coordinates, geometry) and the label when the records
    hold it; with `--keep`: those properties, and the label unless kept under its own name."""
    if spec.kind == spec_lib.IMAGE:
        if options.keep:
            raise ConfigError("--keep copies properties of table exports; an image export's predictions are bands")
        return {}, None
    schema = infer.read_schema(list(shards.shards), read=shards.first_examples)
    label = loaded.spec.label if loaded.spec is not None else None
    truth = label if label in schema and schema[label].length == 1 and label not in options.keep else None
    if not options.keep:
        found = [n for n in identity.identifying(schema, exclude=(*spec.features, label or ""))
                 if schema[n].length == 1]
        clash = sorted({*found, *(f"{truth}{TRUTH_SUFFIX}" for _ in [truth] if truth)} & set(names))
        if clash:
            raise ConfigError(f"property {clash[0]!r} of the records has the name of a prediction column; rename "
                              "the prediction with --output-bands")
        return {**{k: schema[k].dtype for k in found}, **({truth: schema[truth].dtype} if truth else {})}, truth
    absent = reader.missing_kept(options.keep, schema)
    if absent:
        raise MissingFeatureError(f"{shards.shards[0].path}: --keep {absent[0]!r} is absent from the records "
                                  f"(they hold {sorted(schema)})")
    clash = sorted(set(options.keep) & set(names))
    if clash:
        raise ConfigError(f"--keep {clash[0]!r} has the name of a prediction column; rename it with --output-bands")
    return {**{k: schema[k].dtype for k in options.keep}, **({truth: schema[truth].dtype} if truth else {})}, truth


def _indices(shards) -> list[int]:
    """Output index per input shard: the input's own index when every shard has one, else its position."""
    own = [s.index for s in shards]
    return own if None not in own and len(set(own)) == len(own) else list(range(len(shards)))


def _prepare_output(job: Job, mine: range, context: WorkerContext) -> None:
    """Refuse another run's files (unless --overwrite), then write the manifest (every worker, the same bytes)
    and, on the chief, the mixer copy. With --overwrite, each worker removes its own outputs and the chief the
    files that are not this run's.

    Raises:
      OutputExistsError: naming the folder and what differs or which files are foreign.
    """
    out, options = job.options.output, job.options
    tf.io.gfile.makedirs(out)
    manifest, path = job.manifest(), os.path.join(out, MANIFEST)
    ours = {MANIFEST, *(os.path.basename(p) for p in (*job.outputs, job.mixer_copy, job.merged_csv,
                                                      *(job.maps.all() if job.maps else ())))}
    listed = tf.io.gfile.listdir(out)
    names = [n for n in listed if not writer.is_temporary(n)]
    my_outputs = {os.path.basename(job.outputs[i]) for i in mine}
    for n in listed:  # half files of this worker's shards, left by a killed run: redone below
        if writer.is_temporary(n) and writer.final_name(n) in my_outputs:
            tf.io.gfile.remove(os.path.join(out, n))
    previous = None
    if MANIFEST in names:
        with tf.io.gfile.GFile(path) as f:
            previous = json.load(f)
    foreign = sorted(n for n in names if n not in ours)
    if previous is None:
        foreign = sorted(names)
    if not options.overwrite:
        if previous is not None and previous != manifest:
            differ = sorted(k for k in manifest if manifest[k] != previous.get(k))
            raise OutputExistsError(f"{out} holds the predictions of another run ({', '.join(differ)} differ, see "
                                    f"{path}): give a new --output, or --overwrite to replace them")
        if foreign:
            raise OutputExistsError(f"{out} is not empty ({', '.join(foreign[:5])}"
                                    f"{', ...' if len(foreign) > 5 else ''}) and holds no predictions of this run: "
                                    "give an empty or new --output, or --overwrite")
    else:
        for i in mine:
            if tf.io.gfile.exists(job.outputs[i]):
                tf.io.gfile.remove(job.outputs[i])
        if context.is_chief:
            for n in foreign if previous is not None else [n for n in names if n != MANIFEST]:
                if not tf.io.gfile.isdir(os.path.join(out, n)) and os.path.join(out, n) not in job.outputs:
                    tf.io.gfile.remove(os.path.join(out, n))
    writer.write_text(path, json.dumps(manifest, sort_keys=True))
    if context.is_chief and job.image and job.shards.mixer is not None:
        with tf.io.gfile.GFile(job.shards.mixer.path) as f:
            writer.write_text(job.mixer_copy, f.read())


def predict_shards(job: Job, indices) -> Iterator[tuple[int, int]]:
    """Predict every record of the shards `indices` (in order) and write each one's output atomically, yielding
    `(index, records written)` as each file is complete.

    One stream over the shards (`reader.ordered_batches`), so reading and decoding run ahead of the model across
    file boundaries; batches never mix two shards. A zero-record shard gets an empty file.

    Raises:
      the data layer's named errors (`scan.named_error`) for a record that fails to parse.
    """
    step = _step_fn(job)
    columns = [*job.kept_columns, *job.band_names]
    # a class label is stored as a float (3.0; docs/GEE_FORMAT.md): its truth column holds the class id
    as_id = job.truth if job.task == CLASSIFICATION and job.kept.get(job.truth) != "bytes" else None
    shards = [job.shards.shards[i] for i in indices]
    empty = {i for i in indices if job.shards.stats[i].records == 0}

    def rows():
        try:
            for position, inputs, kept in reader.ordered_batches(shards, job.spec, job.options.batch_size, job.kept):
                outputs = [o.numpy() for o in step(inputs)]
                kept = {k: np.rint(v.numpy()).astype(np.int64) if k == as_id else v.numpy() for k, v in kept.items()}
                i = indices[int(position)]
                for j in range(outputs[0].shape[0]):
                    yield i, [kept[k][j] for k in job.kept] + [o[j] for o in outputs]
        except tf.errors.InvalidArgumentError as e:
            raise scan.named_error(e, job.spec, None, shards) from e

    def write(out, group):
        if not job.image and job.options.format == CSV:
            return writer.write_csv(out, columns, (row for _, row in group))
        return writer.write_tfrecord(out, (writer.serialize(dict(zip(columns, row))) for _, row in group))

    stream = itertools.groupby(rows(), key=lambda item: item[0])
    for i in indices:
        if i in empty:
            yield i, write(job.outputs[i], ())
            continue
        found, group = next(stream)
        assert found == i, (found, i)  # the stream is in shard order
        yield i, write(job.outputs[i], group)


def class_names(job: Job) -> tuple[str, ...]:
    """One name per class: the run's `class_names` when it has one per model output, else `class <i>`."""
    names = tuple(job.loaded.spec.class_names) if job.loaded.spec else ()
    return names if len(names) == job.geometry.channels else tuple(f"class {i}" for i in range(job.geometry.channels))


def write_maps(job: Job) -> list[str]:
    """Write the map of the whole export (`geotiff.write`: every output shard must be complete) and return the
    lines to say: each file, and how to open it."""
    grid = geotiff.Grid.from_mixer(job.shards.mixer, job.geometry.patch)
    classification = job.task == CLASSIFICATION
    written = geotiff.write(job.outputs, grid, job.maps, classification=classification, bands=job.band_names,
                            classes=class_names(job) if classification else ())
    lines = []
    for path in written:
        what = ("PNG quick-look" if path == job.maps.quicklook else
                f"Cloud-Optimized GeoTIFF, {grid.width} x {grid.height} pixels, {grid.crs}, " +
                ("class ids with a colour table" if classification and path == job.maps.map else
                 "one float32 band per " + ("class" if classification else "output")))
        lines.append(f"  {os.path.basename(path)}: {what}")
    if job.maps.quicklook not in written:
        lines.append("  (no PNG quick-look: matplotlib is not installed; it comes with the `profile` extra)")
    return lines


def _step_fn(job: Job):
    """The compiled model call and post-processing: for images, resized back to the read side (a run with
    `resize`) and cropped by k/2 per side (an output of the stored size) (`model.Geometry.restore`), then
    class ids (int64 argmax) and probabilities (float32 softmax, unless the model returns them), or the
    regression outputs (float32). Returns a list of arrays [b, P, P] (images) or [b] (tables), one per band."""
    cached = getattr(job, "_step", None)
    if cached is not None:
        return cached
    model, g = job.loaded.model, job.geometry
    softmax = not model_lib.applies_softmax(model)
    probabilities = job.task == CLASSIFICATION and len(job.band_names) > 1

    # Traced as written; AutoGraph converts the user's model only (`harness.tracing`).
    forward = user_code(lambda inputs: model(inputs, training=False))

    def step(inputs):
        if g.per_pixel:   # a table run's model over patches: one row per pixel of the central P x P
            y = g.per_pixel_map(tf.cast(forward(g.pixels(inputs)), tf.float32), tf.shape(inputs)[0])
        else:
            y = tf.cast(forward(inputs), tf.float32)
        if y.shape.rank == (3 if job.image else 1):
            y = y[..., None]
        if job.image:
            y = g.restore(y)
        if job.task != CLASSIFICATION:
            return [y[..., c] for c in range(g.channels)]
        out = [tf.argmax(y, axis=-1, output_type=tf.int64)]
        if probabilities:
            p = tf.nn.softmax(y, axis=-1) if softmax else y
            out += [p[..., c] for c in range(g.channels)]
        return out

    step = graph_function(step, reduce_retracing=True)
    object.__setattr__(job, "_step", step)
    return step


# Earth Engine's TfRecordImageExportOptions: "maxMaskedRatio: Maximum allowed proportion of masked pixels in a
# patch. Patches which exceed this allowance will be dropped rather than written to files. If this field is set to
# anything but 1, the JSON sidecar will not be produced." (docs/GEE_FORMAT.md, "Layout options")
NO_MIXER = ("no upload: the export has no mixer.json, which Earth Engine writes only when no patch was dropped "
            "(maxMaskedRatio below 1 drops patches with more masked pixels and then writes no sidecar), so neither "
            "Earth Engine nor a GeoTIFF can place these patches (no map is written); the predictions above are in "
            "the export's patch order. "
            "To upload a mosaic, export the image again with maxMaskedRatio 1 (the default; masked pixels are then "
            "filled with defaultValue) and predict on that export")


def upload_lines(job: Job) -> list[str]:
    """The commands that upload the outputs to Earth Engine, in order (`harness.predict.upload`): zero-record
    shards left out; for images the mixer copy last; for tables the whole CSV (or the TFRecord files). Local
    outputs are copied to a bucket first (the CLI reads only gs://)."""
    files = files_with_records([(out, n) for out, (_, n) in zip(job.outputs, job.shards.counts)])
    if job.image and job.shards.mixer is None:
        return []
    if job.image:
        return upload.lines([*files, job.mixer_copy], image=True) if files else []
    flags = identity.location_flags(job.kept_columns)
    if flags is None:   # no location in the rows: `identity.NO_LOCATION` is said instead
        return []
    files = [job.merged_csv] if job.options.format == CSV else files
    return upload.lines(files, image=False, table_flags=flags) if files else []


def read_outputs(paths) -> list[dict]:
    """Every Example of TFRecord outputs in order, as {band: numpy array} (tests and `inspect`-like checks)."""
    rows = []
    for path in paths:
        for raw in tf.data.TFRecordDataset(path):
            ex = tf.train.Example.FromString(raw.numpy())
            row = {}
            for k, f in ex.features.feature.items():
                kind = f.WhichOneof("kind")
                row[k] = np.array(getattr(f, kind).value)
            rows.append(row)
    return rows
