"""Test driver: run `harness.train.job.run` as one worker and print what the test compares.

Usage: train_worker.py OUTPUT_BASE DATA... [-- key=value ...] (TrainOptions fields; ints/floats parsed;
`data_config=JSON`: the data section given to `job.run`).
Every worker trains with `output = OUTPUT_BASE` (one folder the workers share, as MultiWorkerMirroredStrategy needs).
Prints one line `RESULT {json}` with rank, last loss, weights digest, steps and the calls to the data layer's
once-per-run functions (tests/call_counts.py).

Two keys add jobs of 1 epoch to the same process, over the same strategy (a worker's start is paid once):
- `private_first=FOLDER`: before the run, a job whose output is `FOLDER/worker<rank>` (a folder private to each
  worker, as on hosts that share no storage); the ClusterConfigError it is refused with is printed as one line
  `REFUSED ClusterConfigError: <message>`, and the run follows.
- `differ_after=FOLDER`: after the run, a job into FOLDER in which worker 1 reports other final weights; what it
  raises ends the process.
"""
import json
import os
import pathlib
import sys

import harness  # noqa: F401

from harness.distribute.strategy import make_strategy
from harness.errors import ClusterConfigError
from harness.train import job

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # tests/: call_counts
import call_counts  # noqa: E402

DEFAULTS = {"epochs": 2, "per_replica_batch_size": 32, "learning_rate": 1e-2}


def _value(text):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def main():
    base, rest = sys.argv[1], sys.argv[2:]
    split = rest.index("--") if "--" in rest else len(rest)
    data = tuple(rest[:split])
    kwargs = dict(DEFAULTS)
    kwargs.update({k: _value(v) for k, v in (kv.split("=", 1) for kv in rest[split + 1:])})
    data_config = json.loads(kwargs.pop("data_config", "{}"))
    private_first, differ_after = kwargs.pop("private_first", None), kwargs.pop("differ_after", None)
    if "validation_data" in kwargs:   # comma-separated paths
        kwargs["validation_data"] = tuple(str(kwargs["validation_data"]).split(","))
    strategy, context = make_strategy("auto")  # before any other TensorFlow op
    one_epoch = dict(DEFAULTS, epochs=1)
    if private_first:
        try:
            job.run(job.TrainOptions(data=data, output=os.path.join(private_first, f"worker{context.rank}"),
                                     **one_epoch), distribution=(strategy, context))
        except ClusterConfigError as e:
            print(f"REFUSED {type(e).__name__}: {e}", flush=True)
    calls = call_counts.install()
    if os.environ.get("HARNESS_TEST_SEED_BY_RANK"):  # each worker's sample of the records differs
        kwargs["seed"] = 100 + context.rank
    options = job.TrainOptions(data=data, output=base, **kwargs)
    summary = job.run(options, data_config=data_config, distribution=(strategy, context))
    print("RESULT " + json.dumps({
        "rank": context.rank, "loss": summary["history"][-1]["loss"] if summary["history"] else None,
        "weights_sha256": summary["weights_sha256"], "optimizer_iterations": summary["optimizer_iterations"],
        "initial_step": summary["initial_step"], "final_step": summary["final_step"],
        "epochs_run": [h["epoch"] for h in summary["history"]], "calls": calls,
        "learning_rate": summary.get("learning_rate")}), flush=True)
    if differ_after:   # the weights-differ test
        if context.rank == 1:
            from harness.train.report import run_summary
            run_summary.weights_digest = lambda model: "f" * 64
        job.run(job.TrainOptions(data=data, output=differ_after, **one_epoch), distribution=(strategy, context))


if __name__ == "__main__":
    main()
