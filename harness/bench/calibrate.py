"""`harness bench scale --calibrate`: the scaling model (`harness.bench.scale`) fitted to the runs a user measured,
then a forecast for larger N with an interval.

What a user can measure and the model cannot know from published specifications: how much of the all-reduce the
backward pass really hides (the gradients' ready times), what share of the network's line rate the all-reduce
achieves, and a per-step cost that is neither compute nor link time. Each comes from the runs that determine it:

- runs within one node (2 <= N <= G replicas) at two sizes or more determine the **overlap**
  (`Setup.backward_share`: the share of the step over which gradients become ready): the node's own link (NVLink,
  PCIe) runs near its known rate, so what a node loses to the all-reduce says how much of it was hidden;
- one node alone (runs at one size N <= G: what most users have measured) determines one parameter, the one its
  loss points to (issue 67). A loss beyond what the node's all-reduce at its line rate can cost (hiding none of it)
  is a loss the link cannot explain (input, PCIe contention, host work: the in-node losses the link's rate leaves
  out) and goes to the **fixed per-step cost** (`Setup.fixed_s`, closed form: T_run - T_model at the default
  overlap), which every N > 1 pays alike, so the forecast does not rise across N; a run faster than the model at its
  default overlap fits the **overlap** (more of the all-reduce hidden). The overlap is not fitted from a loss of one
  node: an in-node all-reduce of a few ms cannot tell 20% from 97% of the step, and the overlap it fits carries
  over to the network's all-reduce, 5-10x longer (issue 67: horovod#779's one node, 95.7%, fitted 51% overlap and
  forecast 71.5% at 16 GPUs where 91.9% was published; aws-samples#2's, 84.5%, could not be reproduced at all);
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
the largest run (the published check's held-out points: EXTRAPOLATION_POINTS). Calibrated on one node alone, the
interval is the runs' spread carried through the fit plus that error only (from one node to two: the forecast ±
4 points and the spread), and what the node cannot determine (the network's achieved bandwidth, the overlap, the
per-hop latency) is printed beside it as the range it would span and why (`Forecast.open_low`, `open_high`,
`format_forecast`): a range of 2-100% says nothing a user can plan with, and it is a statement about the network
the user has not measured, which the line's figures (`--link`) stand for.
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
    note: str = ""          # why the parameter fitted is that one (one node alone), in numbers


def free_parameters(runs: Sequence[Run], gpus_per_node: int) -> tuple[str, ...]:
    """The parameters `runs` determine (module docstring): overlap from runs within a node, bandwidth from runs
    across nodes, then the fixed cost with one distinct run more; across-node runs alone give bandwidth, then
    overlap, then the fixed cost; one node alone (one size, N <= G) the fixed cost (`calibrate` fits the overlap
    instead when the run is faster than the model)."""
    counts = sorted({r.replicas for r in runs})
    within = [n for n in counts if n <= gpus_per_node]
    across = [n for n in counts if n > gpus_per_node]
    if len(within) == 1 and not across:     # one node alone: its loss beyond the link (`calibrate` may turn it)
        return (FIXED,)
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
    fit = _fit(m, s, runs, free, held)
    if free == (FIXED,) and fit.setup.fixed_s == 0.0 and fit.misfit > _tolerance(runs):
        fit = _fit(m, s, runs, (OVERLAP,), held)    # one node faster than the model: more of it hidden
    if free == (FIXED,) and not held:
        fit = dataclasses.replace(fit, note=_one_node_note(m, s, runs, fit))
    return fit


def _tolerance(runs: Sequence[Run]) -> float:
    """How closely a refit must meet the runs: their largest spread, or 1%."""
    return max([r.spread for r in runs] + [0.01])


def _fit(m: scale.Measurement, s: scale.Setup, runs: Sequence[Run], free: tuple, held: dict) -> Calibration:
    """Least squares of the relative step-time error over `runs` (module docstring) for the parameters `free`."""
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


def _one_node_note(m: scale.Measurement, s: scale.Setup, runs: Sequence[Run], fit: Calibration) -> str:
    """Why one node's run fitted what it did (module docstring), in numbers: the node's all-reduce over its link at
    line rate, its exposed part at the default overlap, and what the run lost."""
    n = runs[0].replicas
    base = scale.predict(m, s, n)
    lost_ms = (sum(r.replicas * m.per_replica_batch / r.examples_per_s for r in runs) / len(runs) - m.step_s) * 1e3
    head = (f"one node ({n} GPUs) lost {lost_ms:.1f} ms of a {m.step_s * 1e3:.1f} ms step; its all-reduce over the "
            f"node's link at line rate takes {base.comm_s * 1e3:.1f} ms, {base.exposed_s * 1e3:.1f} ms of it exposed "
            f"at the default overlap ({s.backward_share:.0%})")
    if FIXED in fit.free:
        return head + (f": the {fit.setup.fixed_s * 1e3:.1f} ms the link cannot explain are a fixed cost per step "
                       "(every N > 1 pays it)" if fit.setup.fixed_s > 0 else ": the link explains it, no fixed cost")
    return head + f": the run is faster than that, so more of it is hidden (overlap {fit.setup.backward_share:.0%})"


def reproduction(m: scale.Measurement, fit: Calibration, runs: Sequence[Run]) -> list[str]:
    """A line for each run the calibrated model does not reproduce within the run's spread (or 1%), with why in
    numbers: the measured and the fitted rate, the miss against the spread, and what the fit had to work with (the
    parameters fitted and the step time the model cannot go below or above); empty when every run is met."""
    out = []
    for r in runs:
        p = scale.predict(m, fit.setup, r.replicas)
        miss = p.examples_per_s / r.examples_per_s - 1
        if abs(miss) <= max(r.spread, 0.01) + 1e-9:
            continue
        fastest = m.step_s + p.straggler_s
        why = (f"{r.replicas} GPUs measured {r.examples_per_s:,.1f} examples/s ±{r.spread:.0%}, the calibrated model "
               f"{p.examples_per_s:,.1f} ({miss:+.1%}): ")
        if r.replicas * m.per_replica_batch / r.examples_per_s < fastest:
            why += (f"the run's step {r.replicas * m.per_replica_batch / r.examples_per_s * 1e3:.1f} ms is shorter "
                    f"than one replica's compute {m.step_s * 1e3:.1f} ms (a one-replica report of another step?)")
        elif len({q.replicas for q in runs}) > len(fit.free):
            why += (f"{len({q.replicas for q in runs})} sizes, {len(fit.free)} parameters "
                    f"({', '.join(fit.free)}): the fit's residual is {fit.misfit:.1%} of the step")
        else:
            why += (f"the parameters fitted ({', '.join(fit.free)}) reach their range's end "
                    f"(overlap {fit.setup.backward_share:.0%}, network {fit.rate_share:.0%} of line rate, fixed "
                    f"{fit.setup.fixed_s * 1e3:.1f} ms)")
        out.append("not reproduced: " + why)
    return out


@dataclasses.dataclass(frozen=True)
class Forecast:
    """The calibrated prediction at `n` replicas and its interval: efficiency and examples/s, low and high."""

    point: scale.Point
    efficiency_low: float
    efficiency_high: float
    examples_low: float
    examples_high: float
    # calibrated on one node alone: what the parameters the node cannot determine would span beyond the interval
    # (the interval's own rule, with their refits); None otherwise (the interval holds them)
    open_low: Optional[float] = None
    open_high: Optional[float] = None


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
    own error out of sample: EXTRAPOLATION_POINTS). Calibrated on one node alone (`one_node_only`), the interval
    leaves out the second item, which `Forecast.open_low`/`open_high` carry and `format_forecast` prints with why
    (module docstring): from one node to two it is the model's error and the run's spread.

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
    tolerance = _tolerance(runs)
    most_fixed = max(0.0, max(r.replicas * m.per_replica_batch / r.examples_per_s - m.step_s for r in runs))
    open_ = [name for name in (OVERLAP, BANDWIDTH, FIXED, LATENCY) if name not in fit.free]
    k = 5 if len(open_) == 1 else 3     # jointly: each one's ends and middle (the forecast is monotone in each)
    ranges = {OVERLAP: _grid(*_OVERLAP_RANGE, k), BANDWIDTH: _grid(*_RATE_RANGE, k, log=True),
              FIXED: _grid(0.0, most_fixed, k), LATENCY: _grid(*_LATENCY_RANGE, k)}
    spread_refits, open_refits = list(refits), []
    for values in itertools.product(*(ranges[name] for name in open_)):
        other = calibrate(m, s, runs, held=dict(zip(open_, values)))
        if other.misfit <= tolerance:
            open_refits.append(other)
    one_node = one_node_only(runs, s.gpus_per_node)
    out = []
    for n in ns:
        point = scale.predict(m, fit.setup, n)
        band = EXTRAPOLATION_Z * extrapolation_points / 100 * doublings(n, runs)

        def span(fits):
            effs = [scale.predict(m, f.setup, n).efficiency for f in fits]
            return (max(0.0, min(min(effs) * (1 - fit.residual), point.efficiency - band)),
                    min(1.0, max(max(effs) * (1 + fit.residual), point.efficiency + band)))
        per = n * m.per_replica_batch / m.step_s
        if one_node:    # the spread and the model's error only; what one node leaves open printed beside it
            (lo, hi), (olo, ohi) = span(spread_refits), span(spread_refits + open_refits)
            out.append(Forecast(point, lo, hi, lo * per, hi * per, min(lo, olo), max(hi, ohi)))
        else:
            lo, hi = span(spread_refits + open_refits)
            out.append(Forecast(point, lo, hi, lo * per, hi * per))
    return out


def one_node_only(runs: Sequence[Run], gpus_per_node: int) -> bool:
    """Whether every run is within one node (N <= G): the calibration the interval's one-node rule applies to."""
    return all(r.replicas <= gpus_per_node for r in runs)


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
    measured runs beside their fitted values; calibrated on one node alone, a line after it for what the node
    leaves open (`Forecast.open_low`, `open_high`) where it spans more than the interval, and why."""
    measured = {r.replicas: r for r in runs}
    lines = [f"  {'N':>5} {'examples/s':>12} {'interval':>23} {'eff':>6} {'interval':>15}  measured"]
    for f in forecasts:
        p, r = f.point, measured.get(f.point.n)
        seen = f"{r.examples_per_s:,.1f} ±{r.spread:.0%}" if r else ""
        lines.append(f"  {p.n:>5} {p.examples_per_s:>12,.1f} {f.examples_low:>11,.1f}-{f.examples_high:<11,.1f} "
                     f"{p.efficiency:>6.1%} {f.efficiency_low:>6.1%}-{f.efficiency_high:<7.1%}  {seen}".rstrip())
    lines += open_lines(forecasts, runs)
    return "\n".join(lines)


def open_lines(forecasts: Sequence[Forecast], runs: Sequence[Run]) -> list[str]:
    """Calibrated on one node alone: why the interval beyond it is the runs' spread and the model's error only,
    and what the network's achieved bandwidth, the overlap and the per-hop latency (which a node's runs do not
    reach) would span at the first N beyond the runs and at the last, where that is wider than the interval."""
    beyond = [f for f in forecasts if f.open_low is not None and f.point.n > max(r.replicas for r in runs)
              and (f.open_low < f.efficiency_low - 5e-4 or f.open_high > f.efficiency_high + 5e-4)]
    if not beyond:
        return []
    shown = [beyond[0]] + ([beyond[-1]] if len(beyond) > 1 else [])
    top = max(r.replicas for r in runs)
    return [f"  beyond {top} GPUs the interval is the runs' spread and the model's error out of sample "
            f"(±{EXTRAPOLATION_Z:g} x {EXTRAPOLATION_POINTS:g} points per doubling): one node's runs do not reach "
            "the network, whose achieved bandwidth, the overlap behind it and the per-hop latency they leave at "
            "the model's defaults (--link at line rate); across their ranges the forecast spans "
            + ", ".join(f"{f.open_low:.1%}-{f.open_high:.1%} at N = {f.point.n}" for f in shown)
            + f"; a run on two nodes (--measured {2 * top}=RATE) determines them"]
