"""When each gradient is ready in a step, read from a Horovod timeline: the scaling model's measured overlap input.

Horovod writes a Chrome trace when HOROVOD_TIMELINE names a file (`horovodrun --timeline-filename`; Horovod's
docs/timeline.rst): one trace "process" per tensor, named by the tensor's op, and per step a NEGOTIATE_ALLREDUCE
span, then ALLREDUCE, whose end carries the tensor's dtype and shape. The NEGOTIATE_ALLREDUCE span begins in the
coordinator's first cycle after a rank submitted the tensor (with the response cache, a cache hit on any worker:
horovod/common/response_cache.cc), so a submission is seen to within one HOROVOD_CYCLE_TIME (1 ms by default).
The gradients of `hvd.DistributedGradientTape` and of Horovod's Keras `DistributedOptimizer` are reduced under
a `<name>_Allreduce` name scope; other all-reduces (a metric summed over ranks) are not gradients and are left out.

The profile is, per gradient, its lead: how many seconds before the step's last gradient it was submitted (the
median over steps), and its bytes; and the step period (the median time between two steps' last submissions).
The scaling model (`harness.bench.scale.Setup.ready_profile`) takes each lead as a share of that period and puts
gradient i at `step × (1 − share_i)` of the step it predicts, instead of spreading the gradient bytes evenly over
the backward pass: on this project's 2-core CPU bed the TensorFlow executor runs most weight-gradient ops
(Conv2DBackpropFilter) in a burst at the end of the backward pass (14-30% of a U-Net's gradient bytes within 1 ms
of the last with 2 processes on the 2 cores, 100% with 3 or 4), which even spreading hides.

A submission is recorded when Horovod's background loop takes it, which waits while that thread runs an
all-reduce itself (Gloo, MPI): record the timeline on a fast link (one host, or one node's GPUs), where the
all-reduces are short, as `benchmarks/cluster.py` does on loopback.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Sequence

from harness.errors import ConfigError

GRADIENT_SCOPE = "_Allreduce"   # hvd.DistributedGradientTape / DistributedOptimizer: tf.name_scope(name + "_Allreduce")
SKIP_STEPS = 2                  # the first steps negotiate every tensor in full (no response cache yet)
# Horovod's DataType names (horovod/common/message.cc DataType_Name) and their sizes in bytes
_DTYPE_BYTES = {"uint8": 1, "int8": 1, "bool": 1, "byte": 1, "uint16": 2, "int16": 2, "float16": 2, "bfloat16": 2,
                "int32": 4, "float32": 4, "int64": 8, "float64": 8}


@dataclasses.dataclass(frozen=True)
class GradientProfile:
    """Per gradient tensor, in the order the backward pass submits them (largest lead first).

    Attributes:
      names: the tensors' op names as the timeline gives them.
      leads_s: seconds before the step's last gradient that each was submitted (median over `steps`), >= 0.
      nbytes: bytes of each (dtype size x shape).
      steps: steps the medians are taken over.
      period_s: the step period: median seconds between two consecutive steps' last submissions.
      unfinished: gradient tensors submitted but never seen finishing an ALLREDUCE with a shape (left out).
    """

    names: tuple
    leads_s: tuple
    nbytes: tuple
    steps: int
    period_s: float
    unfinished: int = 0

    @property
    def gradient_bytes(self) -> int:
        return sum(self.nbytes)

    def pairs(self) -> tuple:
        """`((lead share of the step period, bytes), ...)` as `harness.bench.scale.Setup.ready_profile` takes it."""
        return tuple((lead / self.period_s, b) for lead, b in zip(self.leads_s, self.nbytes))

    def bytes_within(self, seconds: float) -> float:
        """Share of the gradient bytes submitted within `seconds` of the last gradient."""
        return sum(b for t, b in zip(self.leads_s, self.nbytes) if t <= seconds) / max(1, self.gradient_bytes)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number a timeline holds")


def load_events(path: str) -> list:
    """The trace events of a Horovod timeline file, read one by one; a file cut short by a killed process (no
    closing bracket, a half-written event) is read up to its last whole event.

    Raises:
      ConfigError: if the file cannot be read, is not UTF-8 text, or does not open a JSON array of objects.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--timeline {path}: {getattr(e, 'strerror', None) or e}") from None
    decoder = json.JSONDecoder(parse_constant=_refuse_constant)
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        raise ConfigError(f"--timeline {path}: not a Horovod timeline (a JSON array of trace events, as "
                          "HOROVOD_TIMELINE writes)")
    events, i = [], i + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return events
        try:
            event, i = decoder.raw_decode(text, i)
        except ValueError:
            if text.find("}", i) >= 0 and text.rstrip().endswith("]"):   # broken inside, not merely cut short
                raise ConfigError(f"--timeline {path}: event #{len(events)} is not JSON") from None
            return events
        if not isinstance(event, dict):
            raise ConfigError(f"--timeline {path}: event #{len(events)} is {type(event).__name__}, not a trace "
                              "event object")
        events.append(event)


def gradient_profile(path: str, *, skip_steps: int = SKIP_STEPS) -> GradientProfile:
    """The profile (module docstring) of the gradient all-reduces in the Horovod timeline at `path`.

    Steps are aligned by occurrence: the k-th NEGOTIATE_ALLREDUCE of every gradient tensor is step k; the first
    `skip_steps` are left out, and so is a last step that not every tensor reached.

    Raises:
      ConfigError: if the file is not a timeline, an event lacks what its kind holds (a number `ts`, an integer
        `pid`, a shape list, a known dtype), it names no gradient all-reduce (a run without DistributedGradientTape,
        or one rank), its gradients hold no bytes, it holds one step or fewer after the skipped ones, or its
        steps do not line up (tensors seen a different number of times, or a lead as long as the step period).
    """
    events = load_events(path)
    names, submits, nbytes, spans = {}, {}, {}, {}
    for k, e in enumerate(events):
        try:
            _read_event(e, names, submits, nbytes, spans)
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"--timeline {path}: event #{k} ({json.dumps(e)[:120]}): {err!r}") from None
    grads = [pid for pid in submits if GRADIENT_SCOPE in names.get(pid, "")]
    done = [pid for pid in grads if pid in nbytes]
    if not done:
        raise ConfigError(f"--timeline {path}: no gradient all-reduce (no tensor under a '{GRADIENT_SCOPE}' scope "
                          "whose ALLREDUCE ended with its dtype and shape): record it with HOROVOD_TIMELINE on >= 2 "
                          "ranks training with hvd.DistributedGradientTape or DistributedOptimizer")
    if not sum(nbytes[pid] for pid in done):
        raise ConfigError(f"--timeline {path}: the gradients hold 0 bytes")
    counts = sorted(len(submits[pid]) for pid in done)
    if counts[-1] - counts[0] > 1:
        raise ConfigError(f"--timeline {path}: the gradients were submitted {counts[0]} to {counts[-1]} times: their "
                          "steps do not line up (a timeline started mid-run, or a gradient skipped in some steps)")
    steps = counts[0]
    if steps <= skip_steps + 1:
        raise ConfigError(f"--timeline {path}: {steps} step(s) of gradient all-reduces, need more than "
                          f"{skip_steps + 1} (the first {skip_steps} negotiate in full)")
    lasts = [max(submits[pid][k] for pid in done) for k in range(skip_steps, steps)]
    leads = {pid: [last - submits[pid][k] for k, last in enumerate(lasts, skip_steps)] for pid in done}
    period = statistics.median(b - a for a, b in zip(lasts, lasts[1:]))
    order = sorted(done, key=lambda pid: (-statistics.median(leads[pid]), pid))
    lead_s = tuple(statistics.median(leads[pid]) for pid in order)
    if period <= 0 or lead_s[0] >= period:
        raise ConfigError(f"--timeline {path}: a gradient leads the step's last by {lead_s[0] * 1e3:.1f} ms, a step "
                          f"period lasts {period * 1e3:.1f} ms: the steps do not line up")
    return GradientProfile(names=tuple(names[pid] for pid in order), leads_s=lead_s,
                           nbytes=tuple(nbytes[pid] for pid in order), steps=len(lasts), period_s=period,
                           unfinished=len(grads) - len(done))


def _read_event(e: dict, names: dict, submits: dict, nbytes: dict, spans: dict) -> None:
    """Fold one trace event into names (pid -> tensor name), submits (pid -> NEGOTIATE_ALLREDUCE begins, s),
    nbytes (pid -> bytes) and spans (pid -> the open spans' names). Raises KeyError, TypeError or ValueError on
    an event that lacks what its kind holds."""
    ph = e.get("ph")
    if ph == "M" and e.get("name") == "process_name":
        if "name" in (e.get("args") or {}):
            names[_pid(e)] = str(e["args"]["name"])
        return
    if ph not in ("B", "E"):
        return
    pid = _pid(e)
    if ph == "B":
        spans.setdefault(pid, []).append(e.get("name"))
        if e.get("name") == "NEGOTIATE_ALLREDUCE":
            ts = float(e["ts"])
            if not math.isfinite(ts):
                raise ValueError(f"ts {e['ts']!r}")
            submits.setdefault(pid, []).append(ts / 1e6)
    elif spans.get(pid) and spans[pid].pop() == "ALLREDUCE" and "shape" in (e.get("args") or {}):
        args = e["args"]
        try:
            shape = json.loads(args["shape"]) if isinstance(args["shape"], str) else args["shape"]
        except ValueError:
            shape = None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"shape {args['shape']!r} is not a list of sizes")
        if args.get("dtype") not in _DTYPE_BYTES:
            raise ValueError(f"dtype {args.get('dtype')!r} is not one of Horovod's ({', '.join(_DTYPE_BYTES)})")
        nbytes[pid] = _DTYPE_BYTES[args["dtype"]] * math.prod(shape)


def _pid(e: dict) -> int:
    pid = e["pid"]
    if not isinstance(pid, int):
        raise TypeError(f"pid {pid!r} is not an integer")
    return pid


def describe(profile: GradientProfile, within_s: Sequence[float] = (1e-3, 5e-3)) -> str:
    """One line: tensors, bytes, steps, the backward span seen and the share of bytes near its end."""
    span = max(profile.leads_s) if profile.leads_s else 0.0
    near = ", ".join(f"{profile.bytes_within(t):.0%} within {t * 1e3:g} ms" for t in within_s)
    left = f"; {profile.unfinished} gradient(s) never finished an all-reduce, left out" if profile.unfinished else ""
    return (f"gradient profile: {len(profile.leads_s)} tensors, {profile.gradient_bytes:,} bytes, median of "
            f"{profile.steps} steps of {profile.period_s * 1e3:.1f} ms; first submitted {span * 1e3:.1f} ms before "
            f"the last; bytes submitted near the end: {near} (seen to within Horovod's cycle time){left}")
