"""`harness bench input`, `harness bench train`, `harness bench allreduce` and `harness bench scale`."""
from __future__ import annotations

import dataclasses


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

    fields = {f.name for f in dataclasses.fields(BenchTrainOptions)}
    given = {k: v for k, v in vars(args).items() if k in fields}
    for key in ("data", "like"):
        if given.get(key) is not None:
            given[key] = tuple(given[key])
    run(BenchTrainOptions(**given))
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
    points = scale.sweep(m, setup, args.max_gpus)
    print(scale.format_table(points, m, setup))
    if args.plot:
        scale.plot(points, args.plot)
        print(f"plot: {args.plot}")
    return 0
