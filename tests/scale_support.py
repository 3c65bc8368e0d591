"""A one-replica `harness bench train` report.json for the tests of `harness bench scale` (and its README lines)."""
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
