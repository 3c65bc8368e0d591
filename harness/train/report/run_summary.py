"""What a finished run reports: the weights digest, every rank's statistics, and `summary.json`."""
from __future__ import annotations

import json
import os
import socket
from typing import Callable, Optional

def weights_digest(model) -> str:
    """SHA-256 (hex) over the model's weights in order: equal on every worker when the replicas are in sync."""
    import hashlib

    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(w.tobytes())
    return digest.hexdigest()


def rank_stats(backend, plan, summary: dict, say: Callable[..., None]) -> Optional[list[dict]]:
    """Every rank's files, records, dropped records, steps, throughput (examples/s) and weights digest, gathered
    to rank 0 (`backend.gather_ranks`; None elsewhere and under tf.distribute); rank 0 prints them and says
    whether the final weights are identical on all ranks."""
    from harness.distribute.horovod import format_ranks

    context, timing = backend.context, summary["timing"]
    mine = {"rank": context.rank, "host": socket.gethostname(), "local_rank": context.local_rank,
            "files": list(plan.files[context.rank]), "records": plan.records[context.rank],
            "dropped": plan.dropped[context.rank], "steps": timing["steps"] + timing["warmup_steps"],
            "examples_per_s": timing["examples_per_s"], "input_stall_share": timing["input_stall_share"],
            "weights_sha256": summary["weights_sha256"]}
    stats = backend.gather_ranks(mine)
    if stats is not None:
        say(format_ranks(stats))
        digests = {s["weights_sha256"] for s in stats}  # checked equal before the save (check_same_weights)
        say(f"final weights identical on all {len(stats)} ranks (sha256 {digests.pop()[:12]})")
    return stats


def worker_epochs(backend, history: list) -> list[dict]:
    """Every worker's throughput and input stall per epoch, on every worker (one `backend.allgather` of 2 floats
    per epoch; every worker calls it after the same epochs): `[{"rank", "examples_per_s": [per epoch],
    "input_stall_share": [per epoch]}]` in rank order. examples/s is the global batch over this worker's step
    time; the input stall its own share of step time spent waiting for input."""
    values = [v for h in history for v in (h["examples_per_s"], h["input_stall_share"])]
    rows = backend.allgather(values)
    return [{"rank": rank, "examples_per_s": [float(v) for v in row[0::2]],
             "input_stall_share": [float(v) for v in row[1::2]]} for rank, row in enumerate(rows)]


def write_summary(summary: dict, output: str) -> None:
    """Print the final line and write `output/summary.json` (the chief's job). A summary whose final save failed
    ("model_error") says so in its line, and prints no `next:` line; one without timings (a model saved again from
    the backup) prints only where its model is."""
    t, history = summary.get("timing"), summary["history"]
    last = history[-1] if history else {}
    model = summary["model"] or f"NOT SAVED ({summary.get('model_error')})"
    if t:
        print(f"summary: {t['examples_per_s']:.1f} examples/s, input stall {100 * t['input_stall_share']:.1f}% "
              f"over {t['steps']} timed steps, final loss {last.get('loss', float('nan')):.4f}"
              + (f", val_accuracy {last['val_accuracy']:.4f}" if "val_accuracy" in last else "")
              + f"; model: {model}", flush=True)
    else:
        print(f"summary: model: {model}", flush=True)
    if summary["model"]:
        print(f"next: harness report {output}  (report.html, opens offline); harness predict --model {output} "
              "--data EXPORT --output OUT  (predictions, the map)", flush=True)
    import tensorflow as tf   # tf.io.gfile: the output folder may be on gs://

    tf.io.gfile.makedirs(output)
    with tf.io.gfile.GFile(os.path.join(output, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
