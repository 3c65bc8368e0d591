"""`harness bench allreduce`: the all-reduce that training runs, timed over a sweep of sizes, and the link's α and β.

Each size is reduced the way a training step reduces its gradients: under tf.distribute (MultiWorkerMirroredStrategy
from TF_CONFIG, or one worker) the gradients of a list of `tensors` float32 variables are summed with
`ReplicaContext.all_reduce(SUM, grads)`, the batch all-reduce Keras' optimizers call through
`extended.batch_reduce_to`, with the strategy's `CommunicationOptions`; under Horovod the same gradients come from
`hvd.DistributedGradientTape` (fused into buffers of HOROVOD_FUSION_THRESHOLD bytes). `rounds` all-reduces run
chained (each one's input depends on the last one's output) inside one `tf.function`, so the figure holds no
Python dispatch; the median over `repeats` calls is kept.

The fit is the ring all-reduce model (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009; Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in
MPICH", IJHPCA 2005): t(S) = 2(N-1)·α + 2(N-1)/N · S · β on N workers, S bytes, α seconds of latency per message
and β seconds per byte of the link. A least-squares line t = a + b·S gives α = a / (2(N-1)) and
β = b·N / (2(N-1)); its R² and the residual of each size are reported. On one worker nothing crosses a link: the
times are the local reduction's, and α, β are not defined (None).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Optional, Sequence

import numpy as np

DEFAULT_SIZES = tuple(4 ** k * 1024 for k in range(0, 8))   # 1 KiB ... 16 MiB


@dataclasses.dataclass(frozen=True)
class Fit:
    """The ring model fitted to (bytes, seconds): `alpha_s` (s per message), `beta_s_per_byte` (s/byte; 1/β is the
    link's bytes/s), `r2` of the line t = a + b·S, `residuals_s` per size (measured - fitted, seconds)."""

    alpha_s: float
    beta_s_per_byte: float
    r2: float
    residuals_s: tuple[float, ...]

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")


def fit_ring(sizes_bytes: Sequence[float], seconds: Sequence[float], workers: int) -> Optional[Fit]:
    """Fit t(S) = 2(N-1)·α + 2(N-1)/N·S·β by least squares (module docstring); None on one worker.

    Raises:
      ValueError: with fewer than 2 distinct sizes, or sizes and seconds of different lengths.
    """
    s, t = np.asarray(sizes_bytes, np.float64), np.asarray(seconds, np.float64)
    if s.shape != t.shape or len(set(s.tolist())) < 2:
        raise ValueError(f"need >= 2 distinct sizes with one time each, got {s.tolist()} and {t.tolist()}")
    if workers < 2:
        return None
    b, a = np.polyfit(s, t, 1)
    fitted = a + b * s
    total = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - float(((t - fitted) ** 2).sum()) / total if total > 0 else 1.0
    hops = 2 * (workers - 1)
    return Fit(alpha_s=float(a) / hops, beta_s_per_byte=float(b) * workers / hops, r2=r2,
               residuals_s=tuple(float(r) for r in t - fitted))


def _reduce_fn(backend, sizes_elements: Sequence[int], rounds: int):
    """A `tf.function` running `rounds` chained gradient all-reduces of variables of `sizes_elements` float32
    elements, as the backend's training step reduces them; returns one element of the last reduced gradient
    (each replica's gradient is 1: the sum over N replicas under tf.distribute is N, Horovod's average is 1)."""
    import tensorflow as tf
    from harness.tracing import graph_function

    strategy = backend.strategy
    with strategy.scope():
        variables = [tf.Variable(tf.zeros([n], tf.float32), name=f"g{i}") for i, n in enumerate(sizes_elements)]

    def one(scale):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v) * scale for v in variables])
        grads = backend.gradient_tape(tape).gradient(loss, variables)
        if backend.ranks_summed == 1:   # tf.distribute: the optimizer's batch all-reduce
            grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        return grads[0][0]

    def round_(i, scale, out):
        out = strategy.experimental_local_results(strategy.run(one, args=(scale,)))[0]
        return i + 1, out * 0.0 + 1.0, out   # the next round waits for this one's sum

    @graph_function
    def run():   # Keras' steps_per_execution pattern: strategy.run inside a loop of `rounds`
        return tf.while_loop(lambda i, scale, out: i < rounds, round_,
                             (tf.constant(0), tf.constant(1.0), tf.constant(0.0)))[2]

    return run


def measure(backend, sizes_bytes: Sequence[int] = DEFAULT_SIZES, *, tensors: int = 1, rounds: int = 20,
            repeats: int = 5) -> list[dict]:
    """Seconds per all-reduce of each size: `[{"bytes", "tensors", "seconds" (median), "spread" ((max - min) /
    median over repeats), "algbw_bytes_per_s" (bytes / seconds), "busbw_bytes_per_s" (NCCL-tests' bus bandwidth:
    algbw x 2(N-1)/N)}]`. Every worker must call it with the same arguments (a collective per round).

    Raises:
      ValueError: if a size is smaller than 4 bytes per tensor, or `rounds`/`repeats` < 1.
      RuntimeError: if a reduced gradient is not what every replica's 1 sums (or averages) to: a wrong
        all-reduce is not timed.
    """
    if rounds < 1 or repeats < 1:
        raise ValueError(f"rounds and repeats must be >= 1, got {rounds}, {repeats}")
    workers = backend.context.num_workers * backend.context.replicas_per_worker
    rows = []
    for nbytes in sizes_bytes:
        per_tensor = nbytes // 4 // tensors
        if per_tensor < 1:
            raise ValueError(f"{nbytes} bytes over {tensors} tensors is under one float32 element each")
        fn = _reduce_fn(backend, [per_tensor] * tensors, rounds)
        value = float(fn())   # traces and warms up
        expected = 1.0 if backend.ranks_summed > 1 else float(workers)
        if value != expected:
            raise RuntimeError(f"all-reduce of {nbytes} bytes gave {value}, expected {expected} over {workers} "
                               "replicas")
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) / rounds)
        seconds = statistics.median(times)
        moved = per_tensor * tensors * 4
        rows.append({"bytes": moved, "tensors": tensors, "seconds": seconds,
                     "spread": (max(times) - min(times)) / seconds,
                     "algbw_bytes_per_s": moved / seconds,
                     "busbw_bytes_per_s": moved / seconds * (2 * (workers - 1) / workers if workers > 1 else 1)})
    return rows


def format_table(rows: list[dict], fit: Optional[Fit], workers: int, backend_name: str) -> str:
    """The table `harness bench allreduce` prints: one line per size, then the fit."""
    lines = [f"all-reduce over {workers} worker(s), {backend_name}: seconds per reduce (median), bus bandwidth",
             f"  {'bytes':>10} {'tensors':>7} {'µs':>10} {'spread':>7} {'busbw MB/s':>11}"
             + (f" {'residual µs':>12}" if fit else "")]
    for i, r in enumerate(rows):
        lines.append(f"  {r['bytes']:>10,} {r['tensors']:>7} {r['seconds'] * 1e6:>10.1f} {r['spread']:>6.0%} "
                     f"{r['busbw_bytes_per_s'] / 1e6:>11.1f}" + (f" {fit.residuals_s[i] * 1e6:>12.1f}" if fit else ""))
    if fit:
        lines.append(f"  ring fit: alpha = {fit.alpha_s * 1e6:.1f} µs, beta = {fit.beta_s_per_byte * 1e9:.3f} ns/byte "
                     f"({fit.bandwidth_bytes_per_s * 8 / 1e9:.2f} Gbit/s), R² = {fit.r2:.3f}")
    else:
        lines.append("  one worker: nothing crosses a link, no alpha/beta fit")
    return "\n".join(lines)


def run(*, backend_name: str = "tf", sizes_bytes: Sequence[int] = DEFAULT_SIZES, tensors: int = 1, rounds: int = 20,
        repeats: int = 5, output: Optional[str] = None, say=print) -> dict:
    """Build the backend (`harness.distribute.backend.make_backend`: TF_CONFIG or the launcher's ranks), time
    every size, fit the ring model; the chief prints the table and writes `output/allreduce.json`.

    Returns `{"workers", "backend", "rows" (see `measure`), "fit": {"alpha_s", "beta_s_per_byte", "r2",
    "residuals_s"} or None}` on every worker."""
    import json
    import os

    from harness.distribute.backend import make_backend

    backend = make_backend(backend_name)
    context = backend.context
    rows = measure(backend, sizes_bytes, tensors=tensors, rounds=rounds, repeats=repeats)
    workers = context.num_workers * context.replicas_per_worker
    fit = fit_ring([r["bytes"] for r in rows], [r["seconds"] for r in rows], workers) if len(rows) > 1 else None
    report = {"workers": workers, "backend": backend_name, "rows": rows,
              "fit": dataclasses.asdict(fit) if fit else None}
    if context.is_chief:
        say(format_table(rows, fit, workers, backend_name))
        if output:
            os.makedirs(output, exist_ok=True)
            with open(os.path.join(output, "allreduce.json"), "w") as f:
                json.dump(report, f, indent=1)
    return report
