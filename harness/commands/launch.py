"""`harness launch local|k8s|mpi|horovod`: start a command as several workers, or write the manifests that do."""
from __future__ import annotations

import shlex
import sys


def _command(args) -> list[str]:
    """The command after `--`."""
    command = list(args.argv)
    return command[1:] if command and command[0] == "--" else command


def local(args) -> int:
    """`harness launch local --workers N [--gpus-per-worker G] [--timeout S] [--network private|host] -- CMD...`."""
    from harness.launch.local import run_local

    run_local(_command(args), workers=args.workers, gpus_per_worker=args.gpus_per_worker, timeout_s=args.timeout,
              network=args.network)
    return 0


def k8s(args) -> int:
    """`harness launch k8s --kind KIND --workers N [--gpus-per-worker G] --image IMAGE [...] -- CMD...`."""
    from harness.launch import k8s as k8s_lib

    options = k8s_lib.K8sOptions(
        kind=args.kind, command=tuple(_command(args)), workers=args.workers, image=args.image,
        gpus_per_worker=args.gpus_per_worker, name=args.name, namespace=args.namespace, port=args.port,
        volume_claim=args.volume_claim or None, mount_path=args.mount_path,
        volume_claim_size=args.volume_claim_size, storage_class=args.storage_class, cpu=args.cpu,
        memory=args.memory, restart_policy=args.restart_policy, max_restarts=args.max_restarts,
        backoff_limit=args.backoff_limit, mpi_launcher=args.mpi_launcher,
        overrides=k8s_lib.load_overrides(args.overrides), gang=args.gang, queue=args.queue,
        priority_class=args.priority_class, scheduler_name=args.scheduler_name,
        network_policy=not args.no_network_policy)
    text = k8s_lib.to_yaml(k8s_lib.manifests(options), options)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}: kubectl apply -f {args.output}", file=sys.stderr)
    return 0


def mpi(args) -> int:
    """`harness launch mpi --np N [-H host:slots,...] [--export NAME]... [--mpirun-args ARGS] [--dry-run] -- CMD`."""
    from harness.launch import mpi as mpi_lib

    line = mpi_lib.mpirun_command(_command(args), np=args.np, hosts=args.hosts,
                                  extra=shlex.split(args.mpirun_args or ""), export=args.export or ())
    return _launch(line, args)


def horovod(args) -> int:
    """`harness launch horovod --np N [-H host:slots,...] [--controller gloo|mpi] [--dry-run] -- CMD...`."""
    from harness.launch import mpi as mpi_lib

    line = mpi_lib.horovodrun_command(_command(args), np=args.np, hosts=args.hosts, controller=args.controller,
                                      extra=shlex.split(args.horovodrun_args or ""),
                                      horovodrun=mpi_lib.beside_python("horovodrun"))
    return _launch(line, args)


def _launch(line: list[str], args) -> int:
    """Print the line (`--dry-run`), or run it and wait (bounded by `--timeout` seconds when given). The printed
    line shows each credential's value as `<redacted>` (`harness.redact`), with a note naming them on stderr; the
    ports the job needs open between which hosts (`ports_note`) go to stderr as shell comments."""
    from harness import redact
    from harness.launch.mpi import ports_note, run

    shown = shlex.join(redact.redact_argv(line))
    hidden = redact.redacted_names(line)
    if hidden:
        print(f"harness: the values of {', '.join(hidden)} are {redact.MARKER} in the printed line; export them "
              "by name instead (mpirun -x NAME, --export NAME)", file=sys.stderr)
    print("\n".join(ports_note(line)), file=sys.stderr)
    if args.dry_run:
        print(shown)
        return 0
    print(f"launching: {shown}", file=sys.stderr, flush=True)
    run(line, timeout_s=args.timeout)
    return 0
