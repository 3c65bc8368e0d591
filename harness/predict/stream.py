"""The prediction stream: the shards read in order (`harness.predict.reader`), the model's compiled step and its
post-processing (class ids, probabilities or regression outputs), each shard's predictions written whole
(`harness.predict.writer`)."""
from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np
import tensorflow as tf

from harness import keras_kinds
from harness.data.export import scan
from harness.predict import model as model_lib, reader, writer
from harness.predict.options import CLASSIFICATION, CSV
from harness.tracing import graph_function, user_code


def predict_shards(job, indices) -> Iterator[tuple[int, int]]:
    """Predict every record of the shards `indices` (in order) of `job` (`harness.predict.job.Job`) and write
    each one's output atomically, yielding `(index, records written)` as each file is complete.

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


def _step_fn(job):
    """The compiled model call and post-processing: for images, resized back to the read side (a run with
    `resize`) and cropped by k/2 per side (an output of the stored size) (`model.Geometry.restore`), then
    class ids (int64 argmax) and probabilities (float32 softmax, unless the model returns them), or the
    regression outputs (float32). Returns a list of arrays [b, P, P] (images) or [b] (tables), one per band."""
    cached = getattr(job, "_step", None)
    if cached is not None:
        return cached
    model, g = job.loaded.model, job.geometry
    softmax = keras_kinds.softmax_output(model) is None   # a softmax last layer: its outputs are probabilities
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
