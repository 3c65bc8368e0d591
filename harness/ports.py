"""Every listening socket a run of the harness opens, per mode: which process, which address, which port, what can be
done through it and what protects it (issue 24, item 1).

One `Listener` row per socket kind (`INVENTORY`). `tests/test_ports_inventory.py` runs each mode briefly, lists the
sockets its processes listen on (tests/ports_observer.py: polled from /proc and traced with strace) and fails on any
that no row of the mode describes, and on a row nobody saw; the README's Security table is `markdown_table()`
(tests/test_docs.py checks they match).

Why it matters: TensorFlow's distributed server has no authorization, sends messages unencrypted, "accepts
connections from anywhere, and executes the graphs it is sent" (TensorFlow SECURITY.md, "Running a TensorFlow
server"); the tf.data service's servers are built on the same gRPC runtime. Whoever reaches such a port runs code
with the worker's privileges, so the network between the job's processes must be closed to everyone else.

Which ports clusters outside Kubernetes (`mpirun`, `horovodrun`, `srun`) need open between which hosts, and how
to pin the ones that can be pinned (`open_mpi_pin`), is printed with the launch lines
(`harness.launch.mpi.ports_note`) and written in the README ("Security"): Open MPI's MCA parameters (`ompi_info
--param btl tcp --level 9`, `ompi_info --param oob tcp --level 9`; Open MPI FAQ, "Tuning the run-time
characteristics of MPI TCP communications", open-mpi.org/faq/?category=tcp); Horovod's rendezvous and services
pick a random free port from 1024 (horovod/runner/util/network.py `find_port`, Horovod 0.28.1, with no flag to fix
it); NCCL and Gloo bind port 0 (NVIDIA/nccl issue 388: no port range).

The rows were found by running each mode (TensorFlow 2.18, Horovod 0.28.1, Open MPI 4.1.4, TensorBoard 2.18) and
reading its sockets from /proc and with strace, as the test does.
"""
from __future__ import annotations

from dataclasses import dataclass

# The ports the harness fixes by default (each the one home of its number).
TF_SERVER_PORT = 2222         # a worker's gRPC port in an Indexed Job's TF_CONFIG, a TFJob's `tfjob-port`
DATA_SERVICE_PORT = 5050      # `harness data-service dispatcher --port`
TENSORBOARD_PORT = 6006       # TensorBoard's own default; it tries the next 99 when taken

# Modes: the commands a user runs (README). Each is run by tests/test_ports_inventory.py (`launch local`: by
# tests/cluster/test_local_isolation.py, on a two-host bed).
TRAIN = "harness train"
PROFILE = "harness train --profile"
LOCAL = "harness launch local"
LOCAL_HOST = "harness launch local --network host"
TF_CONFIG_MODE = "harness train, TF_CONFIG (MWMS)"
HOROVOD_GLOO = "harness launch horovod --controller gloo"
HOROVOD_MPI = "harness launch horovod --controller mpi"
MPI = "harness launch mpi"
DATA_SERVICE = "harness data-service + train --data-service"
TENSORBOARD = "tensorboard --logdir (printed)"
MODES = (TRAIN, PROFILE, LOCAL, LOCAL_HOST, TF_CONFIG_MODE, HOROVOD_GLOO, HOROVOD_MPI, MPI, DATA_SERVICE, TENSORBOARD)

# Addresses a socket is bound to.
ALL = "all interfaces"      # 0.0.0.0 / [::]: reachable from any host that can route to this one
LOOPBACK = "loopback"       # 127.0.0.0/8 / ::1: this host only
INTERFACE = "one interface"  # one interface's own address (Gloo's HOROVOD_GLOO_IFACE)
PRIVATE = "own namespace"   # any address, in a network namespace of the run's own with loopback only

# Ports.
FROM_TF_CONFIG = "TF_CONFIG"          # the task's own host:port in TF_CONFIG's cluster
FROM_FLAG = "--port"                  # the command's --port (0: an ephemeral one)
EPHEMERAL = "ephemeral"               # bound to port 0: the kernel's pick from net.ipv4.ip_local_port_range
RANDOM_1024 = "random >= 1024"        # Horovod's find_port: a random free port in 1024-65535
FIRST_FREE_1024 = "first free >= 1024"  # Open MPI's TCP BTL: the first free from btl_tcp_port_min_v4 (1024)
TENSORBOARD_PORTS = f"{TENSORBOARD_PORT}-{TENSORBOARD_PORT + 99}"  # TensorBoard: 6006, else the next 99 free

# Processes (roles), as `role()` names them from a command line.
WORKER = "worker"                     # `harness train` (a rank, a TF_CONFIG task, a single process)
LAUNCHER = "harness launch"
MPIRUN = "mpirun"
HOROVODRUN = "horovodrun"
DISPATCHER = "data-service dispatcher"
DATA_WORKER = "data-service worker"
TENSORBOARD_PROCESS = "tensorboard"


@dataclass(frozen=True)
class Listener:
    """One kind of listening socket of a mode.

    Attributes:
      mode: one of `MODES`.
      process: the role of the process that listens (`WORKER`, `MPIRUN`, ...; `role()`).
      address: `ALL`, `LOOPBACK`, `INTERFACE` or `PRIVATE`.
      port: `FROM_TF_CONFIG`, `FROM_FLAG`, `EPHEMERAL`, `RANDOM_1024`, `FIRST_FREE_1024` or
        `TENSORBOARD_PORTS`.
      per_process: how many such ports one process listens on at most (its IPv4 and IPv6 sockets of a port are
        one); a run of the test fails on more.
      reach: what whoever connects can do through it.
      protection: what stops a stranger, besides the network.
      pin: how to fix the port (or a range of them) for a firewall; "" where it cannot be.
    """
    mode: str
    process: str
    address: str
    port: str
    per_process: int
    reach: str
    protection: str
    pin: str = ""


_TF_SERVER = ("TensorFlow's gRPC server: runs any graph it is sent (reads and writes files, starts processes, with "
              "the worker's privileges); the collectives and coordination service of MultiWorkerMirroredStrategy")
_NOTHING = "nothing: no authentication, no encryption (TensorFlow SECURITY.md)"

# `harness launch local` (issue 24, item 2): by default the workers run in a network namespace of their own with
# loopback only (harness/launch/netns.py), where TensorFlow's server still binds every interface of that namespace;
# `--network host` (or a machine where no namespace can be made) leaves them on this host's interfaces.
LOCAL_WORKERS = Listener(
    LOCAL, WORKER, PRIVATE, FROM_TF_CONFIG, 1, _TF_SERVER,
    "the run's own network namespace (loopback only): no other host, nor this host outside the run, reaches it",
    "cannot be (the launcher picks a free port per worker)")
LOCAL_HOST_WORKERS = Listener(
    LOCAL_HOST, WORKER, ALL, FROM_TF_CONFIG, 1, _TF_SERVER,
    _NOTHING + "; TF_CONFIG names localhost but the server binds every interface (the launcher says so, with the "
    "ports): close them to other hosts", "cannot be (the launcher picks a free port per worker)")


def _open_mpi(mode: str) -> tuple[Listener, ...]:
    """Open MPI 4.1's listeners under `mode` (observed with 4.1.4: mpirun on one host; an orted on each other host
    listens as mpirun's runtime does)."""
    runtime = "Open MPI's runtime (ORTE out-of-band TCP): mpirun and the orted daemons launch and control the ranks"
    return (
        Listener(mode, MPIRUN, ALL, EPHEMERAL, 2, runtime + " (one IPv4 and one IPv6 port)",
                 "nothing but the ssh that starts the daemons", "-mca oob_tcp_static_ipv4_ports P "
                 "-mca oob_tcp_static_ipv6_ports P"),
        Listener(mode, MPIRUN, LOOPBACK, EPHEMERAL, 1, "PMIx server's tool connections (ompi-top, ...)",
                 "bound to loopback: this host only", ""),
        Listener(mode, WORKER, ALL, FIRST_FREE_1024, 1,
                 "Open MPI's TCP BTL: MPI messages between ranks on different hosts (mpi4py's control plane, "
                 "Horovod's MPI operations)", "nothing (no authentication)",
                 "-mca btl_tcp_port_min_v4 P -mca btl_tcp_port_range_v4 N (and _v6)"),
        Listener(mode, WORKER, INTERFACE, EPHEMERAL, 1,
                 "a second socket of the TCP BTL, on the interface's own address (absent without the tcp BTL)",
                 "nothing (no authentication)", ""),
    )


INVENTORY: tuple[Listener, ...] = (
    LOCAL_WORKERS,
    LOCAL_HOST_WORKERS,
    Listener(TF_CONFIG_MODE, WORKER, ALL, FROM_TF_CONFIG, 1, _TF_SERVER,
             _NOTHING + "; the network (Kubernetes: the job's NetworkPolicy, `launch k8s`)",
             "the port of the task's address in TF_CONFIG (`launch k8s --port`, default 2222)"),
    Listener(HOROVOD_GLOO, HOROVODRUN, ALL, RANDOM_1024, 1,
             "Gloo rendezvous: an HTTP key-value store the ranks meet through (GET/PUT/DELETE); a stranger can "
             "read the ranks' addresses and overwrite them, which stalls or misroutes the job's start",
             "nothing (plain HTTP, no key); it serves until horovodrun exits", ""),
    # Horovod 0.28.1's Gloo listens once per peer for each of its contexts (4 ports per rank at 2 ranks on one
    # host, traced) and closes each listener as soon as that peer has connected, within hvd.init (open < 0.2 s).
    Listener(HOROVOD_GLOO, WORKER, INTERFACE, EPHEMERAL, 4,
             "Gloo's TCP transport: the ranks' collectives (tensors in, tensors out); each listener is open only "
             "during hvd.init, until its peer has connected (the connection stays)",
             "nothing (no authentication); bound to HOROVOD_GLOO_IFACE's address (lo when every rank is local)",
             "net.ipv4.ip_local_port_range (host-wide)"),
    *_open_mpi(HOROVOD_MPI),
    *_open_mpi(MPI),
    Listener(DATA_SERVICE, DISPATCHER, ALL, FROM_FLAG, 1,
             "tf.data service dispatcher (gRPC): takes dataset graphs from any client and has its workers run them",
             _NOTHING, "--port (default 5050)"),
    Listener(DATA_SERVICE, DATA_WORKER, ALL, EPHEMERAL, 1,
             "tf.data service worker (gRPC): runs the dataset graphs the dispatcher hands it, streams the elements "
             "to any consumer", _NOTHING, "--port N (default 0: ephemeral)"),
    Listener(TENSORBOARD, TENSORBOARD_PROCESS, LOOPBACK, TENSORBOARD_PORTS, 1,
             "TensorBoard's web server: reads the event files and traces under --logdir",
             "bound to localhost (TensorBoard's default; --bind_all would open it to every host)", "--port"),
    Listener(TENSORBOARD, TENSORBOARD_PROCESS, LOOPBACK, EPHEMERAL, 1,
             "TensorBoard's data server (tensorboard_data_server, gRPC): the event files' contents for TensorBoard",
             "bound to localhost", ""),
)


def rows(mode: str) -> list[Listener]:
    """The inventory's rows of `mode`.

    Raises:
      ValueError: if `mode` is not one of `MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
    return [row for row in INVENTORY if row.mode == mode]


def open_mpi_pin(first: int, count: int) -> list[str]:
    """`mpirun` arguments that put Open MPI's pinnable listeners in ports `first` ... `first + count - 1`: the
    runtime's (mpirun, orted) on `first` (IPv4 and IPv6), the TCP BTL's (the ranks) on the rest. Open MPI 4.1's
    parameters (`ompi_info --param oob tcp --level 9`, `--param btl tcp`); not `oob_tcp_dynamic_ipv4_ports`,
    with which Open MPI 4.1.4's mpirun listens on every port of the range at once. What stays ephemeral: the
    PMIx tool socket (loopback) and the BTL's second socket (`INVENTORY`).

    Raises:
      ValueError: if `count < 2` or the range leaves 1024-65535.
    """
    if count < 2 or first < 1024 or first + count - 1 > 65535:
        raise ValueError(f"a port range needs >= 2 ports within 1024-65535, got {first} + {count}")
    btl = [str(first + 1), str(count - 1)]
    return ["-mca", "oob_tcp_static_ipv4_ports", str(first), "-mca", "oob_tcp_static_ipv6_ports", str(first),
            "-mca", "btl_tcp_port_min_v4", btl[0], "-mca", "btl_tcp_port_range_v4", btl[1],
            "-mca", "btl_tcp_port_min_v6", btl[0], "-mca", "btl_tcp_port_range_v6", btl[1]]


TABLE_HEADER = ("| Mode | Process | Address | Port | Through it | Protected by | Pinned with |\n"
                "|---|---|---|---|---|---|---|")


def markdown_table() -> str:
    """The inventory as the README's Markdown table: one line per row of `INVENTORY`, in `MODES` order, and one
    "listens on nothing" line for each mode without a row."""
    lines = [TABLE_HEADER]
    for mode in MODES:
        own = rows(mode)
        if not own:
            lines.append(f"| `{mode}` | - | - | - | listens on nothing | - | - |")
        for r in own:
            lines.append(f"| `{mode}` | {r.process} | {r.address} | {r.port} | {r.reach} | {r.protection} | "
                         f"{r.pin or 'cannot be'} |")
    return "\n".join(lines)
