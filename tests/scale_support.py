"""Inputs of `harness bench scale` for its tests: a one-replica `harness bench train` report.json, and a Horovod
timeline written as Horovod writes it."""
import json


def write_report(path, step_times=(0.10, 0.12, 0.11, 0.13), batch=16, replicas=1, kind="bench-train-synthetic"):
    """A report.json as `harness bench train` writes it (the fields `bench scale` reads, and a warm-up step)."""
    steps = [{"step": 1, "start_s": 0.0, "input_wait_s": 0.0, "compute_s": 9.0, "examples": batch, "warmup": True,
              "call_steps": 1, "step_s": 9.0}]
    steps += [{"step": i + 2, "start_s": 0.0, "input_wait_s": 0.0, "compute_s": t, "examples": batch,
               "warmup": False, "call_steps": 1, "step_s": t} for i, t in enumerate(step_times)]
    mean = sum(step_times) / len(step_times)
    report = {"kind": kind, "created": "2026-12-01T00:00:00+00:00", "versions": {},
              "config": {"per_replica_batch_size": batch,
                         "shapes": {"kind": "image", "input_shape": [16, 16, 4], "num_classes": 4,
                                    "label_shape": None}},
              "summary": {"workers": 1, "replicas_in_sync": replicas, "examples_per_s": batch / mean,
                          "examples_per_s_per_replica": batch / mean},
              "verdict": "not input-bound", "advice": [], "workers": [], "parts": [{"rank": 0, "steps": steps}]}
    path.write_text(json.dumps(report))
    return path


GRAD_A = "while/DistributedGradientTape_Allreduce/cond/then/HorovodAllreduce_gradient_tape_dense_MatMul_0"
GRAD_B = "while/DistributedGradientTape_Allreduce/cond/then/HorovodAllreduce_gradient_tape_dense_BiasAdd_0"
METRIC = "while/HorovodAllreduce_Sum_0"


def horovod_events(steps=4, b_offsets_s=(0.004, 0.004, 0.004, 0.006)):
    """Horovod's format: metadata per tensor, then per step NEGOTIATE_ALLREDUCE (B), a rank mark (X), E, ALLREDUCE
    (B), GLOO_ALLREDUCE (B, E), E with dtype and shape. A (float32 [10, 10]) at 1 s + k, B (float16 [8]) after it
    by b_offsets_s[k], the metric 1 ms after B."""
    ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}}]
    tensors = {1: (GRAD_A, "float32", "[10, 10]"), 2: (GRAD_B, "float16", "[8]"), 3: (METRIC, "float32", "[1]")}
    for pid, (name, _, _) in tensors.items():
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
    for k in range(steps):
        t = {1: 1.0 + k, 2: 1.0 + k + b_offsets_s[k], 3: 1.001 + k + b_offsets_s[k]}
        for pid, (_, dtype, shape) in tensors.items():
            us = int(round(t[pid] * 1e6))
            ev += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": us, "pid": pid},
                   {"ph": "X", "name": "0", "ts": us, "pid": pid, "dur": 0},
                   {"ph": "E", "ts": us + 10, "pid": pid},
                   {"ph": "B", "name": "ALLREDUCE", "ts": us + 20, "pid": pid},
                   {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": us + 21, "pid": pid},
                   {"ph": "E", "ts": us + 500, "pid": pid},
                   {"ph": "E", "ts": us + 501, "pid": pid, "args": {"dtype": dtype, "shape": shape}}]
    return ev


def write_timeline(path, events, *, cut=""):
    """The events as Horovod writes them (one per line, each followed by a comma); `cut`: where a killed process
    left the file ("comma": after the last event's comma; "event": inside a half-written event; "braces": between
    the last event's closing braces)."""
    text = "[\n" + "".join(json.dumps(e) + ",\n" for e in events) + "]"
    text = {"": text, "comma": text[:-1], "event": text[:-1] + '{"ph": "B", "na',
            "braces": text[:-1] + json.dumps(events[-1])[:-1]}[cut]
    path.write_text(text)
    return str(path)
