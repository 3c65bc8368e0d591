"""`harness launch local|k8s|mpi|horovod`: start a command as several workers, or write the manifests that do."""
from __future__ import annotations

import argparse
import shlex
import sys

from harness.choices import HOROVOD_CONTROLLERS, K8S_KINDS, LOCAL_NETWORKS, MPI_LAUNCHERS
from harness.commands.args import command, defaults, verbose
from harness.launch.k8s import K8sOptions


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
                                  extra=shlex.split(args.mpirun_args or ""), export=args.export or (),
                                  interfaces=args.network_interface)
    return _launch(line, args)


def horovod(args) -> int:
    """`harness launch horovod --np N [-H host:slots,...] [--controller gloo|mpi] [--dry-run] -- CMD...`."""
    from harness.launch import mpi as mpi_lib

    line = mpi_lib.horovodrun_command(_command(args), np=args.np, hosts=args.hosts, controller=args.controller,
                                      extra=shlex.split(args.horovodrun_args or ""),
                                      horovodrun=mpi_lib.beside_python("horovodrun"),
                                      interfaces=args.network_interface)
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


def add_parsers(sub) -> None:
    """`harness launch local|k8s|mpi|horovod`."""
    launch = sub.add_parser("launch", allow_abbrev=False, help="Start a command as several workers")
    verbose(launch)
    lsub = launch.add_subparsers(dest="launcher", required=True)
    p = command(lsub, "local", local,
                "N workers on this machine, each with its TF_CONFIG; output prefixed by worker",
                example="harness launch local --workers 2 -- harness evaluate --model runs/points --data "
                        "points/export-00003.tfrecord.gz")
    p.add_argument("--workers", type=int, required=True, help="worker processes to start")
    p.add_argument("--gpus-per-worker", type=int, default=0, help="GPUs per worker (CUDA_VISIBLE_DEVICES slices)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before all workers are stopped (default: none, wait)")
    p.add_argument("--network", choices=LOCAL_NETWORKS, default="private",
                   help="private (default): the workers in a network namespace with loopback only, open to no other "
                        "host and reaching none; host: this host's network (their ports open to other hosts)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="command", help="-- harness train ...")
    p = command(lsub, "k8s", k8s,
                "Write Kubernetes manifests (TFJob, MPIJob, or Indexed Job + headless Service) for a command")
    D = defaults(K8sOptions)   # each default below is the library's
    p.add_argument("--kind", choices=K8S_KINDS, required=True,
                   help="Kubeflow TFJob or MPIJob, or a plain Indexed Job with a headless Service")
    p.add_argument("--workers", type=int, required=True, help="training pods")
    p.add_argument("--gpus-per-worker", type=int, default=D["gpus_per_worker"],
                   help="nvidia.com/gpu per pod (mpijob: MPI slots too)")
    p.add_argument("--image", required=True, help="container image built from the Dockerfile")
    p.add_argument("--name", default=D["name"], help="job name (DNS label)")
    p.add_argument("--namespace", help="default: kubectl's current namespace")
    p.add_argument("--port", type=int, default=D["port"], help="workers' gRPC port (tfjob, indexed-job)")
    p.add_argument("--volume-claim", default=D["volume_claim"],
                   help="ReadWriteMany PersistentVolumeClaim for data and output ('' for none)")
    p.add_argument("--mount-path", default=D["mount_path"], help="where the claim is mounted in every pod")
    p.add_argument("--volume-claim-size", help="also write the claim, e.g. 500Gi (ReadWriteMany)")
    p.add_argument("--storage-class", help="storage class of that claim (one offering ReadWriteMany)")
    p.add_argument("--cpu", help="CPU request and limit per pod, e.g. 8 (default: a request of 3 per GPU)")
    p.add_argument("--memory", help="memory request and limit per pod, e.g. 32Gi (default: a request of 12Gi/GPU)")
    p.add_argument("--restart-policy", default=None,
                   help="tfjob: ExitCode (default: retry 138/130/137/143, fail on 2) | OnFailure | Never | Always; "
                        "indexed-job, mpijob: OnFailure (default) | Never")
    p.add_argument("--max-restarts", type=int, default=D["max_restarts"],
                   help="faults the job survives, each restarting the pods (sizes --backoff-limit)")
    p.add_argument("--backoff-limit", type=int, default=None,
                   help="the job's backoffLimit (default: workers x max-restarts + 1)")
    p.add_argument("--mpi-launcher", choices=MPI_LAUNCHERS, default=D["mpi_launcher"], help="mpijob only")
    p.add_argument("--gang", action="store_true",
                   help="gang scheduling (tfjob, mpijob): all pods bound at once or none (Volcano, scheduler-plugins)")
    p.add_argument("--queue", help="--gang: the PodGroup's queue (Volcano)")
    p.add_argument("--priority-class", help="--gang: the PodGroup's priority class")
    p.add_argument("--scheduler-name",
                   help="the pods' schedulerName, e.g. volcano (default: the operator's or cluster's)")
    p.add_argument("--no-network-policy", action="store_true",
                   help="leave out the NetworkPolicy that admits ingress to the job's pods from its own pods only "
                        "(a cluster that enforces none, or has its own)")
    p.add_argument("--overrides", help="YAML with your own settings: sections manifest, pod, container")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="command", help="-- harness train ...")
    p = command(lsub, "mpi", mpi,
                "N ranks under mpirun (-bind-to none -map-by slot, exported environment), e.g. for --backend horovod")
    rank_launch_args(p)
    p.add_argument("--mpirun-args", help="further mpirun arguments, one quoted string")
    p.add_argument("--export", action="append", metavar="NAME",
                   help="also export this variable to every rank (repeatable); see README, Horovod and MPI")
    p = command(lsub, "horovod", horovod, "N ranks under horovodrun (Gloo or MPI)")
    rank_launch_args(p)
    p.add_argument("--controller", choices=HOROVOD_CONTROLLERS, default="gloo", help="horovodrun's rendezvous")
    p.add_argument("--horovodrun-args", help="further horovodrun arguments, one quoted string")


def rank_launch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--np", type=int, required=True, help="number of ranks (processes) in all")
    p.add_argument("-H", "--hosts", help="host:slots,... (default: this host)")
    p.add_argument("--network-interface", metavar="NIC[,NIC...]",
                   help="the ranks' network interfaces, every host's name for its link where hosts name them "
                        "differently (e.g. eth0,enp129s0f1); default: mpirun excludes lo and docker0, "
                        "horovodrun looks for a name every host has")
    p.add_argument("--dry-run", action="store_true", help="print the command line instead of running it")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before the launcher and ranks are killed (default: none, wait)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="command", help="-- harness train --backend horovod ...")
