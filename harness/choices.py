"""Every fixed list of names a flag, a YAML key or a library function accepts: each written here once.

`harness.cli` builds its `choices=` and help texts from these tuples, and the library modules that implement them
(`harness.train.model.losses`, `optim`, `precision`, `metrics`, `control`, `harness.data.input.pipeline`, ...) import
the same tuples to check a value and to name the valid ones in their errors. A module that maps a name to its
implementation keeps its table, keyed by these names; `tests/test_choices.py` checks that every table covers
exactly its list and that every flag offers exactly it. Adding a loss, optimizer or metric therefore means adding
its name here and its implementation where the table is.

This module imports nothing (no TensorFlow): `harness --help` and the argument parser load it.
"""
from __future__ import annotations

# --- data ---------------------------------------------------------------------------------------------------------
DATA_KINDS = ("image", "table")
"""What an export holds (`data.kind`, `harness synth --kind`).
  image: patches, every band a `[P + k, P + k]` float list (`ee.batch.Export.image.toCloudStorage`).
  table: points or rows, every band one value per record (`ee.batch.Export.table.toCloudStorage`)."""

TASKS = ("classification", "regression")
"""What the label is (`--task`, `data.task`, `harness predict --task`).
  classification: class ids (stored as float by Earth Engine: 3.0 is class 3); softmax logits, one per class.
  regression: a number per pixel or row; the model's raw outputs."""

DTYPES = ("float", "int64", "bytes")
"""How a band is stored in a record (`harness.data.export.records`; `data.dtype` / `data.dtypes`,
`harness synth --dtype`).
  float: a float_list, as Earth Engine writes every number.
  int64: an int64_list.
  bytes: one bytes_list of raw values (uint8 bands; `harness synth` writes them for image exports only)."""

CACHE_MODES = ("auto", "memory", "file", "none")
"""Where the parsed records are kept after the first epoch (`--cache`, `train.cache`;
`harness.data.input.stages.choose_cache`).
  auto: in memory when they take at most half the available memory, else in files under `--cache-dir` when it
    is given, else not cached.
  memory: `tf.data.Dataset.cache()` in memory.
  file: `tf.data.Dataset.cache(path)` in files under `--cache-dir` (required).
  none: read and parsed again every epoch."""

PARSE_PLACEMENTS = ("auto", "records", "batches")
"""Where records are parsed (`--parse`, `train.parse`; `harness.data.input.stages.decide`, `harness tune`).
  auto: by the mean record size: records above 64 kB one by one, smaller ones in read batches.
  records: one `parse_example` per record, in parallel, then batched.
  batches: read batches of ~256 kB of records, one vectorized `parse_example` each."""

# --- distribution -------------------------------------------------------------------------------------------------
BACKENDS = ("tf", "horovod")
"""Who keeps replicas in sync (`--backend`, `harness.distribute.backend`).
  tf: a tf.distribute strategy (`--strategy`), one process per worker.
  horovod: Horovod, one process per device under mpirun/horovodrun (`harness launch mpi|horovod`)."""

STRATEGIES = ("auto", "single", "mirrored", "multi_worker")
"""The tf.distribute strategy (`--strategy`, `harness.distribute.strategy.make_strategy`).
  auto: multi_worker when TF_CONFIG names several tasks, mirrored on several GPUs (or --cpu-replicas > 1),
    else single.
  single: TensorFlow's default strategy, one device.
  mirrored: `tf.distribute.MirroredStrategy` over this worker's GPUs (or logical CPUs).
  multi_worker: `tf.distribute.MultiWorkerMirroredStrategy` over the cluster in TF_CONFIG."""

COMMUNICATIONS = ("auto", "ring", "nccl")
"""All-reduce of `multi_worker` (`make_strategy(communication=...)`; tf.distribute.experimental.
CommunicationImplementation).
  auto: TensorFlow chooses. ring: gRPC ring all-reduce (CPUs). nccl: NVIDIA NCCL (GPUs)."""

ALLREDUCE_ALGORITHMS = ("ring", "hierarchical", "tree")
"""The all-reduce `harness bench scale --algorithm` models (`harness.bench.scale`).
  ring: one ring over every GPU (NCCL's ring; Patarasuk & Yuan 2009).
  hierarchical: reduce-scatter in the node, ring across nodes, all-gather in the node (HOROVOD_HIERARCHICAL_ALLREDUCE).
  tree: NCCL's double binary tree across nodes (NCCL >= 2.4): latency logarithmic in the nodes."""

# --- training -----------------------------------------------------------------------------------------------------
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
"""The Keras dtype policy (`--precision`, `harness.train.model.precision`).
  auto: mixed_float16 on GPUs of compute capability >= 7.0, mixed_bfloat16 on TPUs and bfloat16 CPUs, else float32.
  float32: everything in float32.
  mixed_float16: float16 compute, float32 variables, dynamic loss scaling.
  mixed_bfloat16: bfloat16 compute, float32 variables (no loss scaling needed)."""

OPTIMIZERS = ("adam", "adamw", "sgd")
"""The optimizer (`--optimizer`, `harness.train.model.optim.make_optimizer`).
  adam: tf_keras Adam (`--weight-decay` decoupled when given).
  adamw: tf_keras AdamW, decoupled weight decay (Loshchilov & Hutter 2019; default `optim.ADAMW_WEIGHT_DECAY`, Keras' own).
  sgd: tf_keras SGD with `--momentum` and `--nesterov`."""

SCHEDULES = ("constant", "cosine", "step", "exponential")
"""The learning rate after warm-up (`--schedule`, `harness.train.model.optim.ScheduleConfig.at`).
  constant: the peak. cosine: decays to 0 at the last step (Loshchilov & Hutter 2017, no restarts).
  step: × decay_rate every decay period. exponential: × decay_rate^(steps / decay period)."""

LR_SCALINGS = ("none", "linear", "sqrt")
"""How the peak learning rate follows the global batch (`--scale-lr`, `harness.train.model.optim.peak_learning_rate`).
  none: not scaled. linear: × global / base batch (Goyal et al. 2017, arXiv:1706.02677 §2.1).
  sqrt: × its square root (Krizhevsky 2014, arXiv:1404.5997)."""

CLASS_WEIGHTS = ("none", "balanced")
"""Named per-class loss weights (`--class-weights`; comma-separated numbers are accepted too).
  none: every class weighs 1. balanced: n / (classes × count of the class) in a sample (scikit-learn's)."""

CLASSIFICATION_LOSSES = ("crossentropy", "focal", "dice", "crossentropy+dice")
"""Built-in losses of task classification (`--loss`, `harness.train.model.losses.make_loss`); the first is the default.
  crossentropy: sparse softmax cross-entropy. focal: Lin et al. 2017 (gamma `--focal-gamma`).
  dice: soft Dice (Milletari et al. 2016). crossentropy+dice: their sum."""

REGRESSION_LOSSES = ("mse", "mae")
"""Built-in losses of task regression; the first is the default. mse: squared error. mae: absolute error."""

TASK_LOSSES = {"classification": CLASSIFICATION_LOSSES, "regression": REGRESSION_LOSSES}
"""The built-in losses of each of TASKS."""

LOSSES = CLASSIFICATION_LOSSES + REGRESSION_LOSSES
"""Every built-in loss; `--loss` also takes a user's MODULE:FUNCTION."""

# --- metrics ------------------------------------------------------------------------------------------------------
TASK_METRICS = {"classification": ("accuracy", "mean_iou"), "regression": ("rmse", "mae", "r2")}
"""The scalar validation metrics of each task (`harness.train.model.metrics`; logged as `val_<name>`).
  accuracy: correct / counted pixels. mean_iou: mean Jaccard index over the classes present.
  rmse, mae: root mean squared and mean absolute error. r2: coefficient of determination."""

PER_CLASS_METRICS = ("precision", "recall", "f1", "iou")
"""Classification metrics logged per class (`val_<name>` lists; `val_<name>/<class>` in TensorBoard)."""

MONITORS = {task: ("loss", "val_loss", *(f"val_{name}" for name in names)) for task, names in TASK_METRICS.items()}
"""What `--monitor` can name, per task: the training loss and, with validation data, the validation loss and
metrics (`harness.train.lifecycle.early_stopping`)."""

EPOCH_METRICS = tuple(dict.fromkeys(name for names in MONITORS.values() for name in names))
"""Every scalar loss or metric an epoch's logs can hold, in MONITORS order (TensorBoard scalars)."""

# --- prediction and export ----------------------------------------------------------------------------------------
PREDICTION_FORMATS = ("csv", "tfrecord")
"""What `harness predict` writes for a table export (`--format`; image exports are written as TFRecord).
  csv: one CSV part per input shard and, once every part is written, the whole table as `<prefix>.csv`.
  tfrecord: one TFRecord file per input shard."""

EXPORT_FORMATS = ("savedmodel",)
"""What `harness export` writes (`--format`). savedmodel: a TensorFlow SavedModel for ee.Model.fromVertexAi."""

# --- launching ----------------------------------------------------------------------------------------------------
K8S_KINDS = ("tfjob", "mpijob", "indexed-job")
"""The Kubernetes manifests `harness launch k8s --kind` writes (`harness.launch.k8s`).
  tfjob: a Kubeflow TFJob (TF_CONFIG per pod). mpijob: a Kubeflow MPIJob (mpirun from a launcher pod).
  indexed-job: a batch/v1 Indexed Job and a headless Service (no operator needed)."""

MPI_LAUNCHERS = ("mpirun", "horovodrun")
"""What the launcher pod of `--kind mpijob` runs (`--mpi-launcher`)."""

HOROVOD_CONTROLLERS = ("gloo", "mpi")
"""horovodrun's rendezvous (`harness launch horovod --controller`, `harness.launch.mpi`)."""

LOCAL_NETWORKS = ("private", "host")
"""Where `harness launch local --network` runs its workers (`harness.launch.local`): private, a network namespace
of their own with loopback only (`harness.launch.netns`); host, this host's network (their ports open to others)."""
