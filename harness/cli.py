"""The `harness` command line: one parser per subcommand, each calling its handler in `harness.commands`.

Handlers import the library inside the function, so `harness --help` does not import TensorFlow.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable

from harness.choices import (ALLREDUCE_ALGORITHMS, BACKENDS, CACHE_MODES, CLASS_WEIGHTS, DATA_KINDS, DTYPES,
                             EPOCH_METRICS, EXPORT_FORMATS, HOROVOD_CONTROLLERS, K8S_KINDS, LOCAL_NETWORKS, LOSSES,
                             LR_SCALINGS, MPI_LAUNCHERS, OPTIMIZERS, PARSE_PLACEMENTS, PRECISIONS,
                             PREDICTION_FORMATS, SCHEDULES, STRATEGIES, TASKS)
from harness.commands import bench as bench_cmd, data as data_cmd, launch as launch_cmd, plan as plan_cmd
from harness.commands import predict as predict_cmd, train as train_cmd, tune as tune_cmd
from harness import exit_codes
from harness.errors import ClusterFault, HarnessError


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where it informs: not for None (a value derived or absent, which the help text
    describes instead), not for required options, not where the help already names its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.required or "default" in text:
            return text
        return super()._get_help_string(action)


def _command(sub, name: str, handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help, formatter_class=_HelpFormatter)
    p.set_defaults(handler=handler)
    return p


def _at_least(minimum: int):
    """An argparse `type` for an integer count >= minimum: a bad value is a one-line usage error (exit 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


POSITIVE, NON_NEGATIVE = _at_least(1), _at_least(0)


def _auto_or_positive(text: str):
    """An argparse `type`: `auto` or an integer >= 1."""
    return "auto" if text == "auto" else POSITIVE(text)


_auto_or_positive.__name__ = "auto or integer >= 1"


_BYTE_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def _byte_sizes(text: str) -> list[int]:
    """An argparse `type`: comma-separated byte counts with an optional K/M/G suffix (powers of 1024), e.g.
    `4096,1M,16M`; a bad one is a usage error (exit 2)."""
    sizes = []
    for part in text.split(","):
        part = part.strip().upper().removesuffix("B").removesuffix("I")
        unit = part[-1:] if part[-1:] in "KMG" else ""
        try:
            value = int(float(part[:len(part) - len(unit)]) * _BYTE_UNITS[unit])
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected byte counts such as 4096,1M,16M, got {text!r}") from None
        if value < 4:
            raise argparse.ArgumentTypeError(f"a size must be >= 4 bytes (one float32), got {part!r}")
        sizes.append(value)
    return sizes


def _json_object(text: str) -> dict:
    """An argparse `type` for a JSON object (`--model-args '{"depth": 4}'`): anything else is a usage error."""
    import json
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"depth\": 4}}', got {text!r}")
    return value


_json_object.__name__ = "JSON object"


def _data_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--data", nargs="+", required=required, metavar="PATH",
                   help="shards: a folder, a glob, or paths (local or gs://)")
    p.add_argument("--mixer", help="mixer.json when not beside the shards as <prefix>-mixer.json")
    p.add_argument("--config", help="YAML run config (feature spec and options); flags override it")


def _train_args(p: argparse.ArgumentParser) -> None:
    """Flags of `harness train`; every default is None so a YAML `--config` value applies unless a flag is given
    (defaults then come from `harness.train.options.TrainOptions`)."""
    S = argparse.SUPPRESS
    p.add_argument("--data", nargs="+", metavar="PATH", default=S, help="training shards: folder, glob or paths")
    p.add_argument("--validation-data", nargs="+", metavar="PATH", default=S,
                   help="validation shards: folder, glob or paths (default: none, no validation)")
    p.add_argument("--config", help="YAML run config with `data:` (feature spec) and `train:` sections")
    p.add_argument("--mixer", default=S, help="mixer.json when not beside the shards as <prefix>-mixer.json")
    p.add_argument("--label", default=S, help="label feature (class ids, stored as float by Earth Engine)")
    p.add_argument("--bands", nargs="+", default=S, help="input bands (default: every feature but the label)")
    p.add_argument("--task", choices=TASKS, default=S,
                   help="default classification (class ids); regression: the label is a number per pixel/row")
    p.add_argument("--ignore-label", type=float, default=S, metavar="VALUE",
                   help="the label's nodata value: those pixels are left out of the loss and every metric")
    p.add_argument("--class-names", nargs="+", default=S, metavar="NAME",
                   help="one name per class, in class-id order (names the per-class metrics)")
    p.add_argument("--epochs", type=int, default=S, help="default 5")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--global-batch-size", type=int, default=S, help="examples per step over all replicas")
    g.add_argument("--per-replica-batch-size", type=int, default=S, help="default 32 when neither is given")
    p.add_argument("--precision", choices=PRECISIONS, default=S,
                   help="default float32; auto: mixed_float16 on GPUs >= 7.0, mixed_bfloat16 on bf16 CPUs/TPUs")
    p.add_argument("--strategy", choices=STRATEGIES, default=S,
                   help="default auto: multi-worker when TF_CONFIG names several tasks, mirrored on several GPUs")
    p.add_argument("--cpu-replicas", type=POSITIVE, default=S,
                   help="logical CPU devices for MirroredStrategy on a machine without GPUs (default 1)")
    p.add_argument("--output", default=S, help="output folder (chief only): backup, model, summary; default runs/train")
    p.add_argument("--num-classes", type=int, default=S, help="default: the spec's, else max label + 1 in a sample")
    p.add_argument("--class-weights", default=S, help=" | ".join((*CLASS_WEIGHTS, "w0,w1,... (default none)")))
    p.add_argument("--cache", choices=CACHE_MODES, default=S,
                   help="parsed records kept after the first epoch; default auto: in memory when they fit, else in "
                        "files under --cache-dir when given, else none")
    p.add_argument("--cache-dir", default=S, help="folder of the file cache (--cache file)")
    p.add_argument("--shuffle-buffer", type=POSITIVE, default=S,
                   help="records; default: about 256 MB of serialized records, at most 16384 and at most the "
                        "worker's records")
    p.add_argument("--parse", choices=PARSE_PLACEMENTS, default=S,
                   help="records one by one, or read batches (vectorized); default auto: by the record size")
    p.add_argument("--parallel-reads", type=POSITIVE, default=S, help="files read at once (default: one per CPU)")
    p.add_argument("--map-parallelism", type=POSITIVE, default=S,
                   help="calls in flight of each parallel map (parse, augment); default AUTOTUNE")
    p.add_argument("--prefetch", type=POSITIVE, default=S, help="batches prefetched (default AUTOTUNE)")
    p.add_argument("--augment", action="store_true", default=S, help="random flips and 90-degree rotations")
    p.add_argument("--brightness", type=float, default=S, metavar="B",
                   help="training inputs only: every band x U(1-B, 1+B) per example (default 0)")
    p.add_argument("--contrast", type=float, default=S, metavar="C",
                   help="training image bands only: around their mean x U(1-C, 1+C) per example (default 0)")
    p.add_argument("--seed", type=int, default=S, help="file order, shuffle and augmentation (default 0)")
    p.add_argument("--profile", action="store_true", default=S,
                   help="write report.json, timeline.png and the input-bound table (every worker's steps, GPU/CPU "
                        "utilization, a tf.profiler trace window)")
    p.add_argument("--profile-steps", default=S, metavar="START:STOP",
                   help="global steps to trace with tf.profiler, both included (implies --profile); default: 10 "
                        "steps from the 3rd after warm-up")
    p.add_argument("--profile-dir", default=S, help="TensorBoard log dir of the traces (one worker-<rank> folder "
                                                    "each; shared storage on several hosts); default OUTPUT/tensorboard")
    p.add_argument("--data-service", default=S, metavar="grpc://HOST:PORT",
                   help="run the input pipeline on a tf.data service (see `harness data-service`)")
    p.add_argument("--backend", choices=BACKENDS, default=S,
                   help="default tf (tf.distribute); horovod: one process per device under mpirun/horovodrun")
    p.add_argument("--steps-per-loop", type=_auto_or_positive, default=S, metavar="K|auto",
                   help="training steps per tf.function call (the host waits for the device once per call); "
                        "default auto: about 0.25 s per call, chosen after a few one-step calls")
    p.add_argument("--check-sharding", action="store_true", default=S,
                   help="gather every rank's files and check they are disjoint and cover the data (Horovod/MPI)")
    o = p.add_argument_group("optimizer and schedule", "built by the harness inside the strategy's scope; the "
                             "learning rate is a function of the restored step (a resume continues the schedule)")
    o.add_argument("--optimizer", choices=OPTIMIZERS, default=S, help="default adam")
    o.add_argument("--learning-rate", type=float, default=S, help="base learning rate, default 1e-3")
    o.add_argument("--momentum", type=float, default=S, help="sgd momentum (default 0)")
    o.add_argument("--nesterov", action="store_true", default=S, help="sgd: Nesterov momentum")
    o.add_argument("--weight-decay", type=float, default=S, help="decoupled weight decay (adamw default 0.004)")
    o.add_argument("--schedule", choices=SCHEDULES, default=S,
                   help="after warm-up, default constant; cosine decays to 0 at the last step")
    w = o.add_mutually_exclusive_group()
    w.add_argument("--warmup-steps", type=NON_NEGATIVE, default=S, help="linear warm-up to the peak (default 0)")
    w.add_argument("--warmup-epochs", type=float, default=S, help="warm-up in epochs (rounded to steps)")
    o.add_argument("--decay-epochs", type=float, default=S, help="step/exponential: epochs per decay period (default 1)")
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
    lo.add_argument("--focal-gamma", type=float, default=S, help="focal loss gamma (default 2)")
    c = p.add_argument_group("training control", "decided on metrics reduced over every worker: all stop together")
    c.add_argument("--monitor", default=S, metavar="METRIC",
                   help=f"keep the best epoch's model in OUTPUT/best/model.keras: {', '.join(EPOCH_METRICS)} "
                        "(default with --early-stopping: val_loss, or loss without validation)")
    c.add_argument("--early-stopping", type=POSITIVE, default=S, metavar="PATIENCE",
                   help="stop after PATIENCE epochs without improvement of --monitor")
    c.add_argument("--min-delta", type=float, default=S, help="the least change that counts as improvement (default 0)")
    m = p.add_argument_group("model", "your own model (default: the built-in U-Net for patches, an MLP for tables)")
    m.add_argument("--model", default=S, metavar="MODULE:FUNCTION",
                   help="function(ModelInputs, **model_args) -> tf_keras model of logits; also path/to/file.py:FUNCTION")
    m.add_argument("--model-args", type=_json_object, default=S, metavar="JSON",
                   help="keyword arguments for the model function, e.g. '{\"depth\": 4}'")
    m.add_argument("--init-from", default=S, metavar="MODEL.keras|RUN_DIR",
                   help="start from trained weights: layers matched by name, mismatches named")


def _bench_commands(sub) -> None:
    """`harness bench input|train|allreduce|scale`, `harness reshard`, `harness data-service dispatcher|worker`."""
    bench = sub.add_parser("bench", help="Benchmarks: the input pipeline alone, or training (synthetic or real data)")
    bsub = bench.add_subparsers(dest="bench", required=True)
    p = _command(bsub, "input", bench_cmd.bench_input,
                 "Input pipeline examples/s on your shards: read limit, harness pipeline, per-record pipeline")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH", help="shards: a folder, a glob, or paths")
    p.add_argument("--label", help="label feature (default: inferred)")
    p.add_argument("--batch", type=POSITIVE, default=64, help="examples per batch")
    p.add_argument("--passes", type=POSITIVE, default=1, help="times the files are read per timed run")
    p.add_argument("--repeats", type=POSITIVE, default=3, help="timed runs (after one warm-up run)")

    p = _command(bsub, "train", bench_cmd.bench_train,
                 "Training examples/s and input stall, on synthetic batches on the device or on real shards")
    p.add_argument("--data", nargs="+", default=["synthetic"], metavar="synthetic|PATH",
                   help="`synthetic` (the compute ceiling) or shards")
    p.add_argument("--like", nargs="+", metavar="PATH",
                   help="synthetic batches shaped like these shards (default: --patch-size, --bands, --classes)")
    p.add_argument("--label", help="label feature (default: inferred)")
    p.add_argument("--steps", type=POSITIVE, default=50, help="timed steps")
    p.add_argument("--warmup", type=NON_NEGATIVE, default=5, help="untimed first steps (tracing, autotuning, cache fill)")
    p.add_argument("--output", default="runs/bench", help="report folder (chief only)")
    p.add_argument("--per-replica-batch-size", type=POSITIVE, default=16, help="examples per replica per step")
    p.add_argument("--precision", choices=PRECISIONS, default="float32",
                   help="auto: mixed_float16 on GPUs >= 7.0, mixed_bfloat16 on bf16 CPUs/TPUs")
    p.add_argument("--strategy", choices=STRATEGIES, default="auto",
                   help="auto: multi-worker when TF_CONFIG names several tasks, mirrored on several GPUs")
    p.add_argument("--cpu-replicas", type=POSITIVE, default=None,
                   help="logical CPU replicas (mirrored, no GPU); default 1")
    p.add_argument("--patch-size", type=POSITIVE, default=64, help="synthetic: patch side, pixels")
    p.add_argument("--bands", type=POSITIVE, default=4, help="synthetic: bands")
    p.add_argument("--classes", type=POSITIVE, default=4, help="synthetic: classes")
    p.add_argument("--cache", choices=CACHE_MODES, default="auto",
                   help="real shards: parsed records kept after the first pass (auto: in memory when they fit, else in "
                        "files under --cache-dir when given, else none)")
    p.add_argument("--cache-dir", help="folder of the file cache (--cache file); default: none")
    p.add_argument("--data-service", metavar="grpc://HOST:PORT",
                   help="input pipeline on a tf.data service (default: in this process)")
    p.add_argument("--profile-steps", metavar="START:STOP", help="steps to trace (default: 10 after warm-up)")
    p.add_argument("--profile-dir", help="TensorBoard log dir of the traces (default OUTPUT/tensorboard)")
    p.add_argument("--no-trace", action="store_true", help="no tf.profiler trace")
    p.add_argument("--no-sampling", action="store_true", help="no GPU/CPU utilization sampling")
    p.add_argument("--sample-interval", type=float, default=0.05, help="seconds between utilization samples")
    p.add_argument("--no-plot", action="store_true", help="no timeline.png")
    p.add_argument("--baseline", metavar="REPORT",
                   help="a one-replica run's report.json: adds scaling efficiency (default: none)")
    p.add_argument("--seed", type=int, default=0, help="synthetic data and model initialization")
    p.add_argument("--backend", choices=BACKENDS, default="tf",
                   help="tf: tf.distribute (TF_CONFIG for several workers); horovod: one process per replica under "
                        "horovodrun/mpirun, as `harness train --backend horovod`")

    p = _command(bsub, "allreduce", bench_cmd.bench_allreduce,
                 "The gradient all-reduce training runs, timed over sizes on the workers it is launched on; fits the "
                 "link's latency (alpha) and bandwidth (beta)")
    p.add_argument("--backend", choices=BACKENDS, default="tf",
                   help="tf: tf.distribute (TF_CONFIG for several workers); horovod: under horovodrun/mpirun")
    p.add_argument("--sizes", type=_byte_sizes, default=None, metavar="BYTES,...",
                   help="bytes per all-reduce, e.g. 4096,1M,16M (default 1 KiB to 16 MiB, x4 steps)")
    p.add_argument("--tensors", type=POSITIVE, default=1, help="gradient tensors each size is split into")
    p.add_argument("--rounds", type=POSITIVE, default=20, help="chained all-reduces per timed call")
    p.add_argument("--repeats", type=POSITIVE, default=5, help="timed calls per size (the median is kept)")
    p.add_argument("--output", default=None, help="folder for allreduce.json (chief only; default: none)")

    p = _command(bsub, "scale", bench_cmd.bench_scale,
                 "Predict examples/s and scaling efficiency at N = 1 ... 512 GPUs from one bench train report, the "
                 "model's gradients, the backend's schedule and the links; names the bottleneck and the levers")
    p.add_argument("--report", required=True, metavar="REPORT.json", help="a one-replica `bench train` report.json")
    p.add_argument("--allreduce", metavar="ALLREDUCE.json",
                   help="network alpha/beta from `bench allreduce` across nodes (instead of --link)")
    p.add_argument("--link", default=None, metavar="BW[,LAT]",
                   help="network between nodes, e.g. 25Gbit/s,5us or 12.5GB/s,2us (default 25Gbit/s, NCCL's 9.6 µs)")
    p.add_argument("--node", default="1xNVLink", metavar="GxLINK",
                   help="GPUs per node and their link: 4xNVLink, 8xPCIe or 4x100GB/s,2us (default 1xNVLink)")
    p.add_argument("--gpus-per-node", type=POSITIVE, default=None, help="overrides the G of --node")
    p.add_argument("--backend", choices=BACKENDS, default="tf",
                   help="tf: MWMS packs (bytes_per_pack); horovod: Tensor Fusion during backward")
    p.add_argument("--max-gpus", type=POSITIVE, default=512, help="largest N of the sweep (powers of two up to it)")
    p.add_argument("--gradient-bytes", type=POSITIVE, default=None,
                   help="bytes all-reduced per step (default: the report's built-in model, float32)")
    p.add_argument("--tensors", type=POSITIVE, default=None, help="gradient tensors per step (with --gradient-bytes)")
    p.add_argument("--fusion-threshold", type=NON_NEGATIVE, default=128 * 1024 * 1024,
                   help="horovod: HOROVOD_FUSION_THRESHOLD bytes (default 128 MiB)")
    p.add_argument("--cycle-time-ms", type=float, default=1.0, help="horovod: HOROVOD_CYCLE_TIME (default 1 ms)")
    p.add_argument("--bytes-per-pack", type=NON_NEGATIVE, default=0,
                   help="tf: CommunicationOptions(bytes_per_pack) (default 0: one pack after backward)")
    p.add_argument("--algorithm", choices=ALLREDUCE_ALGORITHMS, default="ring",
                   help="ring (NCCL's), hierarchical (in node, across nodes, in node) or tree (NCCL >= 2.4)")
    p.add_argument("--fixed-ms", type=float, default=0.0, help="measured per-step cost besides compute and link")
    p.add_argument("--timeline", metavar="TIMELINE.json",
                   help="a Horovod timeline (HOROVOD_TIMELINE) of the same step on >= 2 ranks on one node: when each "
                        "gradient is ready, instead of an even spread over the backward pass, and the gradient "
                        "tensors and bytes (--gradient-bytes rescales them)")
    p.add_argument("--plot", metavar="OUT.png", help="efficiency vs N and the step breakdown")

    p = _command(sub, "reshard", data_cmd.reshard,
                 "Rewrite (GZIP) shards into uncompressed shards balanced over a multiple of the workers, in order")
    p.add_argument("sources", nargs="+", metavar="SRC", help="shards: a folder, a glob, or paths")
    p.add_argument("--output", required=True, help="folder for the new shards")
    p.add_argument("--workers", type=int, required=True, help="training workers the output is balanced over")
    p.add_argument("--shards-per-worker", type=int, default=1, help="more files per worker: more parallel reads")
    p.add_argument("--prefix", help="output name prefix (default: the source's)")
    p.add_argument("--mixer", help="mixer.json when not beside the shards (default: <prefix>-mixer.json there)")

    ds = sub.add_parser("data-service", help="tf.data service servers for --data-service")
    dsub = ds.add_subparsers(dest="role", required=True)
    p = _command(dsub, "dispatcher", data_cmd.data_service, "Start a tf.data service dispatcher")
    p.add_argument("--port", type=NON_NEGATIVE, default=5050, help="port to listen on")
    p.add_argument("--work-dir", help="journal folder (fault-tolerant dispatcher); default: none, not fault-tolerant")
    p = _command(dsub, "worker", data_cmd.data_service, "Start a tf.data service worker")
    p.add_argument("--dispatcher", required=True, help="HOST:PORT of the dispatcher")
    p.add_argument("--port", type=NON_NEGATIVE, default=0, help="0: any free port")
    p.add_argument("--worker-address", help="HOST:PORT the dispatcher gives consumers (default localhost:PORT)")


def _predict_command(sub) -> None:
    """`harness predict`: predictions in the export's order, ready for `earthengine upload`."""
    p = _command(sub, "predict", predict_cmd.predict,
                 "Predict every record of an export in order and write it back as Earth Engine uploads it")
    p.add_argument("--model", required=True, help="a run folder (model.keras + summary.json) or a .keras file")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH",
                   help="the export: a folder, a glob, or paths (local or gs://)")
    p.add_argument("--mixer", help="mixer.json when not beside the shards as <prefix>-mixer.json")
    p.add_argument("--output", required=True, help="folder of the predictions (one file per input shard)")
    p.add_argument("--batch-size", type=POSITIVE, default=16, help="patches or rows per model call")
    p.add_argument("--bands", nargs="+", help="the model's input bands in order (default: the run's spec, else "
                                              "every band of the export)")
    p.add_argument("--task", choices=TASKS,
                   help="default: the run's; classification: class ids (argmax); regression: the raw outputs")
    p.add_argument("--probabilities", action="store_true", help="also one float band per class (softmax)")
    p.add_argument("--output-bands", nargs="+", metavar="NAME",
                   help="names of the written bands: class band, then one per class (default class, "
                        "probability_<i>; regression: prediction or prediction_<i>)")
    p.add_argument("--format", choices=PREDICTION_FORMATS, default="csv", help="table exports' output")
    p.add_argument("--keep", nargs="+", metavar="PROPERTY", help="table exports: input properties copied to each row")
    p.add_argument("--prefix", help="output file prefix (default: the input shards')")
    p.add_argument("--overwrite", action="store_true", help="replace another run's files in --output")

    p = _command(sub, "export", predict_cmd.export,
                 "Write a SavedModel for Earth Engine's hosted models (ee.Model.fromVertexAi) and print its arguments")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="savedmodel", help="what to write")
    p.add_argument("--model", required=True, help="a run folder (model.keras + summary.json) or a .keras file")
    p.add_argument("--output", required=True, help="SavedModel folder")
    p.add_argument("--probabilities", action="store_true", help="also return per-class probabilities")
    p.add_argument("--bands", nargs="+", help="input bands in channel order (default: the run's spec)")
    p.add_argument("--patch-size", type=POSITIVE, help="a bare image model: P (without margin)")
    p.add_argument("--kernel-margin", type=NON_NEGATIVE, help="a bare image model: k (default 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = _command(sub, "inspect", data_cmd.inspect,
                 "Print the schema, patch shape, per-shard record counts and a ready-to-use config")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--mixer", help="mixer.json when not beside the shards as <prefix>-mixer.json")
    p.add_argument("--kernel-margin", type=NON_NEGATIVE, default=None,
                   help="kernel size k of the export (stored patch = patchDimensions + k); default: from mixer.json, "
                        "else 0")
    p.add_argument("--records", type=POSITIVE, default=8, help="records read per shard to infer the schema")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = _command(sub, "synth", data_cmd.synth,
                 "Write a synthetic export laid out exactly as Earth Engine writes it")
    p.add_argument("output", help="folder to write into")
    p.add_argument("--kind", choices=DATA_KINDS, default="image", help="patches (image) or points (table)")
    p.add_argument("--prefix", default="export", help="file name prefix")
    p.add_argument("--shards", type=POSITIVE, default=4, help="files (at most --records)")
    p.add_argument("--records", type=POSITIVE, default=16, help="records (patches or rows) in all")
    p.add_argument("--bands", nargs="+", default=["B2", "B3", "B4", "B8"], help="band names")
    p.add_argument("--label", default="landcover", help="label feature name ('' for none)")
    p.add_argument("--classes", type=POSITIVE, default=4, help="label classes")
    p.add_argument("--patch-size", type=POSITIVE, default=64, help="patchDimensions P (without margin), pixels")
    p.add_argument("--kernel-size", type=NON_NEGATIVE, default=0,
                   help="kernelSize k: 0 or 1 store no margin, an even k a stored patch of P + k (k/2 per side)")
    p.add_argument("--dtype", choices=DTYPES, default="float", help="band storage")
    p.add_argument("--uncompressed", action="store_true", help="write .tfrecord without GZIP")
    p.add_argument("--seed", type=int, default=0, help="random fields and classes")

    p = _command(sub, "plan", plan_cmd.plan,
                 "Print files and records per worker, batch sizes, steps per epoch and dropped records")
    p.add_argument("data", nargs="+", metavar="DATA")
    p.add_argument("--workers", type=int, default=1, help="training workers (hosts or processes)")
    p.add_argument("--replicas-per-worker", type=int, default=1, help="devices per worker")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--global-batch-size", type=int, help="examples per step over all replicas")
    g.add_argument("--per-replica-batch-size", type=int, help="examples per step per replica")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--learning-rate", type=float, help="with it, the effective peak learning rate is printed")
    p.add_argument("--scale-lr", choices=LR_SCALINGS, default="none",
                   help="as harness train: scale the learning rate with global / --base-batch-size")
    p.add_argument("--base-batch-size", type=POSITIVE, help="the batch the learning rate was tuned for")

    p = _command(sub, "train", train_cmd.train, "Train on GEE TFRecord shards (one worker or several)")
    _train_args(p)
    p.add_argument("--tune", action="store_true", default=argparse.SUPPRESS,
                   help="probe each input stage on this worker's files and the step before training, and train "
                        "with the levers harness tune would write (the chief's decision on every worker)")
    p = _command(sub, "tune", tune_cmd.tune,
                 "Probe each input stage on your data, decide the pipeline's levers and write a config for train")
    _train_args(p)
    p.add_argument("--write", default="tune.yaml", metavar="FILE", help="the run config written")
    p.add_argument("--workers", type=POSITIVE, default=1, help="training workers, one per host (each reads its share)")
    p.add_argument("--probe-records", type=POSITIVE, default=256, help="records each stage's probe reads")
    p.add_argument("--compute-steps", type=POSITIVE, default=20, help="timed steps on synthetic batches, at least (more where they last under 2 s)")
    p = _command(sub, "demo", train_cmd.demo,
                 "Write a synthetic GEE image export (if absent) and train a U-Net on it with 2 CPU replicas")
    p.add_argument("--output", default="runs/demo", help="training output folder")
    p.add_argument("--data-dir", default="demo-data", help="folder of the synthetic export")
    p.add_argument("--epochs", type=POSITIVE, default=4, help="training epochs")

    _predict_command(sub)
    _bench_commands(sub)

    launch = sub.add_parser("launch", help="Start a command as several workers")
    lsub = launch.add_subparsers(dest="launcher", required=True)
    p = _command(lsub, "local", launch_cmd.local,
                 "N workers on this machine, each with its TF_CONFIG; output prefixed by worker")
    p.add_argument("--workers", type=int, required=True, help="worker processes to start")
    p.add_argument("--gpus-per-worker", type=int, default=0, help="GPUs per worker (CUDA_VISIBLE_DEVICES slices)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before all workers are stopped (default: none, wait)")
    p.add_argument("--network", choices=LOCAL_NETWORKS, default="private",
                   help="private (default): the workers in a network namespace with loopback only, open to no other "
                        "host and reaching none; host: this host's network (their ports open to other hosts)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="command", help="-- harness train ...")
    p = _command(lsub, "k8s", launch_cmd.k8s,
                 "Write Kubernetes manifests (TFJob, MPIJob, or Indexed Job + headless Service) for a command")
    p.add_argument("--kind", choices=K8S_KINDS, required=True,
                   help="Kubeflow TFJob or MPIJob, or a plain Indexed Job with a headless Service")
    p.add_argument("--workers", type=int, required=True, help="training pods")
    p.add_argument("--gpus-per-worker", type=int, default=0, help="nvidia.com/gpu per pod (mpijob: MPI slots too)")
    p.add_argument("--image", required=True, help="container image built from the Dockerfile")
    p.add_argument("--name", default="harness-train", help="job name (DNS label)")
    p.add_argument("--namespace", help="default: kubectl's current namespace")
    p.add_argument("--port", type=int, default=2222, help="workers' gRPC port (tfjob, indexed-job)")
    p.add_argument("--volume-claim", default="harness-shared",
                   help="ReadWriteMany PersistentVolumeClaim for data and output ('' for none)")
    p.add_argument("--mount-path", default="/mnt/harness", help="where the claim is mounted in every pod")
    p.add_argument("--volume-claim-size", help="also write the claim, e.g. 500Gi (ReadWriteMany)")
    p.add_argument("--storage-class", help="storage class of that claim (one offering ReadWriteMany)")
    p.add_argument("--cpu", help="CPU request and limit per pod, e.g. 8 (default: a request of 3 per GPU)")
    p.add_argument("--memory", help="memory request and limit per pod, e.g. 32Gi (default: a request of 12Gi/GPU)")
    p.add_argument("--restart-policy", default=None,
                   help="tfjob: ExitCode (default: retry 138/130/137/143, fail on 2) | OnFailure | Never | Always; "
                        "indexed-job, mpijob: OnFailure (default) | Never")
    p.add_argument("--max-restarts", type=int, default=3,
                   help="faults the job survives, each restarting the pods (sizes --backoff-limit)")
    p.add_argument("--backoff-limit", type=int, default=None,
                   help="the job's backoffLimit (default: workers x max-restarts + 1)")
    p.add_argument("--mpi-launcher", choices=MPI_LAUNCHERS, default="mpirun", help="mpijob only")
    p.add_argument("--gang", action="store_true",
                   help="gang scheduling (tfjob, mpijob): all pods bound at once or none (Volcano, scheduler-plugins)")
    p.add_argument("--queue", help="--gang: the PodGroup's queue (Volcano)")
    p.add_argument("--priority-class", help="--gang: the PodGroup's priority class")
    p.add_argument("--scheduler-name", help="the pods' schedulerName, e.g. volcano (default: the operator's or cluster's)")
    p.add_argument("--no-network-policy", action="store_true",
                   help="leave out the NetworkPolicy that admits ingress to the job's pods from its own pods only "
                        "(a cluster that enforces none, or has its own)")
    p.add_argument("--overrides", help="YAML with your own settings: sections manifest, pod, container")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="command", help="-- harness train ...")
    p = _command(lsub, "mpi", launch_cmd.mpi,
                 "N ranks under mpirun (-bind-to none -map-by slot, exported environment), e.g. for --backend horovod")
    _rank_launch_args(p)
    p.add_argument("--mpirun-args", help="further mpirun arguments, one quoted string")
    p.add_argument("--export", action="append", metavar="NAME",
                   help="also export this variable to every rank (repeatable); see README, Horovod and MPI")
    p = _command(lsub, "horovod", launch_cmd.horovod, "N ranks under horovodrun (Gloo or MPI)")
    _rank_launch_args(p)
    p.add_argument("--controller", choices=HOROVOD_CONTROLLERS, default="gloo", help="horovodrun's rendezvous")
    p.add_argument("--horovodrun-args", help="further horovodrun arguments, one quoted string")

    return parser


def _rank_launch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--np", type=int, required=True, help="number of ranks (processes) in all")
    p.add_argument("-H", "--hosts", help="host:slots,... (default: this host)")
    p.add_argument("--dry-run", action="store_true", help="print the command line instead of running it")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before the launcher and ranks are killed (default: none, wait)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="command", help="-- harness train --backend horovod ...")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("tensorflow", "absl", "h5py"):   # their INFO lines drown ours
        logging.getLogger(noisy).setLevel(logging.WARNING)
    name = " ".join(filter(None, [args.command, getattr(args, "launcher", None)]))
    try:
        if args.command != "launch":   # a launcher's workers check for themselves
            _check_cloud_storage(args)
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print(f"harness {name}: interrupted; run the same command again to resume from the last backup",
              file=sys.stderr)
        # Leave now: TensorFlow's threads may still deliver the interrupt during interpreter shutdown, which
        # would end the process by SIGINT instead of with the exit code the shell convention gives it (128 + 2).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_codes.INTERRUPTED)
    except ClusterFault as e:
        # A fault of the cluster (lost, stuck or late peer, preemption): one line, and a code the Kubernetes
        # operators retry (harness.exit_codes); the same command resumes from the last backup.
        if args.verbose:
            raise
        print(f"harness {name}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        return exit_codes.RETRYABLE
    except (HarnessError, OSError) as e:
        # Bad input or configuration: the message, not a traceback (-v shows it). Anything else is a bug: its
        # traceback shows.
        if args.verbose:
            raise
        print(f"harness {name}: {type(e).__name__}: {_for_flags(e, args)}", file=sys.stderr)
        # A launcher passes on the code of the worker that failed first (WorkerFailedError.exit_code).
        return getattr(e, "exit_code", exit_codes.PERMANENT)


def _check_cloud_storage(args: argparse.Namespace) -> None:
    """Credentials and buckets for every gs:// path among the flags, checked before any work (`harness.data.gcs`)."""
    from harness.data import gcs

    values = []
    for value in vars(args).values():
        values += value if isinstance(value, (list, tuple)) else [value]
    gcs.check(values)


def _for_flags(error: Exception, args: argparse.Namespace) -> str:
    """The error's message, its advice to declare `label:` in a config turned into `--label` for the commands that
    take no config (`bench input`, `bench train`)."""
    text = str(error)
    if hasattr(args, "label") and not hasattr(args, "config"):
        text = text.replace("declare `label:`", "give --label NAME (no label feature was inferred)")
    return text


if __name__ == "__main__":
    sys.exit(main())
