"""`harness train` and `harness demo`: their parsers and handlers."""
from __future__ import annotations

import argparse

from harness.choices import (BACKENDS, CACHE_MODES, CLASS_WEIGHTS, EPOCH_METRICS, LOSSES,
                             LR_SCALINGS, OPTIMIZERS, PARSE_PLACEMENTS, PRECISIONS, SCHEDULES, STRATEGIES, TASKS)
from harness.commands.args import NON_NEGATIVE, POSITIVE, auto_or_positive, command, defaults, json_object
from harness.train.model.optim import ADAMW_WEIGHT_DECAY
from harness.train.options import DEFAULT_PER_REPLICA_BATCH_SIZE, TrainOptions


_NOT_OPTIONS = ("command", "verbose", "config", "handler")


def options_from_args(args):
    """Merge the YAML config (`--config`: `data:` and `train:` sections) with the flags given (flags win).

    Returns:
      `(TrainOptions, data section)` (`harness.train.options.merge_options`).
    Raises:
      ConfigError: for broken YAML, unknown keys or bad values, naming them.
    """
    from harness.train.options import load_config, merge_options

    config = load_config(args.config) if getattr(args, "config", None) else {}
    given = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in _NOT_OPTIONS}
    return merge_options(config, given)


def train(args) -> int:
    """`harness train ...` (see `harness train --help`)."""
    from harness.train import job

    options, data = options_from_args(args)
    job.run(options, data_config=data)
    return 0


def demo(args) -> int:
    """`harness demo [--output DIR] [--data-dir DIR] [--epochs N]` (`make demo`)."""
    from harness.train import demo as demo_lib

    demo_lib.run(output=args.output, data_dir=args.data_dir, epochs=args.epochs)
    return 0


def add_parsers(sub) -> None:
    """`harness train` and `harness demo`."""
    p = command(sub, "train", train, "Train on GEE TFRecord shards (one worker or several)",
                usage="%(prog)s --data EXPORT [--label NAME] [--model FILE.py:FUNCTION] [--output RUN_DIR] [options]",
                example="harness train --data points/export-00000.tfrecord.gz points/export-00001.tfrecord.gz "
                        "--validation-data points/export-00002.tfrecord.gz --label class --epochs 3 --output runs/points")
    groups = train_args(p)
    groups["performance"].add_argument("--tune", action="store_true", default=argparse.SUPPRESS,
                   help="probe each input stage on this worker's files and the step before training, and train "
                        "with the levers harness tune would write (the chief's decision on every worker)")
    p = command(sub, "demo", demo,
                "Write a synthetic GEE image export (if absent) and train a U-Net on it with 2 CPU replicas")
    p.add_argument("--output", default="runs/demo", help="training output folder")
    p.add_argument("--data-dir", default="demo-data", help="folder of the synthetic export")
    p.add_argument("--epochs", type=POSITIVE, default=4, help="training epochs")


def train_args(p: argparse.ArgumentParser) -> dict:
    """Flags of `harness train`; every default is None so a YAML `--config` value applies unless a flag is given
    (defaults then come from `harness.train.options.TrainOptions`). Returns the argument groups by title."""
    S, D = argparse.SUPPRESS, defaults(TrainOptions)
    data = p.add_argument_group("data", "the export, its label and bands, and what is done to the examples")
    dist = p.add_argument_group("distribution", "workers, replicas and the batch (`harness plan` prints the steps)")
    run = p.add_argument_group("optimization", "epochs and precision (optimizer, loss and stopping below)")
    out = p.add_argument_group("output", "what the chief writes")
    perf = p.add_argument_group("performance", "the input pipeline and the step loop (`harness tune` decides these)")
    # listed in --help in this order: what to train on, how, with what model, then where and how fast
    later = [p._action_groups.pop(p._action_groups.index(g)) for g in (out, perf)]
    data.add_argument("--data", nargs="+", metavar="PATH", default=S, help="training shards: folder, glob or paths")
    data.add_argument("--validation-data", nargs="+", metavar="PATH", default=S,
                      help="validation shards: folder, glob or paths (default: none, no validation)")
    data.add_argument("--config", help="YAML run config with `data:` (feature spec) and `train:` sections")
    data.add_argument("--mixer", default=S, help="mixer.json when not beside the shards as <prefix>-mixer.json")
    data.add_argument("--label", default=S, help="label feature (class ids, stored as float by Earth Engine)")
    data.add_argument("--bands", nargs="+", default=S, help="input bands (default: every feature but the label)")
    data.add_argument("--task", choices=TASKS, default=S,
                      help="default classification (class ids); regression: the label is a number per pixel/row")
    data.add_argument("--ignore-label", type=float, default=S, metavar="VALUE",
                      help="the label's nodata value: those pixels are left out of the loss and every metric")
    data.add_argument("--input-nodata", type=float, default=S, metavar="VALUE",
                      help="an input value that is no measurement (Earth Engine's defaultValue: masked pixels, array "
                           "padding): left out of the band statistics, delivered as each channel's mean")
    data.add_argument("--class-names", nargs="+", default=S, metavar="NAME",
                      help="one name per class, in class-id order (names the per-class metrics)")
    run.add_argument("--epochs", type=int, default=S, help=f"default {D['epochs']:g}")
    g = dist.add_mutually_exclusive_group()
    g.add_argument("--global-batch-size", type=int, default=S, help="examples per step over all replicas")
    g.add_argument("--per-replica-batch-size", type=int, default=S,
                   help=f"default {DEFAULT_PER_REPLICA_BATCH_SIZE} when neither is given")
    run.add_argument("--precision", choices=PRECISIONS, default=S,
                     help=f"default {D['precision']}; auto: mixed_float16 on GPUs >= 7.0, mixed_bfloat16 on bf16 "
                          "CPUs/TPUs")
    dist.add_argument("--strategy", choices=STRATEGIES, default=S,
                      help=f"default {D['strategy']}: multi-worker when TF_CONFIG names several tasks, mirrored on "
                           "several GPUs")
    dist.add_argument("--cpu-replicas", type=POSITIVE, default=S,
                      help="logical CPU devices for MirroredStrategy on a machine without GPUs (default "
                           f"{D['cpu_replicas']:g})")
    out.add_argument("--output", default=S,
                     help=f"output folder (chief only): backup, model, summary; default {D['output']}")
    data.add_argument("--num-classes", type=int, default=S, help="default: the spec's, else max label + 1 in a sample")
    data.add_argument("--class-weights", default=S,
                      help=" | ".join((*CLASS_WEIGHTS, f"w0,w1,... (default {D['class_weights']})")))
    perf.add_argument("--cache", choices=CACHE_MODES, default=S,
                      help=f"parsed records kept after the first epoch; default {D['cache']}: in memory when they fit, "
                           "else in files under --cache-dir when given, else none")
    perf.add_argument("--cache-dir", default=S, help="folder of the file cache (--cache file)")
    perf.add_argument("--shuffle-buffer", type=POSITIVE, default=S,
                      help="records; default: about 256 MB of serialized records, at most 16384 and at most the "
                           "worker's records")
    perf.add_argument("--parse", choices=PARSE_PLACEMENTS, default=S,
                      help=f"records one by one, or read batches (vectorized); default {D['parse']}: by the record size")
    perf.add_argument("--parallel-reads", type=POSITIVE, default=S, help="files read at once (default: one per CPU)")
    perf.add_argument("--map-parallelism", type=POSITIVE, default=S,
                      help="calls in flight of each parallel map (parse, augment); default AUTOTUNE")
    perf.add_argument("--prefetch", type=POSITIVE, default=S, help="batches prefetched (default AUTOTUNE)")
    data.add_argument("--augment", action="store_true", default=S, help="random flips and 90-degree rotations")
    data.add_argument("--brightness", type=float, default=S, metavar="B",
                      help=f"training inputs only: every band x U(1-B, 1+B) per example (default {D['brightness']:g})")
    data.add_argument("--contrast", type=float, default=S, metavar="C",
                      help="training image bands only: around their mean x U(1-C, 1+C) per example (default "
                           f"{D['contrast']:g})")
    data.add_argument("--seed", type=int, default=S,
                      help=f"the model's initial weights, file order, shuffle and augmentation (default {D['seed']:g})")
    out.add_argument("--progress-every", type=float, default=S, metavar="SECONDS",
                     help="where the output is not a terminal (a pod's log, nohup, a pipe), the chief prints the "
                          "epoch's progress (steps, examples/s, input stall, ETA) every SECONDS; 0: none "
                          f"(default {D['progress_every']:g}; a terminal gets a bar)")
    out.add_argument("--mlflow", default=S, metavar="URI",
                     help="send the run's parameters and per-epoch metrics to this MLflow tracking server (the "
                          "chief; default: MLFLOW_TRACKING_URI where set, else none)")
    out.add_argument("--mlflow-experiment", default=S, metavar="NAME",
                     help=f"the MLflow experiment of the run (default {D['mlflow_experiment']})")
    out.add_argument("--profile", action="store_true", default=S,
                     help="write report.json, timeline.png and the input-bound table (every worker's steps, GPU/CPU "
                          "utilization, a tf.profiler trace window)")
    out.add_argument("--profile-steps", default=S, metavar="START:STOP",
                     help="global steps to trace with tf.profiler, both included (implies --profile); default: 10 "
                          "steps from the 3rd after warm-up")
    out.add_argument("--profile-dir", default=S, help="TensorBoard log dir of the traces (one worker-<rank> folder "
                                                      "each; shared storage on several hosts); default "
                                                      "OUTPUT/tensorboard")
    dist.add_argument("--data-service", default=S, metavar="grpc://HOST:PORT",
                      help="run the input pipeline on a tf.data service (see `harness data-service`)")
    dist.add_argument("--backend", choices=BACKENDS, default=S,
                      help=f"default {D['backend']} (tf.distribute); horovod: one process per device under "
                           "mpirun/horovodrun")
    perf.add_argument("--steps-per-loop", type=auto_or_positive, default=S, metavar="K|auto",
                      help="training steps per tf.function call (the host waits for the device once per call); "
                           "default auto: about 0.25 s per call, chosen after a few one-step calls")
    dist.add_argument("--check-sharding", action="store_true", default=S,
                      help="gather every rank's files and check they are disjoint and cover the data (Horovod/MPI)")
    o = p.add_argument_group("optimizer and schedule", "built by the harness inside the strategy's scope; the "
                             "learning rate is a function of the restored step (a resume continues the schedule)")
    o.add_argument("--optimizer", choices=OPTIMIZERS, default=S, help=f"default {D['optimizer']}")
    o.add_argument("--learning-rate", type=float, default=S, help=f"base learning rate, default {D['learning_rate']:g}")
    o.add_argument("--momentum", type=float, default=S, help="sgd momentum (default 0)")
    o.add_argument("--nesterov", action="store_true", default=S, help="sgd: Nesterov momentum")
    o.add_argument("--weight-decay", type=float, default=S,
                   help=f"decoupled weight decay (adamw default {ADAMW_WEIGHT_DECAY})")
    o.add_argument("--schedule", choices=SCHEDULES, default=S,
                   help=f"after warm-up, default {D['schedule']}; cosine decays to 0 at the last step")
    w = o.add_mutually_exclusive_group()
    w.add_argument("--warmup-steps", type=NON_NEGATIVE, default=S, help="linear warm-up to the peak (default 0)")
    w.add_argument("--warmup-epochs", type=float, default=S, help="warm-up in epochs (rounded to steps)")
    o.add_argument("--decay-epochs", type=float, default=S,
                   help="step/exponential: epochs per decay period (default 1)")
    o.add_argument("--decay-rate", type=float, default=S,
                   help="step/exponential: factor per period (default 0.1 for step, 0.5 for exponential)")
    o.add_argument("--scale-lr", choices=LR_SCALINGS, default=S,
                   help="peak = learning rate x (global batch / --base-batch-size), or its square root (Goyal et "
                        "al. 2017); default none: nothing is scaled")
    o.add_argument("--base-batch-size", type=POSITIVE, default=S, help="the batch the learning rate was tuned for")
    o.add_argument("--clip-norm", type=float, default=S,
                   help="clip gradients by global norm after the cross-replica reduction (default: none)")
    lo = p.add_argument_group("loss", "per example, reduced by the global batch (the same on any number of replicas)")
    lo.add_argument("--loss", default=S, metavar="|".join((*LOSSES, "MODULE:FUNCTION")),
                    help="default crossentropy (regression: mse); a function(labels, logits) returns [batch] or "
                         "[batch, H, W]")
    lo.add_argument("--focal-gamma", type=float, default=S, help=f"focal loss gamma (default {D['focal_gamma']:g})")
    c = p.add_argument_group("training control", "decided on metrics reduced over every worker: all stop together")
    c.add_argument("--monitor", default=S, metavar="METRIC",
                   help=f"keep the best epoch's model in OUTPUT/best/model.keras: {', '.join(EPOCH_METRICS)} "
                        "(default with --early-stopping: val_loss, or loss without validation)")
    c.add_argument("--early-stopping", type=POSITIVE, default=S, metavar="PATIENCE",
                   help="stop after PATIENCE epochs without improvement of --monitor")
    c.add_argument("--min-delta", type=float, default=S,
                   help=f"the least change that counts as improvement (default {D['min_delta']:g})")
    m = p.add_argument_group("model", "your own model (default: the built-in U-Net for patches, an MLP for tables)")
    m.add_argument("--model", default=S, metavar="MODULE:FUNCTION",
                   help="function(ModelInputs, **model_args) -> Keras model of logits (Keras 3 or tf-keras); also "
                        "path/to/file.py:FUNCTION")
    m.add_argument("--model-args", type=json_object, default=S, metavar="JSON",
                   help="keyword arguments for the model function, e.g. '{\"depth\": 4}'")
    m.add_argument("--init-from", default=S, metavar="MODEL.keras|RUN_DIR",
                   help="start from trained weights: layers matched by name, mismatches named")
    p._action_groups += later
    return {"data": data, "distribution": dist, "optimization": run, "output": out, "performance": perf}
