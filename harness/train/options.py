"""`TrainOptions`: everything `harness train` needs besides the data spec, checked on construction, and the YAML
run config merged with the command line's flags (flags win).
"""
from __future__ import annotations

import dataclasses

from harness.choices import BACKENDS, CACHE_MODES, CLASS_WEIGHTS, PARSE_PLACEMENTS, PRECISIONS, STRATEGIES
from harness.distribute.context import one_process_per_replica
from harness.errors import ConfigError
from harness.train.report.progress import DEFAULT_INTERVAL_S

_INT_FIELDS = {"epochs", "global_batch_size", "per_replica_batch_size", "cpu_replicas", "num_classes",
               "shuffle_buffer", "seed", "warmup_steps", "base_batch_size", "early_stopping", "parallel_reads",
               "map_parallelism", "prefetch"}
_BOOL_FIELDS = {"augment", "profile", "check_sharding", "nesterov", "tune"}
_FLOAT_FIELDS = {"brightness", "contrast", "min_delta", "focal_gamma", "learning_rate", "momentum", "weight_decay", "warmup_epochs", "decay_epochs", "decay_rate",
                 "clip_norm", "progress_every"}


def _check_option_types(options: "TrainOptions") -> None:
    """Raise ConfigError naming `train.<field>`, the value and the expected type (a YAML `epochs: "5"` is a
    string; `true` is not a number)."""
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        if value is None or field.name in ("data", "validation_data"):
            continue
        if field.name == "steps_per_loop":
            ok = value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
            want = "auto or an integer >= 1"
        elif field.name in _INT_FIELDS:
            ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif field.name in _BOOL_FIELDS:
            ok, want = isinstance(value, bool), "true or false"
        elif field.name == "model_args":
            ok, want = isinstance(value, dict) and all(isinstance(k, str) for k in value), \
                "a mapping of keyword arguments"
        elif field.name in _FLOAT_FIELDS:
            ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        else:
            ok, want = isinstance(value, str), "a string"
        if not ok:
            raise ConfigError(f"train.{field.name}: expected {want}, got {value!r} ({type(value).__name__})")


DEFAULT_PER_REPLICA_BATCH_SIZE = 32   # when neither --global-batch-size nor --per-replica-batch-size is given


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """Everything `harness train` needs besides the data spec. Field names match the command-line flags and the
    `train:` section of the YAML config (flags win)."""

    data: tuple[str, ...]
    validation_data: tuple[str, ...] = ()
    mixer: str | None = None
    epochs: int = 5
    global_batch_size: int | None = None
    per_replica_batch_size: int | None = None
    learning_rate: float = 1e-3
    precision: str = "float32"
    strategy: str = "auto"
    cpu_replicas: int = 1
    output: str = "runs/train"
    num_classes: int | None = None
    class_weights: str = "none"
    cache: str = "auto"
    cache_dir: str | None = None
    shuffle_buffer: int | None = None   # records; None: about 256 MB of records (the pipeline's default)
    augment: bool = False
    seed: int = 0
    profile: bool = False
    profile_steps: str | None = None
    profile_dir: str | None = None
    data_service: str | None = None
    backend: str = "tf"
    check_sharding: bool = False
    steps_per_loop: int | str = "auto"   # steps per tf.function call, or "auto" (`harness.train.loop.controller`)
    model: str | None = None            # MODULE:FUNCTION or path/to/file.py:FUNCTION (harness.train.model.user)
    model_args: dict | None = None      # keyword arguments for the model function
    init_from: str | None = None        # MODEL.keras or a run folder holding model.keras
    optimizer: str = "adam"             # adam | adamw | sgd (harness.train.model.optim)
    momentum: float | None = None       # sgd
    nesterov: bool = False              # sgd
    weight_decay: float | None = None   # decoupled; adamw's default optim.ADAMW_WEIGHT_DECAY
    schedule: str = "constant"          # constant | cosine | step | exponential, after warm-up
    warmup_steps: int | None = None
    warmup_epochs: float | None = None
    decay_epochs: float | None = None   # step / exponential: epochs per decay period (default 1)
    decay_rate: float | None = None     # step / exponential: factor per period (default 0.1 / 0.5)
    scale_lr: str = "none"              # none | linear | sqrt, against base_batch_size
    base_batch_size: int | None = None
    clip_norm: float | None = None      # global norm, after the cross-replica reduction and unscaling
    loss: str | None = None             # crossentropy | focal | dice | crossentropy+dice | mse | mae | MODULE:FUNCTION;
                                        # None: crossentropy (classification), mse (regression)
    focal_gamma: float = 2.0
    monitor: str | None = None          # a key of the epoch logs: keeps the best epoch's model (best/model.keras)
    early_stopping: int | None = None   # patience in epochs (harness.train.lifecycle.early_stopping)
    min_delta: float = 0.0
    brightness: float = 0.0             # training inputs x U(1 - b, 1 + b) per example (harness.data.input.augment)
    contrast: float = 0.0               # image bands around their mean x U(1 - c, 1 + c)
    # the input pipeline's levers (`harness tune` writes them; `harness.data.input.stages.PipelineOptions`)
    parse: str = "auto"                 # auto | records | batches
    parallel_reads: int | None = None   # files read at once; None: one per CPU
    map_parallelism: int | None = None  # calls in flight of each parallel map; None: AUTOTUNE
    prefetch: int | None = None         # batches; None: AUTOTUNE
    tune: bool = False                  # the four levers and the cache decided before training (measure.tune)
    progress_every: float = DEFAULT_INTERVAL_S  # seconds between progress lines off a terminal; 0: none
    mlflow: str | None = None           # an MLflow tracking server's URI (else MLFLOW_TRACKING_URI; report.tracking)
    mlflow_experiment: str = "harness"  # the MLflow experiment the run goes into

    def __post_init__(self):
        from harness.train.model import optim

        optim.refuse_built(self.optimizer, "optimizer")  # an object, before the type check calls it "not a string"
        optim.refuse_built(self.schedule, "schedule")
        _check_option_types(self)
        optim.check_options(self)
        for name, choices in (("backend", BACKENDS), ("precision", PRECISIONS), ("strategy", STRATEGIES),
                              ("cache", CACHE_MODES), ("parse", PARSE_PLACEMENTS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if self.class_weights not in CLASS_WEIGHTS:
            _weights(self.class_weights)
        if one_process_per_replica(self.backend) and (self.strategy != "auto" or self.cpu_replicas != 1):
            raise ConfigError("--strategy and --cpu-replicas choose a tf.distribute strategy; --backend horovod runs "
                              "one replica per process (start more processes: mpirun -np / horovodrun -np)")
        if self.global_batch_size is None and self.per_replica_batch_size is None:
            object.__setattr__(self, "per_replica_batch_size", DEFAULT_PER_REPLICA_BATCH_SIZE)
        for name in ("brightness", "contrast"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("parallel_reads", "map_parallelism", "prefetch"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.progress_every < 0:
            raise ConfigError(f"progress_every must be >= 0 seconds (0: no progress lines), got {self.progress_every}")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if not self.learning_rate > 0:
            raise ConfigError(f"learning rate must be > 0, got {self.learning_rate}")


    @property
    def loop_steps(self) -> int | None:
        """`controller.Schedule.steps_per_loop`: K, or None for auto."""
        return None if self.steps_per_loop == "auto" else self.steps_per_loop


def _weights(text: str) -> list[float]:
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise ConfigError(f"class_weights: expected none, balanced or comma-separated numbers, got {text!r}") from None


def class_weights(option: str, num_classes: int, labels) -> list[float] | None:
    """Per-class loss weights, `[num_classes]`: `none` (None), `balanced` (n / (classes x count_c), as
    scikit-learn's `compute_class_weight`) from a sample of `labels`, or comma-separated weights.

    Raises:
      ConfigError: if the number of weights given differs from `num_classes`.
    """
    import numpy as np
    if option == "none":
        return None
    if option == "balanced":
        counts = np.bincount(np.asarray(labels).ravel(), minlength=num_classes).astype(np.float64)
        return (counts.sum() / (num_classes * np.maximum(counts, 1))).tolist()
    weights = _weights(option)
    if len(weights) != num_classes:
        raise ConfigError(f"--class-weights has {len(weights)} values for {num_classes} classes")
    return weights


def load_config(path: str) -> dict:
    """The YAML run config at `path`: a mapping with `data:` and `train:` sections.

    Raises:
      ConfigError: for invalid YAML (with its line and column), a top level that is not a mapping, an unknown
        section, or a section that is not a mapping.
    """
    import yaml

    with open(path) as f:
        try:
            config = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a mapping with sections 'data:' and 'train:', got "
                          f"{type(config).__name__}")
    unknown = set(config) - {"data", "train"}
    if unknown:
        raise ConfigError(f"{path}: unknown sections {sorted(unknown)}; expected 'data' and 'train'")
    for section in ("data", "train"):
        if not isinstance(config.get(section) or {}, dict):
            raise ConfigError(f"{path}: section '{section}:' must be a mapping of keys to values, got "
                              f"{config[section]!r}")
    return config


# Flags that are the spec's (`DataSpec.from_config` keys): `merge_options` moves them to the `data:` section.
DATA_FLAGS = ("label", "bands", "task", "ignore_label", "class_names", "input_nodata")


def merge_options(config: dict, given: dict) -> tuple[TrainOptions, dict]:
    """Merge a run config (`load_config`) with the options given on the command line (flags win).

    Args:
      config: `{"data": {...}, "train": {...}}` (either may be absent).
      given: option name -> value for the flags given (those of DATA_FLAGS go to the data section).
    Returns:
      `(TrainOptions, data section)`; the data section refines the inferred spec (`DataSpec.from_config` keys).
    Raises:
      ConfigError: for unknown keys (naming them and the valid ones), no training data, or a bad value.
    """
    train = dict(config.get("train") or {})
    data = dict(config.get("data") or {})
    given = dict(given)
    for key in DATA_FLAGS:
        if key in given:
            data[key] = given.pop(key)
    train.update(given)
    fields = {f.name for f in dataclasses.fields(TrainOptions)}
    unknown = set(train) - fields
    if unknown:
        raise ConfigError(f"unknown train options {sorted(unknown)}; valid: {sorted(fields)}")
    if "data" not in train:
        raise ConfigError("no training data: give --data or `train: {data: ...}` in the config")
    for key in ("data", "validation_data"):
        if isinstance(train.get(key), str):
            train[key] = [train[key]]
        if key in train:
            train[key] = tuple(train[key])
    return TrainOptions(**train), data
