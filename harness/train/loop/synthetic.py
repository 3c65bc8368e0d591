"""Synthetic batches on the device: one random batch per replica, generated once and fed to every step.

As tf_cnn_benchmarks' and Horovod's synthetic benchmarks do: no input pipeline runs, so a run on these batches
measures what the model, the precision and the all-reduce allow (the compute ceiling). `harness bench train --data
synthetic` feeds them to a whole benchmark; `harness train --profile` to a short probe of the run's own model and
batch (`harness.train.measure.probe`), for the input cost.

`OnDeviceBatches` can be passed into the loop's `tf.function` like a tf.data iterator: `next()` there returns the
one batch, which the function captures as an input, so the loop runs its K steps per call on synthetic data as it
does on real data (no host-fed steps, no per-step dispatch that real data would not pay).
"""
from __future__ import annotations

import dataclasses
from typing import Union

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What one example looks like.

    Attributes:
      kind: "image" or "table" (`harness.data.spec.dataspec`).
      input_shape: the model's input without the batch axis, or a dict of them (band groups).
      num_classes: label values are drawn from [0, num_classes).
      label_shape: the label without the batch axis: `[height, width]` for an image mask (default for "image":
        the input's leading axes), `[]` for a table row.
    """

    kind: str
    input_shape: Union[Shape, dict]
    num_classes: int
    label_shape: Shape | None = None

    @classmethod
    def from_spec(cls, spec, num_classes: int) -> "Shapes":
        """The shapes a `DataSpec`'s pipeline delivers."""
        shape = spec.input_shape
        shape = {k: tuple(v) for k, v in shape.items()} if isinstance(shape, dict) else tuple(shape)
        return cls(spec.kind, shape, num_classes, tuple(spec.label_shape))

    @property
    def labels(self) -> Shape:
        if self.label_shape is not None:
            return tuple(self.label_shape)
        return tuple(self.input_shape[:-1]) if self.kind == "image" else ()


class OnDeviceBatches:
    """An endless iterator over one distributed batch (see the module's docstring)."""

    in_graph = True   # `harness.train.loop.trainer` passes it into its K-step tf.function

    def __init__(self, batch):
        self.batch = batch

    def __iter__(self):
        return self

    def __next__(self):
        return self.batch


def synthetic_batches(strategy, shapes: Shapes, per_replica_batch: int, seed: int = 0) -> OnDeviceBatches:
    """One random `(inputs, labels)` batch per replica, generated once on the replica's device: inputs uniform in
    [0, 1) float32, labels uniform int32 in [0, num_classes)."""
    import tensorflow as tf

    from harness.distribute.strategy import replica_devices

    devices = replica_devices(strategy)  # this worker's replicas, in replica order

    def value_fn(ctx):
        with tf.device(devices[ctx.replica_id_in_sync_group % len(devices)]):
            g = tf.random.Generator.from_seed(seed + ctx.replica_id_in_sync_group)
            shape = shapes.input_shape
            x = ({k: g.uniform([per_replica_batch, *s]) for k, s in shape.items()} if isinstance(shape, dict)
                 else g.uniform([per_replica_batch, *shape]))
            y = g.uniform([per_replica_batch, *shapes.labels], maxval=shapes.num_classes, dtype=tf.int32)
        return x, y

    return OnDeviceBatches(strategy.experimental_distribute_values_from_function(value_fn))
