"""The model to predict with: loaded from a run folder or a `.keras` file, and checked against the export.

`Geometry` says, for image exports, which patch the model is fed (the stored (P+k) x (P+k) patch, or its central
P x P when the model was built for cropped patches) and how much of its output to crop (k/2 per side when the
output has the stored size, nothing when it is already P x P). Every check runs on the model's shapes and one
dry call on zeros, before any record is predicted.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Mapping, Optional

import tensorflow as tf

from harness.run_folder import find_model
from harness.data.spec.dataspec import IMAGE, TABLE, TIME, DataSpec
from harness.errors import ModelMismatchError, PredictError


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A Keras model and what its run says of it.

    Attributes:
      model: the Keras model (Keras 3 or tf-keras, as saved: `harness.keras_kinds.of_file`).
      path: the `.keras` file it was loaded from.
      sha256: hex digest of that file (a re-run with another model is another run).
      spec: the run's `DataSpec` from `summary.json` (`spec`), or None for a bare model.
    """

    model: object
    path: str
    sha256: str
    spec: Optional[DataSpec]


def load(path: str, *, float32: bool = False) -> LoadedModel:
    """Load `path`: a run folder (`model.keras`, `summary.json`) or a `.keras` file (a `summary.json` beside it
    is read when present).

    `float32`: a model trained under a mixed policy (float16 or bfloat16 compute) is rebuilt to compute in float32
    (`as_float32`): float16 kernels are slow on CPUs (tensorflow/tensorflow#35379), and a serving host or a
    predicting worker without a GPU gets no gain from them.

    The model file the run was trained with (recorded in the `.keras`, `harness.model_code`) is imported first, so
    that its registered classes load.

    Raises:
      ModelFileError (a PredictError): if the model file is missing; PredictError: if it cannot be loaded;
      UserCodeError: the model file it was trained with does not import here and it does not load without it.
    """
    from harness import keras_kinds

    model_path = find_model(path, flag="--model")
    with tf.io.gfile.GFile(model_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    try:
        model = keras_kinds.load_model(model_path, flag="--model")   # with the Keras that saved it
    except (OSError, ValueError, TypeError) as e:
        raise PredictError(f"{model_path}: cannot load the Keras model: {e}") from e
    if float32:
        model = as_float32(model)
    summary = os.path.join(os.path.dirname(model_path), "summary.json")
    spec = None
    if tf.io.gfile.exists(summary):
        with tf.io.gfile.GFile(summary) as f:
            run = json.load(f)
        config = run.get("spec")
        spec = DataSpec.from_config(config) if config else None
        if run.get("model_error"):
            import logging

            logging.getLogger(__name__).warning(
                "%s: the run's last save failed (%s): %s is the model saved before it; run its `harness train` "
                "command again to save the trained one", summary, run["model_error"], model_path)
    return LoadedModel(model=model, path=model_path, sha256=digest, spec=spec)


def compute_dtypes(model) -> set:
    """The compute dtypes of the model's layers (`"float32"`, `"float16"`, ...)."""
    return {str(getattr(layer, "compute_dtype", None) or "float32") for layer in model.layers}


def as_float32(model):
    """`model` computing in float32: the same layers and weights, every layer's dtype policy float32; the model
    itself when it already computes in float32, or when its config cannot be rebuilt (a subclassed model without
    `get_config`: it keeps its policy, and predict says so)."""
    import logging

    if compute_dtypes(model) <= {"float32"}:
        return model
    try:
        config = model.get_config()
    except NotImplementedError:
        logging.getLogger(__name__).warning("%s computes in %s and has no get_config: predicted as trained",
                                            model.name, "/".join(sorted(compute_dtypes(model))))
        return model

    def to_float32(node):
        if isinstance(node, dict):
            return {k: ("float32" if k == "dtype" and _mixed(v) else to_float32(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [to_float32(v) for v in node]
        return node
    rebuilt = type(model).from_config(to_float32(config))
    rebuilt.set_weights(model.get_weights())
    logging.getLogger(__name__).info("%s rebuilt to compute in float32 (trained in %s)", model.name,
                                     "/".join(sorted(compute_dtypes(model) - {"float32"})))
    return rebuilt


def _mixed(dtype) -> bool:
    """A layer config's `dtype`: a mixed policy (a string, or tf-keras's/Keras 3's serialized Policy)."""
    name = dtype if isinstance(dtype, str) else ((dtype or {}).get("config") or {}).get("name", "")
    return isinstance(name, str) and name.startswith("mixed_")


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How patches go through the model (images); tables have side 0 and crop 0.

    Attributes:
      input_side: side of the patch read for the model: stored S = P + k, or P (the central crop).
      crop: pixels cut from each side of the model's output: k/2 when the output is S x S, else 0.
      patch: P, the side of every written band (P*P values).
      channels: the model's output channels (classes, or regression outputs).
      resize: the side the model runs at when its run resized the patches (spec `resize: R`), else 0: the
        input_side patch is resized to R x R (bilinear, as in training) and the model's R x R output (logits,
        probabilities or values) resized back to input_side (bilinear) before the crop and the argmax.
      per_pixel: a model trained on a table export (rows of bands) over an image export: each patch's central
        P x P pixels are its rows (`pixels`), its outputs the P x P map (crop 0: cut before the model).
    """

    input_side: int
    crop: int
    patch: int
    channels: int
    resize: int = 0
    per_pixel: bool = False

    def pixels(self, x):
        """A per-pixel model's input: float32 `[b, S, S, C]` patches -> `[b * P * P, C]` rows of their central
        P x P pixels (the kernel margin cut: a row model sees no neighbours)."""
        m = (self.input_side - self.patch) // 2
        x = x[:, m:m + self.patch, m:m + self.patch]
        return tf.reshape(x, [-1, tf.shape(x)[-1]])

    def per_pixel_map(self, y, batch):
        """A per-pixel model's output `[b * P * P(, outputs)]` -> `[b, P, P(, outputs)]`."""
        return tf.reshape(y, tf.concat([[batch, self.patch, self.patch], tf.shape(y)[1:]], 0))

    def restore(self, y):
        """The model's output float32 `[b, side, side, channels]` -> `[b, P, P, channels]`: resized back to
        input_side (a run with `resize`), then cropped by `crop` per side."""
        if self.resize:
            y = tf.image.resize(y, [self.input_side, self.input_side], method="bilinear")
        if self.crop:
            y = y[:, self.crop:self.crop + self.patch, self.crop:self.crop + self.patch]
        return y


def check(loaded: LoadedModel, spec: DataSpec, where: str) -> Geometry:
    """Check the model against the export's spec (bands, band groups, patch size, kernel margin) and find its
    geometry.

    Args:
      spec: the export's spec (bands in the model's channel order, the run's band groups and their delivery, P
        from the mixer, k from the records).
      where: the export's first shard, named in the errors.
    Raises:
      ModelMismatchError: for model inputs other than the spec delivers (one tensor of every band; with band
        groups one input per group, named as the group, or one [time, ...] tensor), naming both shapes; an input
        whose channels differ from the bands; an image input whose side is neither S nor P (or the run's patch
        size differing from the export's); an odd kernel margin; an output whose side is neither S nor P, or
        whose rank is not that of a per-pixel (image) or per-row (table) output.
    """
    model, name = loaded.model, loaded.path
    if spec.kind == IMAGE and loaded.spec is not None and loaded.spec.kind != IMAGE:
        return _per_pixel(loaded, spec, where)
    side = _input_side(loaded, spec, where)
    if spec.kind == IMAGE and spec.resize and spec.resize != spec.output_size_before_resize:
        return _resized(loaded, spec, where, side)
    if spec.kind != IMAGE:
        out = _dry_run(model, _zeros(spec, None))
        if out.shape.rank not in (1, 2):
            raise ModelMismatchError(f"{name}: output shape {out.shape} is not [batch] or [batch, outputs]")
        return Geometry(0, 0, 0, 1 if out.shape.rank == 1 else int(out.shape[-1]))
    p, k = spec.patch_size, spec.kernel_margin
    s = p + k
    run = loaded.spec
    if run is not None and run.kind == IMAGE and run.patch_size != p:
        raise ModelMismatchError(f"{name}: the run was trained on {run.patch_size}x{run.patch_size} patches, "
                                 f"{where} holds {p}x{p} patches (mixer patchDimensions)")
    if k % 2:
        raise ModelMismatchError(f"{where}: stored patches of {s}x{s} for patchDimensions {p}x{p} imply an odd "
                                 f"kernel margin {k}: it cannot be cropped by k/2 on each side")
    if side not in (None, s, p):
        trained = f" (the run's spec: P={run.patch_size}, margin {run.kernel_margin})" if run else ""
        raise ModelMismatchError(f"{name}: the model takes {side}x{side} patches{trained}; {where} stores "
                                 f"{s}x{s} (P={p} + kernel margin {k}), cropped {p}x{p}")
    side = side or s
    out = _dry_run(model, _zeros(spec, side))
    if out.shape.rank not in (3, 4) or out.shape[1] != out.shape[2] or out.shape[1] not in (s, p):
        raise ModelMismatchError(f"{name}: on {side}x{side} patches the model returns {list(out.shape)}; expected "
                                 f"[batch, {s}, {s}(, outputs)] (the stored patch, cropped by {k // 2} per side) "
                                 f"or [batch, {p}, {p}(, outputs)] (already cropped)")
    crop = (out.shape[1] - p) // 2
    return Geometry(side, crop, p, 1 if out.shape.rank == 3 else int(out.shape[-1]))


def _per_pixel(loaded: LoadedModel, spec: DataSpec, where: str) -> Geometry:
    """The geometry of a model trained on a table export (one row of bands per example) over an image export:
    applied to every pixel of the central P x P of each patch, as 1x1 convolutions would be (layers that act on
    the last axis see one pixel's bands as one row). A run with band groups delivers its rows as several inputs or
    a time axis, which no patch reshapes into: refused, as a model whose rows are not `[batch, bands]`."""
    model, name, run = loaded.model, loaded.path, loaded.spec
    if run.band_groups:
        raise ModelMismatchError(f"{name}: the run was trained on a table export with band groups "
                                 f"({_delivery(run)}); a per-pixel prediction over {where}'s patches feeds one row "
                                 "of every band per pixel: train without groups to map an image export")
    rows = DataSpec(kind=TABLE, bands=spec.bands, depths=spec.depths)
    _input_side(loaded, rows, where)   # [batch, bands]: the bands in the run's order, matched by name
    out = _dry_run(model, _zeros(rows, None))
    if out.shape.rank not in (1, 2):
        raise ModelMismatchError(f"{name}: output shape {out.shape} is not [batch] or [batch, outputs]: not a "
                                 "per-row model")
    if spec.kernel_margin % 2:
        raise ModelMismatchError(f"{where}: an odd kernel margin {spec.kernel_margin} cannot be cut by k/2 per side")
    return Geometry(spec.patch_size + spec.kernel_margin, 0, spec.patch_size,
                    1 if out.shape.rank == 1 else int(out.shape[-1]), per_pixel=True)


def _resized(loaded: LoadedModel, spec: DataSpec, where: str, side: Optional[int]) -> Geometry:
    """The geometry of a run that resized its patches (spec `resize: R`): the model takes and returns R x R."""
    model, name = loaded.model, loaded.path
    p, r, base = spec.patch_size, spec.resize, spec.output_size_before_resize
    if side not in (None, r):
        raise ModelMismatchError(f"{name}: the model takes {side}x{side} patches; the run's spec delivers "
                                 f"{base}x{base} patches resized to {r}x{r} (resize: {r})")
    out = _dry_run(model, _zeros(spec, r))
    if out.shape.rank not in (3, 4) or out.shape[1] != out.shape[2] or out.shape[1] != r:
        raise ModelMismatchError(f"{name}: on {r}x{r} patches (the run's resize) the model returns "
                                 f"{list(out.shape)}; expected [batch, {r}, {r}(, outputs)], resized back to "
                                 f"{base}x{base}")
    return Geometry(base, (base - p) // 2, p, 1 if out.shape.rank == 3 else int(out.shape[-1]), resize=r)


def _input_side(loaded: LoadedModel, spec: DataSpec, where: str) -> Optional[int]:
    """Check the model's inputs against what `decode.decode` delivers for `spec` (the stored side S standing
    for any side: `check` checks the side) and return the side of its image inputs (None: any side, or a table).
    """
    model, name = loaded.model, loaded.path
    delivered = spec.input_shape  # crop_margin is off: image sides are S
    keyed = isinstance(delivered, Mapping)
    names, shapes = _model_inputs(model)
    if shapes is None:   # a subclassed model built on other than one tensor: its dry run checks it
        return None
    takes = dict(zip(names, shapes)) if keyed or len(shapes) != 1 else shapes[0]
    if not spec.band_groups:  # the common case keeps its plainer messages
        if len(shapes) != 1:
            raise ModelMismatchError(f"{name}: the model takes {len(shapes)} inputs; predict feeds one tensor of "
                                     "every band")
        channels = takes[-1] if takes else None
        if channels is not None and channels != len(spec.channels):
            raise ModelMismatchError(f"{name}: the model takes {channels} bands, {where} gives {len(spec.channels)} "
                                     f"({', '.join(spec.channels)})")
    if keyed:  # one input per group, matched by name as Keras matches a dict
        same = isinstance(takes, dict) and set(takes) == set(delivered)
        pairs = [(takes[g], delivered[g]) for g in delivered] if same else [(None, None)]
    else:
        pairs = [(takes, delivered)] if isinstance(takes, tuple) else [(None, None)]
    spatial = {-3, -2} if spec.kind == IMAGE else set()
    sides = set()
    for got, want in pairs:
        fits = got is not None and len(got) == len(want) and all(
            g is None or g == w or i - len(want) in spatial for i, (g, w) in enumerate(zip(got, want)))
        if not fits:
            raise ModelMismatchError(f"{name}: the model takes {_shapes(takes)}; {where} gives {_shapes(delivered)} "
                                     f"per the run's spec ({_delivery(spec)}; image sides S or P)")
        sides |= {got[i] for i in (-3, -2) if spec.kind == IMAGE and got[i] is not None}
    if len(sides) > 1:
        raise ModelMismatchError(f"{name}: the model's inputs take patches of different sides {sorted(sides)}; "
                                 f"{where} gives every band group the same side")
    return sides.pop() if sides else None


def _model_inputs(model) -> tuple:
    """`(names, shapes)` of the model's inputs without the batch axis: a functional model's `inputs`; a subclassed
    model's (Keras 3 or tf-keras, which has no `inputs`) from the shape it was built on (`get_build_config`), one
    tensor; `(None, None)` where that is not one tensor's shape."""
    inputs = getattr(model, "inputs", None)
    if inputs:
        names = getattr(model, "input_names", None) or [getattr(t, "name", "") for t in inputs]   # Keras 3: none
        return list(names), [tuple(t.shape[1:]) for t in inputs]
    try:
        shape = (model.get_build_config() or {}).get("input_shape")
    except (AttributeError, NotImplementedError):
        shape = None
    if not isinstance(shape, (list, tuple)) or not all(d is None or isinstance(d, int) for d in shape):
        return None, None
    return [model.name], [tuple(shape[1:])]


def _shapes(shapes) -> str:
    """Input shapes with the batch axis: `[batch, 2, 4]`, or `{before: [batch, 4], ...}` (named inputs)."""
    def one(shape):
        return "[" + ", ".join(["batch", *("None" if d is None else str(d) for d in shape)]) + "]"
    if isinstance(shapes, Mapping):
        return "{" + ", ".join(f"{k}: {one(v)}" for k, v in shapes.items()) + "}"
    return one(shapes)


def _delivery(spec: DataSpec) -> str:
    if not spec.band_groups:
        return "one tensor of the bands " + ", ".join(spec.channels)
    groups = "; ".join(f"{g}: {', '.join(b)}" for g, b in spec.band_groups.items())
    how = "stacked on a time axis" if spec.group_delivery == TIME else "one input per group, named as the group"
    return f"band groups {groups}, {how}"


def _zeros(spec: DataSpec, side: Optional[int]):
    """One record of zeros as `decode.decode` delivers it for `spec`, image sides `side`."""
    def one(shape):
        shape = list(shape)
        if spec.kind == IMAGE:
            shape[-3] = shape[-2] = side
        return tf.zeros([1, *shape], tf.float32)
    delivered = spec.input_shape
    return {g: one(s) for g, s in delivered.items()} if isinstance(delivered, Mapping) else one(delivered)


def _dry_run(model, inputs) -> tf.Tensor:
    return tf.convert_to_tensor(model(inputs, training=False))

