"""`harness bench input`, `harness bench train`, `harness bench allreduce` and `harness bench scale`."""
from __future__ import annotations

from harness.choices import ALLREDUCE_ALGORITHMS, BACKENDS, CACHE_MODES, PRECISIONS, STRATEGIES
from harness.commands.args import NON_NEGATIVE, POSITIVE, byte_sizes, command, defaults, verbose
from harness.bench.train import BenchTrainOptions


def bench_input(args) -> int:
    """`harness bench input --data PATH [--batch B] [--passes P] [--repeats R]`."""
    from harness.bench.input import measure

    result = measure(args.data, batch=args.batch, passes=args.passes, repeats=args.repeats, label=args.label)
    print(f"{result['records']} records per pass ({result['mean_record_bytes'] / 1e3:.1f} kB each, "
          f"{result['compression']}), batch {args.batch}, {args.repeats} timed passes")
    print(f"  {'pipeline':<11} {'examples/s':>12} {'spread':>7} {'MB/s':>8} {'CPU us/ex':>10} {'cores':>6}")
    for name in ("read limit", "harness", "per-record"):
        r = result[name]
        print(f"  {name:<11} {r['examples_per_s']:>12,.0f} {r['spread']:>6.1%} {r['mb_per_s']:>8.1f} "
              f"{r['cpu_us_per_example']:>10.1f} {r['cores']:>6.2f}")
    h = result["harness"]["examples_per_s"]
    print(f"  harness / read limit = {h / result['read limit']['examples_per_s']:.2f}, "
          f"harness / per-record = {h / result['per-record']['examples_per_s']:.2f}")
    return 0


def bench_train(args) -> int:
    """`harness bench train [--data synthetic|PATH...] ...`: the report on the chief (`harness.bench.train`)."""
    from harness.bench.train import BenchTrainOptions, run

    flags = BenchTrainOptions().flags()   # the flat flags: the run's TrainOptions fields and the bench's own
    given = {k: v for k, v in vars(args).items() if k in flags}
    for key in ("data", "like"):
        if given.get(key) is not None:
            given[key] = tuple(given[key])
    run(BenchTrainOptions.from_flags(**given))
    return 0


def bench_allreduce(args) -> int:
    """`harness bench allreduce [--backend tf|horovod] [--sizes B,...] ...` (`harness.bench.allreduce`)."""
    from harness.bench.allreduce import run

    from harness.bench.allreduce import DEFAULT_SIZES

    run(backend_name=args.backend, sizes_bytes=args.sizes or DEFAULT_SIZES, tensors=args.tensors, rounds=args.rounds,
        repeats=args.repeats, output=args.output)
    return 0


def bench_scale(args) -> int:
    """`harness bench scale --report REPORT.json [--allreduce J | --link L --node N] [--timeline T] ...`
    (`harness.bench.scale`; `harness.bench.timeline` for the measured gradient profile)."""
    from harness.bench import scale
    from harness.errors import ConfigError

    m, shapes = scale.measurement_from_report(args.report)
    if args.allreduce and args.link:
        raise ConfigError("give --allreduce (a measured fit) or --link, not both")
    net = scale.link_from_allreduce(args.allreduce) if args.allreduce else scale.parse_link(args.link or "25Gbit/s")
    gpus, node = scale.parse_node(args.node)
    if args.gpus_per_node:
        gpus = args.gpus_per_node
    if args.timeline is None and (args.gradient_bytes is None) != (args.tensors is None):
        raise ConfigError("give both --gradient-bytes and --tensors, or neither (read from the report's model)")
    profile = None
    if args.timeline is not None:
        from harness.bench import timeline

        profile = timeline.gradient_profile(args.timeline)
        print(timeline.describe(profile))
        if args.tensors is not None and args.tensors != len(profile.nbytes):
            raise ConfigError(f"--tensors {args.tensors}: the timeline {args.timeline} holds {len(profile.nbytes)} "
                              "gradient tensors; give --gradient-bytes alone to rescale its bytes")
    if profile is not None:   # --gradient-bytes rescales the measured bytes (fp16 gradients: half)
        nbytes, tensors = args.gradient_bytes or profile.gradient_bytes, len(profile.nbytes)
    elif args.tensors is not None:
        nbytes, tensors = args.gradient_bytes, args.tensors
    else:
        nbytes, tensors = scale.model_gradients(shapes)
    setup = scale.Setup(gradient_bytes=nbytes, tensors=tensors, gpus_per_node=gpus, node=node, net=net,
                        backend=args.backend, fusion_bytes=args.fusion_threshold, cycle_s=args.cycle_time_ms / 1e3,
                        bytes_per_pack=args.bytes_per_pack, algorithm=args.algorithm,
                        fixed_s=args.fixed_ms / 1e3, ready_profile=profile.pairs() if profile else ())
    if args.measured:
        from harness.bench import calibrate

        runs = [calibrate.Run.parse(text) for text in args.measured]
        fit = calibrate.calibrate(m, setup, runs)
        print(calibrate.describe(fit))
        for line in ([fit.note] if fit.note else []) + calibrate.reproduction(m, fit, runs):
            print(line)
        line, setup = setup, fit.setup   # the forecast's refits search from the line rate
    points = scale.sweep(m, setup, args.max_gpus)
    print(scale.format_table(points, m, setup))
    if args.measured:
        print(calibrate.format_forecast(calibrate.forecast(m, line, runs, [p.n for p in points if p.n > 1], fit),
                                        runs))
    if args.plot:
        scale.plot(points, args.plot)
        print(f"plot: {args.plot}")
    return 0


def add_parsers(sub) -> None:
    """`harness bench input|train|allreduce|scale`."""
    bench = sub.add_parser("bench", allow_abbrev=False, help="Benchmarks: the input pipeline alone, or training (synthetic or real data)")
    verbose(bench)
    bsub = bench.add_subparsers(dest="bench", required=True)
    p = command(bsub, "input", bench_input,
                "Input pipeline examples/s on your shards: read limit, harness pipeline, per-record pipeline")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH", help="shards: a folder, a glob, or paths")
    p.add_argument("--label", help="label feature (default: inferred)")
    p.add_argument("--batch", type=POSITIVE, default=64, help="examples per batch")
    p.add_argument("--passes", type=POSITIVE, default=1, help="times the files are read per timed run")
    p.add_argument("--repeats", type=POSITIVE, default=3, help="timed runs (after one warm-up run)")

    p = command(bsub, "train", bench_train,
                "Training examples/s and input stall, on synthetic batches on the device or on real shards")
    D = defaults(BenchTrainOptions)   # each default below is the library's
    p.add_argument("--data", nargs="+", default=list(D["data"]), metavar="synthetic|PATH",
                   help="`synthetic` (the compute ceiling) or shards")
    p.add_argument("--like", nargs="+", metavar="PATH",
                   help="synthetic batches shaped like these shards (default: --patch-size, --bands, --classes)")
    p.add_argument("--label", help="label feature (default: inferred)")
    p.add_argument("--steps", type=POSITIVE, default=D["steps"], help="timed steps")
    p.add_argument("--warmup", type=NON_NEGATIVE, default=D["warmup"],
                   help="untimed first steps (tracing, autotuning, cache fill)")
    p.add_argument("--output", default=D["output"], help="report folder (chief only)")
    p.add_argument("--per-replica-batch-size", type=POSITIVE, default=D["per_replica_batch_size"],
                   help="examples per replica per step")
    p.add_argument("--precision", choices=PRECISIONS, default=D["precision"],
                   help="auto: mixed_float16 on GPUs >= 7.0, mixed_bfloat16 on bf16 CPUs/TPUs")
    p.add_argument("--strategy", choices=STRATEGIES, default=D["strategy"],
                   help="auto: multi-worker when TF_CONFIG names several tasks, mirrored on several GPUs")
    p.add_argument("--cpu-replicas", type=POSITIVE, default=D["cpu_replicas"],
                   help="logical CPU replicas (mirrored, no GPU); default 1")
    p.add_argument("--patch-size", type=POSITIVE, default=D["patch_size"], help="synthetic: patch side, pixels")
    p.add_argument("--bands", type=POSITIVE, default=D["bands"], help="synthetic: bands")
    p.add_argument("--classes", type=POSITIVE, default=D["classes"], help="synthetic: classes")
    p.add_argument("--cache", choices=CACHE_MODES, default=D["cache"],
                   help="real shards: parsed records kept after the first pass (auto: in memory when they fit, else in "
                        "files under --cache-dir when given, else none)")
    p.add_argument("--cache-dir", help="folder of the file cache (--cache file); default: none")
    p.add_argument("--data-service", metavar="grpc://HOST:PORT",
                   help="input pipeline on a tf.data service (default: in this process)")
    p.add_argument("--profile-steps", metavar="START:STOP", help="steps to trace (default: 10 after warm-up)")
    p.add_argument("--profile-dir", help="TensorBoard log dir of the traces (default OUTPUT/tensorboard)")
    p.add_argument("--no-trace", action="store_true", help="no tf.profiler trace")
    p.add_argument("--no-sampling", action="store_true", help="no GPU/CPU utilization sampling")
    p.add_argument("--sample-interval", type=float, default=D["sample_interval"],
                   help="seconds between utilization samples")
    p.add_argument("--no-plot", action="store_true", help="no timeline.png")
    p.add_argument("--baseline", metavar="REPORT",
                   help="a one-replica run's report.json: adds scaling efficiency (default: none)")
    p.add_argument("--seed", type=int, default=D["seed"], help="synthetic data and model initialization")
    p.add_argument("--backend", choices=BACKENDS, default=D["backend"],
                   help="tf: tf.distribute (TF_CONFIG for several workers); horovod: one process per replica under "
                        "horovodrun/mpirun, as `harness train --backend horovod`")

    p = command(bsub, "allreduce", bench_allreduce,
                "The gradient all-reduce training runs, timed over sizes on the workers it is launched on; fits the "
                 "link's latency (alpha) and bandwidth (beta)")
    p.add_argument("--backend", choices=BACKENDS, default="tf",
                   help="tf: tf.distribute (TF_CONFIG for several workers); horovod: under horovodrun/mpirun")
    p.add_argument("--sizes", type=byte_sizes, default=None, metavar="BYTES,...",
                   help="bytes per all-reduce, e.g. 4096,1M,16M (default 1 KiB to 16 MiB, x4 steps)")
    p.add_argument("--tensors", type=POSITIVE, default=1, help="gradient tensors each size is split into")
    p.add_argument("--rounds", type=POSITIVE, default=20, help="chained all-reduces per timed call")
    p.add_argument("--repeats", type=POSITIVE, default=5, help="timed calls per size (the median is kept)")
    p.add_argument("--output", default=None, help="folder for allreduce.json (chief only; default: none)")

    p = command(bsub, "scale", bench_scale,
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
    p.add_argument("--measured", action="append", metavar="N=RATE",
                   help="calibrate: examples/s measured on N replicas (one node's GPUs, two nodes, ...), as N=RATE, "
                        "N=RATE±S%% or N=R1,R2,... for repeated runs; repeat the flag per run. Fits the overlap, the "
                        "achieved bandwidth and the fixed cost those runs determine, and forecasts with an interval")
    p.add_argument("--timeline", metavar="TIMELINE.json",
                   help="a Horovod timeline (HOROVOD_TIMELINE) of the same step on >= 2 ranks on one node: when each "
                        "gradient is ready, instead of an even spread over the backward pass, and the gradient "
                        "tensors and bytes (--gradient-bytes rescales them)")
    p.add_argument("--plot", metavar="OUT.png", help="efficiency vs N and the step breakdown")
