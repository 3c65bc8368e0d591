"""What the model is fed: the run's spec read against the export (`read_spec`), the names of the written bands
(`band_names`), the properties kept beside a table's predictions (`kept_properties`), and every record of the
shards once, in order, in batches (`ordered_batches`; the last batch of a shard may be smaller).

No shuffle, no interleave across files, no drop_remainder: a shard is one `TFRecordDataset` read from its first
record to its last, so the i-th prediction of a shard is the i-th record of it, whatever the batch size. Bands are
decoded by the training pipeline's own `decode` (`harness.data.input.decode`), so the model sees what it was trained on.
"""
from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from harness.data.input import decode
from harness.data.spec import dataspec as spec_lib, infer
from harness.data.export.records import BYTES, INT64
from harness.data.export.shards import Shard, read_buffer_bytes
from harness.data.export.source import ShardSet
from harness.data.spec.dataspec import DataSpec
from harness.errors import ConfigError, MissingFeatureError
from harness.predict import identity, model as model_lib
from harness.predict.options import CLASSIFICATION, PredictOptions
from harness.tracing import graph_fn


def keep_description(kept: dict[str, str]) -> dict:
    """`tf.io.parse_example` features of the kept properties (name -> storage dtype), one value each."""
    types = {INT64: tf.int64, BYTES: tf.string}
    return {name: tf.io.FixedLenFeature([], types.get(dtype, tf.float32)) for name, dtype in kept.items()}


def ordered_batches(shards: Sequence[Shard], spec: DataSpec, batch_size: int,
                    kept: dict[str, str]) -> tf.data.Dataset:
    """Batches of the shards, shard after shard, each shard's records in order.

    Args:
      shards: the shards to read, in order (a worker's contiguous run, less the complete ones).
      spec: the read spec, without label; `crop_margin` set when the model takes the central P x P.
      kept: table exports: properties copied to the output, name -> storage dtype ("float", "int64", "bytes").
    Returns:
      a dataset of `(position, inputs, kept)`: position int32, the batch's shard (its index in `shards`); inputs
      float32 [b, S, S, C] (or [b, P, P, C] cropped) for images, [b, C] for tables, 1 <= b <= batch_size (smaller
      only for a shard's last batch: a batch never mixes shards); kept {name: [b]} float32, int64 or string.
      Reading and decoding run ahead of the consumer across file boundaries (one `flat_map`, then a parallel,
      deterministic map and a prefetch).
    Raises (when iterated):
      tf.errors.InvalidArgumentError: for a record that lacks a band or holds another number of values
        (`harness.data.export.scan.named_error` names it).
    """
    keep = keep_description(kept)
    files = tf.data.Dataset.from_tensor_slices((tf.range(len(shards), dtype=tf.int32), [s.path for s in shards],
                                               [s.compression for s in shards]))

    buffer = read_buffer_bytes([s.path for s in shards])

    def read(position, path, compression):
        ds = tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=buffer)
        return ds.batch(batch_size, drop_remainder=False).map(graph_fn(lambda records: (position, records)))

    def parse(position, serialized):
        inputs = decode.decode(spec, serialized)
        return position, inputs, tf.io.parse_example(serialized, keep) if keep else {}

    ds = files.flat_map(graph_fn(read))
    ds = ds.map(graph_fn(parse), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def missing_kept(names: Sequence[str], schema: dict) -> list[str]:
    """The `--keep` properties absent from the records' schema."""
    return [n for n in names if n not in schema]


def read_spec(options: PredictOptions, loaded: model_lib.LoadedModel, shards: ShardSet) -> spec_lib.DataSpec:
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
    # resizes the output back (model.Geometry.restore). Else the side is found from the model
    # (`harness.predict.job.prepare`).
    resized = run is not None and run.kind == spec_lib.IMAGE and run.resize
    return exported.replace(bands=tuple(bands), label=None, dtypes=dtypes,
                            depths={b: d for b, d in layout.depths.items() if b in bands},
                            collapsed=layout.collapsed, sequence=layout.sequence,
                            input_nodata=run.input_nodata if run is not None else None,
                            input_fill=run.input_fill if run is not None else {},
                            band_groups=run.band_groups if grouped else {},
                            group_delivery=run.group_delivery if grouped else spec_lib.DICT,
                            crop_margin=bool(resized and run.crop_margin), resize=run.resize if resized else None)


def band_names(options: PredictOptions, task: str, channels: int) -> tuple[str, ...]:
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


def kept_properties(options: PredictOptions, loaded: model_lib.LoadedModel, shards: ShardSet, spec,
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
    absent = missing_kept(options.keep, schema)
    if absent:
        raise MissingFeatureError(f"{shards.shards[0].path}: --keep {absent[0]!r} is absent from the records "
                                  f"(they hold {sorted(schema)})")
    clash = sorted(set(options.keep) & set(names))
    if clash:
        raise ConfigError(f"--keep {clash[0]!r} has the name of a prediction column; rename it with --output-bands")
    return {**{k: schema[k].dtype for k in options.keep}, **({truth: schema[truth].dtype} if truth else {})}, truth
