"""`harness bench scale --calibrate`: the scaling model (`harness.bench.scale`) fitted to the runs a user measured,
then a forecast for larger N with an interval.

What a user can measure and the model cannot know from published specifications: how much of the all-reduce the
backward pass really hides (the gradients' ready times), what share of the network's line rate the all-reduce
achieves, and a per-step cost that is neither compute nor link time. Each comes from the runs that determine it:

- runs within one node (2 <= N <= G replicas) determine the **overlap** (`Setup.backward_share`: the share of the
  step over which gradients become ready): the node's own link (NVLink, PCIe) runs near its known rate, so what a
  node loses to the all-reduce says how much of it was hidden;
- runs across nodes (N > G) determine the **achieved bandwidth** (`Calibration.rate_share`: the share of the
  network links' line rate, on both β's of the network hop);
- one run more than those parameters adds the **fixed per-step cost** (`Setup.fixed_s`, for N > 1), the rest by
  least squares.
With across-node runs only, the bandwidth comes first, then the overlap. Parameters the runs cannot determine stay
at the model's defaults (overlap 2/3, line rate, no fixed cost), and the forecast says which. The links' per-hop
latency is never fitted: runs at a few sizes cannot tell it from bandwidth (both slow every all-reduce), yet it
grows with N (2(N−1) hops of the ring) where bandwidth does not, so it decides large-N forecasts. It stays at
NCCL's Simple-protocol figure, and the interval spans it down to its LL protocol's (0.14 of it).

The fit minimizes the squared relative error of the step time over the runs (a coarse grid, then a finer one
around its best; the fixed cost in closed form: the weighted mean of what is left). The interval (`forecast`): the
forecasts of every refit the runs allow: each run's rate moved to the ends of its spread (`Run.spread`, the half
range of repeated runs as a share of their mean), and each parameter the runs do not determine set across its
range (every combination of them) with the others refitted, kept where the runs are still met within their
spread; widened by the fit's relative RMS residual when the runs are more than the parameters; and holding at
least the forecast ± twice the model's own error out of sample, 2.0 points of efficiency per doubling of N beyond
the largest run (the published check's held-out points: EXTRAPOLATION_POINTS).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Optional, Sequence

from harness.bench import scale
from harness.errors import ConfigError

OVERLAP, BANDWIDTH, FIXED, LATENCY = "overlap", "bandwidth", "fixed", "latency"
_RATE_RANGE = (0.02, 1.0)       # achieved share of the line rate searched
_OVERLAP_RANGE = (0.2, 0.975)   # share of the step over which the gradients become ready
# The links' per-hop latency as a share of the model's (NCCL's Simple protocol, `scale.NODE_LINKS`, `NET_HOP_S`):
# NCCL picks its LL protocol for small messages, whose ring hop is 0.47 µs on NVLink against Simple's 3.4 µs
# (NVIDIA/nccl src/graph/tuning.cc, hwLat): 0.14 of it. Which protocol a run's buffers took is not measured.
_LATENCY_RANGE = (0.14, 1.0)
# The model's own error beyond the largest run it is calibrated on: the root mean square, in points of efficiency
# per doubling of N beyond that run, of what the published check's held-out points miss by, each series calibrated
# as a user would on its smallest points (`python benchmarks/published_scaling.py`: 7 points of 4 series, the line
# "extrapolation error", 2026-12-06). The interval holds the forecast ±EXTRAPOLATION_Z times it per doubling: a
# normal error's 95%. Seven points make it a coarse figure.
EXTRAPOLATION_POINTS = 2.0
EXTRAPOLATION_Z = 2.0


@dataclasses.dataclass(frozen=True)
class Run:
    """One measured run: `replicas` in sync, their `examples_per_s` together, and `spread`, the half range of
    repeated runs as a share of their mean (0.02: ±2%; 0 for a single run)."""

    replicas: int
    examples_per_s: float
    spread: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "Run":
        """`N=RATE`, `N=RATE±S%` (or `+-`), or `N=R1,R2,...` (repeated runs: their mean and half range).

        Raises:
          ConfigError: naming the text, if it is none of those or a number is not positive.
        """
        try:
            n, _, value = text.partition("=")
            value = value.replace("+-", "±")
            if "±" in value:
                rate, pct = value.split("±")
                runs = [float(rate)]
                spread = float(pct.rstrip("%")) / 100
            else:
                runs = [float(v) for v in value.split(",")]
                spread = (max(runs) - min(runs)) / 2 / (sum(runs) / len(runs))
            out = cls(int(n), sum(runs) / len(runs), spread)
        except ValueError:
            raise ConfigError(f"--measured {text!r}: expected REPLICAS=EXAMPLES_PER_S, REPLICAS=RATE±S% or "
                              "REPLICAS=R1,R2,... (repeated runs)") from None
        if out.replicas < 2 or out.examples_per_s <= 0 or not 0 <= out.spread < 1:
            raise ConfigError(f"--measured {text!r}: needs >= 2 replicas, a positive rate and a spread below 100%")
        return out


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The fitted model: `setup` (the overlap and fixed cost in it, the network links slowed to `rate_share`),
    `free` the parameters the runs determined (in the order of the module docstring), `residual` the relative
    RMS error of the step time over the runs when they are more than the parameters (else 0)."""

    setup: scale.Setup
    rate_share: float
    free: tuple[str, ...]
    residual: float
    misfit: float = 0.0     # the relative RMS error of the step time over the runs, whatever their number


def free_parameters(runs: Sequence[Run], gpus_per_node: int) -> tuple[str, ...]:
    """The parameters `runs` determine (module docstring): overlap from runs within a node, bandwidth from runs
    across nodes, then the fixed cost with one distinct run more; across-node runs alone give bandwidth, then
    overlap, then the fixed cost."""
    counts = sorted({r.replicas for r in runs})
    within = [n for n in counts if n <= gpus_per_node]
    across = [n for n in counts if n > gpus_per_node]
    free = ([OVERLAP] if within else []) + ([BANDWIDTH] if across else [])
    if not within and len(across) >= 2:
        free.append(OVERLAP)
    if len(counts) > len(free):
        free.append(FIXED)
    return tuple(free)


def _with(s: scale.Setup, rate: float, overlap: float, fixed: float, latency: float = 1.0) -> scale.Setup:
    """`s` with its network at `rate` of its line rate, both links' per-hop latency at `latency` of theirs, and the
    overlap and fixed cost given."""
    return dataclasses.replace(s, node=scale.Link(s.node.alpha_s * latency, s.node.beta_s_per_byte),
                               net=scale.Link(s.net.alpha_s * latency, s.net.beta_s_per_byte / rate),
                               backward_share=overlap, fixed_s=fixed)


def _grid(lo: float, hi: float, n: int, log: bool = False) -> list[float]:
    if n == 1:
        return [hi]
    if log:
        return [math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (n - 1)) for i in range(n)]
    return [lo + i * (hi - lo) / (n - 1) for i in range(n)]


def calibrate(m: scale.Measurement, s: scale.Setup, runs: Sequence[Run], held: Optional[dict] = None) -> Calibration:
    """Fit the free parameters of `runs` (module docstring) to their step times.

    Args:
      m: the one-replica step (`scale.measurement_from_report`); s: the setup at line rate.
      runs: measured runs of >= 2 replicas.
      held: values for parameters the runs do not determine ({OVERLAP: share, BANDWIDTH: share, FIXED: seconds,
        LATENCY: share of the links' per-hop latency}); default the model's (overlap `s.backward_share`, line
        rate, no fixed cost, the links' latency).
    Raises:
      ConfigError: if there is no run, or a run has fewer than 2 replicas.
    """
    if not runs or any(r.replicas < 2 for r in runs):
        raise ConfigError("calibration needs runs of 2 replicas or more (one node's GPUs, two nodes, ...)")
    free, held = free_parameters(runs, s.gpus_per_node), held or {}
    measured = [(r.replicas, r.replicas * m.per_replica_batch / r.examples_per_s) for r in runs]
    weights = [1.0 / t ** 2 for _, t in measured]
    latency = held.get(LATENCY, 1.0)

    def error(rate: float, overlap: float) -> tuple[float, float]:
        setup = _with(s, rate, overlap, 0.0, latency)
        left = [t - scale.predict(m, setup, n).step_s for n, t in measured]
        fixed = max(0.0, sum(w * d for w, d in zip(weights, left)) / sum(weights)) if FIXED in free else \
            held.get(FIXED, 0.0)
        return sum(w * (d - fixed) ** 2 for w, d in zip(weights, left)), fixed

    rates = _grid(*_RATE_RANGE, 25, log=True) if BANDWIDTH in free else [held.get(BANDWIDTH, 1.0)]
    overlaps = _grid(*_OVERLAP_RANGE, 16) if OVERLAP in free else [held.get(OVERLAP, s.backward_share)]
    best = min(((error(r, o), r, o) for r in rates for o in overlaps), key=lambda x: x[0][0])
    (_, _), rate, overlap = best
    # a finer grid around the coarse best: a rate step of the coarse grid's ratio, an overlap step of its width
    step_r = (rates[1] / rates[0]) if len(rates) > 1 else 1.0
    step_o = (overlaps[1] - overlaps[0]) if len(overlaps) > 1 else 0.0
    fine_r = [min(_RATE_RANGE[1], max(_RATE_RANGE[0], rate * step_r ** (k / 5))) for k in range(-5, 6)] \
        if BANDWIDTH in free else [rate]
    fine_o = [min(_OVERLAP_RANGE[1], max(_OVERLAP_RANGE[0], overlap + step_o * k / 5)) for k in range(-5, 6)] \
        if OVERLAP in free else [overlap]
    (err, fixed), rate, overlap = min(((error(r, o), r, o) for r in fine_r for o in fine_o), key=lambda x: x[0][0])
    misfit = math.sqrt(err / len(measured))
    residual = misfit if len(measured) > len(free) else 0.0
    return Calibration(_with(s, rate, overlap, fixed, latency), rate, free, residual, misfit)


@dataclasses.dataclass(frozen=True)
class Forecast:
    """The calibrated prediction at `n` replicas and its interval: efficiency and examples/s, low and high."""

    point: scale.Point
    efficiency_low: float
    efficiency_high: float
    examples_low: float
    examples_high: float


def forecast(m: scale.Measurement, s: scale.Setup, runs: Sequence[Run], ns: Sequence[int],
             calibration: Optional[Calibration] = None,
             extrapolation_points: float = EXTRAPOLATION_POINTS) -> list[Forecast]:
    """The calibrated forecast at each of `ns`, with its interval: every refit the runs allow, namely
    - each run's rate moved to the ends of its spread (every corner for up to 3 runs, else one run at a time);
    - each parameter the runs do not determine set across its range (overlap 20-97.5% of the step, bandwidth
      2-100% of line rate, a fixed cost from 0 to the most the runs' step times leave beyond one replica's
      compute, the links' per-hop latency 0.14-1 of NCCL's Simple protocol's: never determined, module
      docstring), every combination of them, the others refitted; a refit is kept when it still meets the runs
      within their spread (or 1%),
    widened by the fit's relative RMS residual when the runs are more than the parameters, and holding at least
    the forecast ± EXTRAPOLATION_Z x `extrapolation_points` per doubling of N beyond the largest run (the model's
    own error out of sample: EXTRAPOLATION_POINTS).

    Args:
      m, s, runs: as `calibrate` (`s` at line rate: the refits search from it). ns: replica counts.
      calibration: `calibrate(m, s, runs)` when already computed.
      extrapolation_points: the model's error per doubling of N beyond the runs, points of efficiency (RMS).

    Raises:
      ConfigError: as `calibrate`.
    """
    fit = calibration or calibrate(m, s, runs)
    moved = [r for r in runs if r.spread > 0]
    if len(moved) <= 3:
        corners = [tuple(signs) for signs in itertools.product((-1, 1), repeat=len(moved))]
    else:
        corners = [tuple(sign if j == i else 0 for j in range(len(moved))) for i in range(len(moved))
                   for sign in (-1, 1)]
    refits = [fit]
    for signs in corners if moved else []:
        shifted = {id(r): dataclasses.replace(r, examples_per_s=r.examples_per_s * (1 + sign * r.spread))
                   for r, sign in zip(moved, signs)}
        refits.append(calibrate(m, s, [shifted.get(id(r), r) for r in runs]))
    tolerance = max([r.spread for r in runs] + [0.01])
    most_fixed = max(0.0, max(r.replicas * m.per_replica_batch / r.examples_per_s - m.step_s for r in runs))
    open_ = [name for name in (OVERLAP, BANDWIDTH, FIXED, LATENCY) if name not in fit.free]
    k = 5 if len(open_) == 1 else 3     # jointly: each one's ends and middle (the forecast is monotone in each)
    ranges = {OVERLAP: _grid(*_OVERLAP_RANGE, k), BANDWIDTH: _grid(*_RATE_RANGE, k, log=True),
              FIXED: _grid(0.0, most_fixed, k), LATENCY: _grid(*_LATENCY_RANGE, k)}
    for values in itertools.product(*(ranges[name] for name in open_)):
        other = calibrate(m, s, runs, held=dict(zip(open_, values)))
        if other.misfit <= tolerance:
            refits.append(other)
    out = []
    for n in ns:
        point = scale.predict(m, fit.setup, n)
        effs = [scale.predict(m, f.setup, n).efficiency for f in refits]
        band = EXTRAPOLATION_Z * extrapolation_points / 100 * doublings(n, runs)
        lo = max(0.0, min(min(effs) * (1 - fit.residual), point.efficiency - band))
        hi = min(1.0, max(max(effs) * (1 + fit.residual), point.efficiency + band))
        per = n * m.per_replica_batch / m.step_s
        out.append(Forecast(point, lo, hi, lo * per, hi * per))
    return out


def doublings(n: int, runs: Sequence[Run]) -> float:
    """How many doublings of N `n` lies beyond the largest of `runs` (0 at or below it): what the model's own
    error (EXTRAPOLATION_POINTS) is counted per."""
    return max(0.0, math.log2(n / max(r.replicas for r in runs)))


def describe(fit: Calibration) -> str:
    """One line: the parameters fitted and their values, and those left at the model's defaults."""
    values = {OVERLAP: f"overlap {fit.setup.backward_share:.0%} of the step",
              BANDWIDTH: f"network at {fit.rate_share:.0%} of line rate",
              FIXED: f"fixed {fit.setup.fixed_s * 1e3:.1f} ms per step"}
    kept = [k for k in (OVERLAP, BANDWIDTH, FIXED, LATENCY) if k not in fit.free]
    return ("calibrated: " + ", ".join(values[k] for k in fit.free) +
            (f"; residual {fit.residual:.1%} of the step" if fit.residual else "") +
            (f"; not determined by these runs, at the model's default: {', '.join(kept)}" if kept else ""))


def format_forecast(forecasts: Sequence[Forecast], runs: Sequence[Run]) -> str:
    """The calibrated forecast table: N, examples/s with its interval, efficiency with its interval, and the
    measured runs beside their fitted values."""
    measured = {r.replicas: r for r in runs}
    lines = [f"  {'N':>5} {'examples/s':>12} {'interval':>23} {'eff':>6} {'interval':>15}  measured"]
    for f in forecasts:
        p, r = f.point, measured.get(f.point.n)
        seen = f"{r.examples_per_s:,.1f} ±{r.spread:.0%}" if r else ""
        lines.append(f"  {p.n:>5} {p.examples_per_s:>12,.1f} {f.examples_low:>11,.1f}-{f.examples_high:<11,.1f} "
                     f"{p.efficiency:>6.1%} {f.efficiency_low:>6.1%}-{f.efficiency_high:<7.1%}  {seen}".rstrip())
    return "\n".join(lines)
