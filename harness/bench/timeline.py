"""When each gradient is ready in a step, read from a Horovod timeline: the scaling model's measured overlap input.

Horovod writes a Chrome trace when HOROVOD_TIMELINE names a file (`horovodrun --timeline-filename`; Horovod's
docs/timeline.rst): one trace "process" per tensor, named by the tensor's op, and per step a NEGOTIATE_ALLREDUCE
span that begins when rank 0 submits the tensor, then ALLREDUCE, whose end carries the tensor's dtype and shape.
The gradients of `hvd.DistributedGradientTape` and of Horovod's Keras `DistributedOptimizer` are reduced under
a `<name>_Allreduce` name scope; other all-reduces (a metric summed over ranks) are not gradients and are left out.

The profile is, per gradient, its lead: how many seconds before the step's last gradient it was submitted (the
median over steps), and its bytes. The scaling model (`harness.bench.scale.Setup.ready_profile`) puts gradient i
at `step − lead_i` instead of spreading the gradient bytes evenly over the backward pass: on this project's
2-core CPU bed the TensorFlow executor runs most weight-gradient ops (Conv2DBackpropFilter) in a burst at the end
of the backward pass, 70-85% of a U-Net's gradient bytes within 1 ms of the last, which even spreading hides.

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
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int32": 4,
                "int64": 8}


@dataclasses.dataclass(frozen=True)
class GradientProfile:
    """Per gradient tensor, in the order the backward pass submits them (largest lead first).

    Attributes:
      names: the tensors' op names as the timeline gives them.
      leads_s: seconds before the step's last gradient that each was submitted (median over `steps`), >= 0.
      nbytes: bytes of each (dtype size x shape).
      steps: steps the medians are taken over.
    """

    names: tuple
    leads_s: tuple
    nbytes: tuple
    steps: int

    @property
    def gradient_bytes(self) -> int:
        return sum(self.nbytes)

    def pairs(self) -> tuple:
        """`((lead_s, bytes), ...)` as `harness.bench.scale.Setup.ready_profile` takes it."""
        return tuple(zip(self.leads_s, self.nbytes))

    def bytes_within(self, seconds: float) -> float:
        """Share of the gradient bytes submitted within `seconds` of the last gradient."""
        return sum(b for t, b in zip(self.leads_s, self.nbytes) if t <= seconds) / max(1, self.gradient_bytes)


def load_events(path: str) -> list:
    """The trace events of a Horovod timeline file; one cut short by a killed process (no closing bracket, a
    trailing comma or a half-written event) is read up to its last whole event.

    Raises:
      ConfigError: if the file cannot be read or holds no JSON array of events.
    """
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError as e:
        raise ConfigError(f"--timeline {path}: {e.strerror or e}") from None
    for candidate in (text, text.rstrip(",") + "]", text[:text.rfind("}") + 1] + "]"):
        try:
            events = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(events, list):
            return events
    raise ConfigError(f"--timeline {path}: not a Horovod timeline (a JSON array of trace events, as HOROVOD_TIMELINE "
                      "writes)")


def gradient_profile(path: str, *, skip_steps: int = SKIP_STEPS) -> GradientProfile:
    """The profile (module docstring) of the gradient all-reduces in the Horovod timeline at `path`.

    Steps are aligned by occurrence: the k-th NEGOTIATE_ALLREDUCE of every gradient tensor is step k; the first
    `skip_steps` are left out, and so is a last step that not every tensor reached.

    Raises:
      ConfigError: if the file is not a timeline, names no gradient all-reduce (a run without
        DistributedGradientTape, or one rank), or holds fewer than one step after the skipped ones.
    """
    events = load_events(path)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}
    grads = {pid for pid, name in names.items() if GRADIENT_SCOPE in name}
    submits = {pid: [] for pid in grads}
    nbytes, open_spans = {}, {pid: [] for pid in grads}
    for e in events:
        pid = e.get("pid")
        if pid not in grads:
            continue
        if e.get("ph") == "B":
            open_spans[pid].append(e.get("name"))
            if e.get("name") == "NEGOTIATE_ALLREDUCE":
                submits[pid].append(e["ts"] / 1e6)
        elif e.get("ph") == "E" and open_spans[pid]:
            if open_spans[pid].pop() == "ALLREDUCE" and "shape" in e.get("args", {}):
                args = e["args"]
                nbytes[pid] = _DTYPE_BYTES.get(args.get("dtype"), 4) * math.prod(json.loads(args["shape"]))
    grads = [pid for pid in grads if submits[pid] and pid in nbytes]
    if not grads:
        raise ConfigError(f"--timeline {path}: no gradient all-reduce (no tensor under a '{GRADIENT_SCOPE}' scope "
                          "with a finished ALLREDUCE): record it with HOROVOD_TIMELINE on >= 2 ranks training with "
                          "hvd.DistributedGradientTape or DistributedOptimizer")
    steps = min(len(submits[pid]) for pid in grads)
    if steps <= skip_steps:
        raise ConfigError(f"--timeline {path}: {steps} step(s) of gradient all-reduces, need more than {skip_steps} "
                          "(the first ones negotiate in full)")
    leads = {pid: [] for pid in grads}
    for k in range(skip_steps, steps):
        last = max(submits[pid][k] for pid in grads)
        for pid in grads:
            leads[pid].append(last - submits[pid][k])
    order = sorted(grads, key=lambda pid: (-statistics.median(leads[pid]), pid))
    return GradientProfile(names=tuple(names[pid] for pid in order),
                           leads_s=tuple(statistics.median(leads[pid]) for pid in order),
                           nbytes=tuple(nbytes[pid] for pid in order), steps=steps - skip_steps)


def describe(profile: GradientProfile, within_s: Sequence[float] = (1e-3, 5e-3)) -> str:
    """One line: tensors, bytes, steps, the backward span seen and the share of bytes near its end."""
    span = max(profile.leads_s) if profile.leads_s else 0.0
    near = ", ".join(f"{profile.bytes_within(t):.0%} within {t * 1e3:g} ms" for t in within_s)
    return (f"gradient profile: {len(profile.leads_s)} tensors, {profile.gradient_bytes:,} bytes, median of "
            f"{profile.steps} steps; first submitted {span * 1e3:.1f} ms before the last; bytes submitted near "
            f"the end: {near}")
