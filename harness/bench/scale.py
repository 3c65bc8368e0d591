"""`harness bench scale`: what N GPUs will give, from one measured machine: examples/s, efficiency and what stops it.

The model (pure Python, no TensorFlow) predicts one training step on N replicas, G per node, as

    T_step(N) = T_compute + T_exposed(N) + T_fixed + T_straggler(N),   efficiency E(N) = T_compute / T_step(N)

- T_compute: the measured one-replica step (forward + backward + update), seconds. The backward pass is the last
  `backward_share` of it (2/3 by default: a backward pass costs about twice the forward's FLOPs, the 2N vs 4N
  per-parameter count of Kaplan et al., "Scaling laws for neural language models", arXiv 2001.08361, §2.1).
  Gradients become ready at a uniform byte rate over the backward pass, last layer first (the model knows tensor
  count and bytes, not the per-layer profile; a stated assumption, pessimistic for VGG-style nets whose big dense
  gradients come first), unless a measured profile is given (`Setup.ready_profile`, from a Horovod timeline:
  `harness.bench.timeline`): then gradient i is ready a measured share of the step before the end of its compute,
  with its measured share of the gradient bytes.
- T_exposed: the all-reduce time not hidden behind backward. All-reduces run one after another on one channel
  (Horovod's background loop; MWMS' collectives ordered by their launch), so the last one ends at
  `comm_finish(buffers)`; what ends after the backward pass is exposed. The buffers come from the backend's
  schedule (`horovod_buffers`, `mwms_buffers`).
- T_fixed: per-step cost that is neither compute nor link time (negotiation, Python): a measured input, default 0.
- T_straggler: every replica waits for the slowest one. For i.i.d. per-step times of spread σ the expected maximum
  of N exceeds the mean by at most σ·sqrt(2 ln N) (the Gaussian maximal inequality: Boucheron, Lugosi & Massart,
  "Concentration Inequalities", 2013, §2.5); σ is the measured standard deviation of the step time.

All-reduce cost of S bytes (`ring_seconds`, `hierarchical_seconds`), with α seconds per message hop and β seconds
per byte of a link: the ring all-reduce (reduce-scatter then all-gather around a ring of N ranks) sends
2(N−1)/N·S bytes over every link of the ring in 2(N−1) steps: t = 2(N−1)·α + 2(N−1)/N·S·β, bandwidth optimal
(Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009;
Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 19(1), 2005).
On nodes of G GPUs the ring crosses the network once per node: NCCL's tuning model (NVIDIA/nccl
`src/graph/tuning.cc`) counts 2(M−1) of the 2(N−1) steps as network hops (M nodes) and the rest as intra-node
hops, and the ring runs at its slowest link. The hierarchical all-reduce (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE,
`docs/timeline.rst`: NCCL reduce-scatter in the node, all-reduce across nodes, NCCL all-gather in the node) costs
2·[(G−1)·α_node + (G−1)/G·S·β_node] + 2(M−1)·α_net + 2(M−1)/M·S·β_net: the G per-GPU rings across nodes each carry
S/G and share the node's network link. NCCL's double binary tree (`tree_seconds`; NVIDIA blog "Massively scale
your deep learning training with NCCL 2.4", 2019) has NCCL's tree latency 2·[(G−1)·α_node + log2(M)·α_net] and
its tree bandwidth 0.5 x 0.9 of the link's (tuning.cc: `algBw = 0.5 · 0.9 · busBw`): 2·S·β/0.9.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from typing import Optional, Sequence

from harness.choices import ALLREDUCE_ALGORITHMS, BACKENDS
from harness.errors import ConfigError

TF, HOROVOD = BACKENDS
RING, HIERARCHICAL, TREE = ALLREDUCE_ALGORITHMS
# Horovod's defaults at HEAD (horovod/common/operations.cc; PR #2468, v0.21.0): before, 64 MiB and 5 ms.
HOROVOD_FUSION_BYTES = 128 * 1024 * 1024
HOROVOD_CYCLE_S = 1e-3
BACKWARD_SHARE = 2.0 / 3.0
EFFICIENCY_TARGET = 0.80

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_TIMES = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@dataclasses.dataclass(frozen=True)
class Link:
    """One link: `alpha_s` seconds per message hop, `beta_s_per_byte` seconds per byte (1/bandwidth)."""

    alpha_s: float
    beta_s_per_byte: float

    @property
    def bytes_per_s(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf


# Intra-node links by name: per-direction bandwidth of the link a ring uses, and NCCL's per-hop latency of its
# Simple protocol (NVIDIA/nccl src/graph/tuning.cc@01afd20a: NVLink 3.4 µs, PCI 5.7 µs; network 9.6 µs).
# NVLink 2.0: 25 GB/s per direction per link (NVIDIA Tesla V100 whitepaper, 2017); PCIe 3.0 x16: 15.75 GB/s
# per direction (PCI-SIG: 8 GT/s x 16 lanes, 128b/130b).
NODE_LINKS = {"nvlink": Link(3.4e-6, 1 / 25e9), "pcie": Link(5.7e-6, 1 / 15.75e9)}
NET_HOP_S = 9.6e-6


def parse_link(text: str, *, what: str = "--link") -> Link:
    """`"25Gbit/s,5us"` (bandwidth, then optional latency; units bit/s or B/s with k/M/G/T, s/ms/us/ns) -> Link.
    Without a latency, NCCL's network hop (9.6 µs).

    Raises:
      ConfigError: if the text is not a bandwidth [,latency] with those units, or a value is not positive.
    """
    parts = [p.strip() for p in text.split(",")]
    m = re.fullmatch(r"(\d+(?:\.\d+)?(?:[eE]-?\d+)?)\s*([kKmMgGtT]?)(bit/s|B/s)", parts[0])
    if not m or len(parts) > 2:
        raise ConfigError(f"{what} {text!r}: expected BANDWIDTH[,LATENCY] such as 25Gbit/s,5us or 12GB/s,3us "
                          "(bit/s or B/s, with k, M, G or T)")
    rate = float(m.group(1)) * _PREFIX[m.group(2).lower()] * (0.125 if m.group(3) == "bit/s" else 1.0)
    alpha = NET_HOP_S
    if len(parts) == 2:
        t = re.fullmatch(r"(\d+(?:\.\d+)?(?:[eE]-?\d+)?)\s*(s|ms|us|µs|ns)", parts[1])
        if not t:
            raise ConfigError(f"{what} {text!r}: latency {parts[1]!r} is not a time such as 5us or 0.01ms")
        alpha = float(t.group(1)) * _TIMES[t.group(2)]
    if rate <= 0 or alpha < 0:
        raise ConfigError(f"{what} {text!r}: bandwidth must be > 0 and latency >= 0")
    return Link(alpha, 1.0 / rate)


def parse_node(text: str) -> tuple[int, Link]:
    """`"4xNVLink"`, `"8xPCIe"` or `"4x100GB/s,2us"` -> (GPUs per node, the intra-node link).

    Raises:
      ConfigError: if the text is not GxNAME or GxBANDWIDTH[,LATENCY] with G >= 1 and a known NAME.
    """
    m = re.fullmatch(r"(\d+)x(.+)", text.strip(), re.I)
    if not m or int(m.group(1)) < 1:
        raise ConfigError(f"--node {text!r}: expected GPUSxLINK such as 4xNVLink, 8xPCIe or 4x100GB/s,2us")
    name = m.group(2).strip().lower()
    link = NODE_LINKS.get(name) or parse_link(m.group(2), what="--node")
    return int(m.group(1)), link


def link_from_allreduce(path: str) -> Link:
    """The (α, β) fit of a `harness bench allreduce` allreduce.json (`harness.bench.allreduce.run`).

    Raises:
      ConfigError: if the file is unreadable, not an allreduce.json, or its run had one worker (no fit).
    """
    try:
        with open(path) as f:
            data = json.load(f)
        fit = data["fit"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--allreduce {path}: not a `harness bench allreduce` allreduce.json ({e})") from None
    if not fit:
        raise ConfigError(f"--allreduce {path}: run on {data.get('workers')} worker(s), no alpha/beta fit; run it "
                          "on >= 2 workers")
    return Link(float(fit["alpha_s"]), float(fit["beta_s_per_byte"]))


# --- all-reduce cost --------------------------------------------------------------------------------------------
def ring_seconds(nbytes: float, n: int, gpus_per_node: int, node: Link, net: Link) -> float:
    """Seconds of one ring all-reduce of `nbytes` over `n` ranks, `gpus_per_node` per node (module docstring):
    2(n−M)·α_node + 2(M−1)·α_net + 2(n−1)/n·S·β_slowest, M = ceil(n / G); 0 for one rank."""
    if n <= 1:
        return 0.0
    nodes = math.ceil(n / gpus_per_node)
    latency = 2 * (n - nodes) * node.alpha_s + 2 * (nodes - 1) * net.alpha_s
    beta = max(net.beta_s_per_byte if nodes > 1 else 0.0, node.beta_s_per_byte if n > nodes else 0.0)
    return latency + 2 * (n - 1) / n * nbytes * beta


def hierarchical_seconds(nbytes: float, n: int, gpus_per_node: int, node: Link, net: Link) -> float:
    """Seconds of one hierarchical all-reduce (reduce-scatter in the node, ring across M nodes, all-gather in the
    node; module docstring); the flat ring when everything is in one node or nodes hold one GPU."""
    g = min(gpus_per_node, n)
    nodes = math.ceil(n / g)
    if nodes == 1 or g == 1:
        return ring_seconds(nbytes, n, gpus_per_node, node, net)
    in_node = (g - 1) * node.alpha_s + (g - 1) / g * nbytes * node.beta_s_per_byte
    across = 2 * (nodes - 1) * net.alpha_s + 2 * (nodes - 1) / nodes * nbytes * net.beta_s_per_byte
    return 2 * in_node + across


def tree_seconds(nbytes: float, n: int, gpus_per_node: int, node: Link, net: Link) -> float:
    """Seconds of one NCCL tree all-reduce (module docstring): 2·[(G−1)·α_node + log2(M)·α_net] + 2·S·β/0.9 at
    the slowest link; the flat ring inside one node (NCCL's trees span nodes)."""
    g = min(gpus_per_node, n)
    nodes = math.ceil(n / g)
    if nodes == 1:
        return ring_seconds(nbytes, n, gpus_per_node, node, net)
    beta = max(net.beta_s_per_byte, node.beta_s_per_byte if g > 1 else 0.0)
    return 2 * ((g - 1) * node.alpha_s + math.log2(nodes) * net.alpha_s) + 2 * nbytes * beta / 0.9


ALGORITHM_SECONDS = {RING: ring_seconds, HIERARCHICAL: hierarchical_seconds, TREE: tree_seconds}


# --- the backends' reduction schedules --------------------------------------------------------------------------
def gradient_ready_times(tensors: int, backward_s: float, start_s: float) -> list[float]:
    """When each of `tensors` equal gradients is ready, in backward order: uniformly over the backward pass that
    starts at `start_s` and lasts `backward_s`; the last is ready at its end."""
    return [start_s + backward_s * (i + 1) / tensors for i in range(tensors)]


def horovod_buffers(sizes: Sequence[float], ready: Sequence[float], *, fusion_bytes: float, cycle_s: float,
                    cost) -> list[tuple[float, float, float]]:
    """Horovod's Tensor Fusion (docs/tensor-fusion.rst): every cycle the background loop takes the gradients ready
    by then, packs them in order into buffers of at most `fusion_bytes` (a bigger tensor goes alone; 0 disables
    fusion) and all-reduces the buffers one after another; the next cycle starts `cycle_s` after the last one
    or when its all-reduces are done, whichever is later.

    Args:
      sizes, ready: bytes and ready time (s) of each gradient, in backward order.
      cost: seconds of one all-reduce of a byte count.
    Returns:
      `[(start_s, end_s, bytes)]` per buffer, in order.
    """
    out, i, tick, free = [], 0, None, 0.0
    while i < len(sizes):
        tick = ready[i] if tick is None else max(tick + cycle_s, free)
        if tick < ready[i]:   # nothing ready yet: the loop wakes every cycle until something is
            tick += math.ceil((ready[i] - tick) / cycle_s - 1e-9) * cycle_s if cycle_s > 0 else ready[i] - tick
        batch = []
        while i < len(sizes) and ready[i] <= tick + 1e-12:
            batch.append(sizes[i])
            i += 1
        free = max(free, tick)
        for nbytes in _fuse(batch, fusion_bytes):
            end = free + cost(nbytes)
            out.append((free, end, nbytes))
            free = end
    return out


def _fuse(sizes: Sequence[float], limit: float) -> list[float]:
    """Sizes packed in order into buffers of at most `limit` bytes (each tensor alone when limit is 0)."""
    buffers, current = [], 0.0
    for s in sizes:
        if current and (limit <= 0 or current + s > limit):
            buffers.append(current)
            current = 0.0
        current += s
    if current:
        buffers.append(current)
    return buffers


def mwms_buffers(sizes: Sequence[float], ready: Sequence[float], *, bytes_per_pack: float,
                 cost) -> list[tuple[float, float, float]]:
    """tf.distribute MultiWorkerMirroredStrategy: `cross_device_utils.group_by_size` packs the gradients, reversed
    into backward order (`cross_device_ops.py`: "reverse the list before packing"), into packs of
    `bytes_per_pack` (a pack is closed once it reaches the size, so it may overshoot); 0 (the default) is one
    pack of every gradient, launched when the last gradient is ready (after backward). Each pack's all-reduce
    starts when its last gradient is ready and the previous pack is done. Returns `[(start_s, end_s, bytes)]`."""
    packs, current, last = [], 0.0, 0.0
    for s, t in zip(sizes, ready):
        current, last = current + s, t
        if bytes_per_pack > 0 and current >= bytes_per_pack:
            packs.append((current, last))
            current = 0.0
    if current:
        packs.append((current, last))
    out, free = [], 0.0
    for nbytes, t in packs:
        start = max(free, t)
        free = start + cost(nbytes)
        out.append((start, free, nbytes))
    return out


def straggler_seconds(sigma_s: float, n: int) -> float:
    """σ·sqrt(2 ln N): the bound on how much the slowest of N i.i.d. step times exceeds the mean (module
    docstring); 0 for one replica."""
    return sigma_s * math.sqrt(2 * math.log(n)) if n > 1 else 0.0


# --- inputs and the prediction ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Measurement:
    """One replica's step: `step_s` mean seconds (compute, no all-reduce), `jitter_s` their standard deviation,
    `per_replica_batch` examples per step."""

    step_s: float
    jitter_s: float
    per_replica_batch: int


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the model needs besides the measurement.

    Attributes:
      gradient_bytes: bytes all-reduced per step (float32 gradients: 4 x trainable parameters).
      tensors: trainable tensors (gradients) per step.
      gpus_per_node: replicas per node; node, net: the intra-node and network links.
      backend: "horovod" (Tensor Fusion during backward) or "tf" (MWMS packs).
      fusion_bytes, cycle_s: Horovod's HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME.
      bytes_per_pack: MWMS' CommunicationOptions(bytes_per_pack=...) (0: one pack after backward).
      algorithm: the all-reduce, one of ALLREDUCE_ALGORITHMS (ring, hierarchical, tree).
      fixed_s: per-step cost besides compute and link time, seconds.
      backward_share: share of the step that is the backward pass.
      ready_profile: measured `((lead, bytes), ...)` per gradient (`harness.bench.timeline`): each is ready
        lead x step seconds before the end of the step's compute (lead: a share of the step, in [0, 1)); the
        bytes are scaled to add up to `gradient_bytes` (so fp16 gradients halve them all). Empty: the even
        spread over the backward pass.
    """

    gradient_bytes: float
    tensors: int
    gpus_per_node: int
    node: Link
    net: Link
    backend: str = HOROVOD
    fusion_bytes: float = HOROVOD_FUSION_BYTES
    cycle_s: float = HOROVOD_CYCLE_S
    bytes_per_pack: float = 0.0
    algorithm: str = RING
    fixed_s: float = 0.0
    backward_share: float = BACKWARD_SHARE
    ready_profile: tuple = ()


@dataclasses.dataclass(frozen=True)
class Point:
    """The prediction at N replicas: seconds per step and its parts, examples/s, efficiency, the bottleneck."""

    n: int
    step_s: float
    compute_s: float
    comm_s: float       # all-reduce time in the step, hidden or not
    exposed_s: float    # the part after the backward pass
    fixed_s: float
    straggler_s: float
    examples_per_s: float
    efficiency: float
    bottleneck: str


def predict(m: Measurement, s: Setup, n: int) -> Point:
    """The step at `n` replicas (module docstring).

    Raises:
      ConfigError: if n < 1, tensors < 1, the step time is not positive, or the backend or algorithm is not
        one of BACKENDS / ALLREDUCE_ALGORITHMS.
    """
    if n < 1 or s.tensors < 1 or m.step_s <= 0:
        raise ConfigError(f"need n >= 1, tensors >= 1 and a positive step time; got {n}, {s.tensors}, {m.step_s}")
    if s.backend not in BACKENDS:
        raise ConfigError(f"backend {s.backend!r}: expected one of {', '.join(BACKENDS)}")
    if s.algorithm not in ALLREDUCE_ALGORITHMS:
        raise ConfigError(f"all-reduce {s.algorithm!r}: expected one of {', '.join(ALLREDUCE_ALGORITHMS)}")
    comm = _buffers(s, m.step_s, n) if n > 1 else []
    comm_s = sum(e - b for b, e, _ in comm)
    exposed = max(0.0, (comm[-1][1] if comm else 0.0) - m.step_s)
    fixed = s.fixed_s if n > 1 else 0.0
    strag = straggler_seconds(m.jitter_s, n)
    step = m.step_s + exposed + fixed + strag
    parts = {"compute": m.step_s, "all-reduce": exposed, "fixed": fixed, "stragglers": strag}
    overhead = {k: v for k, v in parts.items() if k != "compute"}
    worst = max(overhead, key=overhead.get)
    bottleneck = "compute" if overhead[worst] <= 0.02 * m.step_s else worst
    if bottleneck == "all-reduce":
        bottleneck += " (latency)" if _latency_share(s, n, comm) > 0.5 else " (bandwidth)"
    return Point(n, step, m.step_s, comm_s, exposed, fixed, strag, n * m.per_replica_batch / step,
                 m.step_s / step, bottleneck)


def _cost(s: Setup, n: int):
    f = ALGORITHM_SECONDS[s.algorithm]
    return lambda nbytes: f(nbytes, n, s.gpus_per_node, s.node, s.net)


def _buffers(s: Setup, step_s: float, n: int):
    if s.ready_profile:
        profile = sorted(s.ready_profile, key=lambda p: -p[0])   # backward order: the earliest ready first
        measured = sum(b for _, b in profile)
        ready = [step_s * (1.0 - min(max(lead, 0.0), 1.0)) for lead, _ in profile]
        sizes = [b * s.gradient_bytes / measured for _, b in profile]
    else:
        backward = s.backward_share * step_s
        ready = gradient_ready_times(s.tensors, backward, step_s - backward)
        sizes = [s.gradient_bytes / s.tensors] * s.tensors
    if s.backend == HOROVOD:
        return horovod_buffers(sizes, ready, fusion_bytes=s.fusion_bytes, cycle_s=s.cycle_s, cost=_cost(s, n))
    return mwms_buffers(sizes, ready, bytes_per_pack=s.bytes_per_pack, cost=_cost(s, n))


def _latency_share(s: Setup, n: int, comm) -> float:
    """Share of the all-reduce time that is α (the cost of zero bytes) rather than bytes."""
    total = sum(e - b for b, e, _ in comm)
    return len(comm) * _cost(s, n)(0.0) / total if total > 0 else 0.0


def fixed_from_node(m: Measurement, s: Setup, node_examples_per_s: float) -> float:
    """T_fixed from one full node's measured examples/s (all `gpus_per_node` replicas): the node's step time less
    compute and the exposed all-reduce the model gives at N = G; 0 when the node is not slower than that. The one
    free parameter of the model, measured on one machine (a `bench train` run on all of its GPUs).

    Raises:
      ConfigError: if the rate is not positive or the node has one GPU (no all-reduce to separate it from).
    """
    g = s.gpus_per_node
    if node_examples_per_s <= 0 or g < 2:
        raise ConfigError(f"a node measurement needs >= 2 GPUs per node and a positive rate; got {g}, "
                          f"{node_examples_per_s}")
    step = g * m.per_replica_batch / node_examples_per_s
    modelled = predict(m, dataclasses.replace(s, fixed_s=0.0), g).step_s
    return max(0.0, step - modelled)


def sweep(m: Measurement, s: Setup, max_n: int = 512) -> list[Point]:
    """`predict` at N = 1, 2, 4, ... up to `max_n` (powers of two, and `max_n` itself)."""
    ns = sorted({2 ** k for k in range(int(math.log2(max_n)) + 1)} | {max_n})
    return [predict(m, s, n) for n in ns]


def crossing(points: Sequence[Point], target: float = EFFICIENCY_TARGET) -> Optional[int]:
    """The first N of `points` whose efficiency is below `target`; None if none is."""
    return next((p.n for p in points if p.efficiency < target), None)


def what_if(m: Measurement, s: Setup, n: int) -> list[tuple[str, float]]:
    """The levers at `n` replicas and the efficiency each gives, one change at a time: `[(change, efficiency)]`."""
    batch2 = Measurement(m.step_s * 2, m.jitter_s * 2, m.per_replica_batch * 2)   # compute ~ linear in batch
    options = [("per-replica batch x2", predict(batch2, s, n).efficiency),
               ("fp16 gradients (all-reduce half the bytes)",
                predict(m, dataclasses.replace(s, gradient_bytes=s.gradient_bytes / 2), n).efficiency),
               *((f"{a} all-reduce", predict(m, dataclasses.replace(s, algorithm=a), n).efficiency)
                 for a in ALLREDUCE_ALGORITHMS if a != s.algorithm)]
    if s.backend == HOROVOD:
        for f in (s.fusion_bytes / 4, s.fusion_bytes * 4):
            options.append((f"fusion threshold {f / 2 ** 20:g} MiB",
                            predict(m, dataclasses.replace(s, fusion_bytes=f), n).efficiency))
    else:
        pack = 32 * 2 ** 20 if not s.bytes_per_pack else s.bytes_per_pack / 4
        options.append((f"bytes_per_pack {pack / 2 ** 20:g} MiB (all-reduce during backward)",
                        predict(m, dataclasses.replace(s, bytes_per_pack=pack), n).efficiency))
    return options


def measurement_from_report(path: str) -> tuple[Measurement, dict]:
    """The one-replica step of a `harness bench train` report.json: mean and standard deviation of the timed
    (non-warm-up) steps of rank 0 (`parts[0].steps[].step_s / call_steps`), the per-replica batch; and the
    report's `config.shapes`.

    Raises:
      ConfigError: if the file is unreadable, not a bench train report, ran more than one replica, or has fewer
        than 2 timed steps.
    """
    try:
        with open(path) as f:
            report = json.load(f)
        kind, summary, config = report["kind"], report["summary"], report["config"]
        steps = [st for st in report["parts"][0]["steps"] if not st["warmup"]]
        times = [st["step_s"] / st.get("call_steps", 1) for st in steps]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise ConfigError(f"--report {path}: not a `harness bench train` report.json ({e!r})") from None
    if not str(kind).startswith("bench-train"):
        raise ConfigError(f"--report {path}: kind {kind!r}, expected a `harness bench train` report")
    if summary.get("replicas_in_sync") != 1:
        raise ConfigError(f"--report {path} ran {summary.get('replicas_in_sync')} replicas; give a one-replica run")
    if len(times) < 2:
        raise ConfigError(f"--report {path}: {len(times)} timed step(s), need >= 2 for the step time's spread")
    batch = int(config["per_replica_batch_size"])
    mean = batch / float(summary["examples_per_s_per_replica"])
    return Measurement(mean, statistics.stdev(times), batch), config.get("shapes") or {}


def format_table(points: Sequence[Point], m: Measurement, s: Setup) -> str:
    """The table `harness bench scale` prints: one row per N, the 80% crossing, the levers at the largest N."""
    sched = (f"Horovod fusion {s.fusion_bytes / 2 ** 20:g} MiB, cycle {s.cycle_s * 1e3:g} ms" if s.backend == HOROVOD
             else f"tf MWMS bytes_per_pack {s.bytes_per_pack / 2 ** 20:g} MiB")
    sched += (", gradients ready as the timeline measured" if s.ready_profile
              else f", gradients ready evenly over the last {s.backward_share:.0%} of the step")
    lines = [f"scaling prediction: step {m.step_s * 1e3:.1f} ms ± {m.jitter_s * 1e3:.1f} ms, batch "
             f"{m.per_replica_batch}/replica, gradient {s.gradient_bytes / 1e6:.2f} MB in {s.tensors} tensors; "
             f"{s.gpus_per_node} GPU(s)/node at {s.node.bytes_per_s / 1e9:.3g} GB/s, network "
             f"{s.net.bytes_per_s * 8 / 1e9:.3g} Gbit/s, {s.net.alpha_s * 1e6:.3g} µs; {sched}"
             f", {s.algorithm} all-reduce",
             f"  {'N':>5} {'examples/s':>12} {'eff':>6} {'compute ms':>10} {'comm ms':>8} {'exposed ms':>10} "
             f"{'fixed ms':>8} {'straggler ms':>12}  bottleneck"]
    for p in points:
        lines.append(f"  {p.n:>5} {p.examples_per_s:>12,.1f} {p.efficiency:>6.1%} {p.compute_s * 1e3:>10.2f} "
                     f"{p.comm_s * 1e3:>8.2f} {p.exposed_s * 1e3:>10.2f} {p.fixed_s * 1e3:>8.2f} "
                     f"{p.straggler_s * 1e3:>12.2f}  {p.bottleneck}")
    cross = crossing(points)
    lines.append(f"efficiency falls below {EFFICIENCY_TARGET:.0%} at N = {cross}" if cross
                 else f"efficiency stays >= {EFFICIENCY_TARGET:.0%} up to N = {points[-1].n}")
    last = points[-1]
    lines.append(f"at N = {last.n} ({last.efficiency:.1%}, bottleneck {last.bottleneck}), one change at a time:")
    for change, eff in what_if(m, s, last.n):
        lines.append(f"  {change:<52} {eff:>6.1%} ({(eff - last.efficiency) * 100:+.1f} points)")
    return "\n".join(lines)


def plot(points: Sequence[Point], path: str) -> None:
    """PNG: efficiency vs N (log2 axis), and the step's parts per N as stacked bars (ms)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [p.n for p in points]
    x = range(len(ns))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(x, [p.efficiency * 100 for p in points], "o-")
    a.axhline(EFFICIENCY_TARGET * 100, color="grey", ls="--", lw=1)
    a.set(xticks=list(x), xticklabels=ns, xlabel="GPUs (N)", ylabel="scaling efficiency %", ylim=(0, 105),
          title="predicted efficiency")
    bottom = [0.0] * len(ns)
    for name, attr in (("compute", "compute_s"), ("exposed all-reduce", "exposed_s"), ("fixed", "fixed_s"),
                       ("stragglers", "straggler_s")):
        h = [getattr(p, attr) * 1e3 for p in points]
        b.bar(list(x), h, bottom=bottom, label=name)
        bottom = [u + v for u, v in zip(bottom, h)]
    b.set(xticks=list(x), xticklabels=ns, xlabel="GPUs (N)", ylabel="ms per step", title="step breakdown")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def model_gradients(shapes: dict) -> tuple[int, int]:
    """(gradient bytes, trainable tensors) of the built-in model for a report's `config.shapes` (builds it with
    TensorFlow: only called when --gradient-bytes/--tensors are not given).

    Raises:
      ConfigError: if the shapes are missing.
    """
    if not shapes or "kind" not in shapes:
        raise ConfigError("the report has no config.shapes; give --gradient-bytes and --tensors")
    from harness.train.model import parts

    model = parts.builtin_model(shapes["kind"], tuple(shapes["input_shape"]), shapes["num_classes"])
    weights = model.trainable_weights
    return sum(int(w.shape.num_elements()) * w.dtype.size for w in weights), len(weights)
