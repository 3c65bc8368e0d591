"""`harness train ARGS...` in one rank, launched by tests/distribute/test_horovod_backend.py (horovodrun, mpirun).

Runs `harness.train.job.run` as the CLI would, keeping a handle on the built model and counting every write the
rank makes (backups, model saves, the summary.json it writes), then prints one line
`HVD_TRAIN {json}`: the rank, a sha256 and the values of its final weights, its writes and its summary.
"""
import hashlib
import json
import os
import pathlib
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402,F401
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from harness.cli import build_parser  # noqa: E402
from harness.distribute import environment  # noqa: E402
from harness.commands.train import options_from_args  # noqa: E402
from harness.train import job
from harness.train.model import builtin, user as user_model
from harness.train.report import run_summary

built, writes = [], {"backup": 0, "model": 0, "files": []}


def capture(fn):
    def wrapper(*args, **kwargs):
        built.append(fn(*args, **kwargs))
        return built[-1]
    return wrapper


def counting(fn, key):
    def wrapper(*args, **kwargs):
        writes[key] += 1
        return fn(*args, **kwargs)
    return wrapper


def counting_model_saves(fn):
    """`Model.save`, noted, but for the check before the first step (`harness.train.model.loadable`: every rank
    saves its built model into a private temporary folder and loads it back; nothing is written to the run)."""
    def wrapper(model, path, *args, **kwargs):
        if "harness-loadable-" not in str(path):
            writes["model"] += 1
        return fn(model, path, *args, **kwargs)
    return wrapper


def counting_summary(fn):
    """`run_summary.write_summary`, the job's one writer of summary.json (through tf.io.gfile: gs:// outputs), noted."""
    def wrapper(summary, output, *args, **kwargs):
        writes["files"].append("summary.json")
        return fn(summary, output, *args, **kwargs)
    return wrapper


def capture_checked(fn):
    """The model a user's function built (`--model`), as the job checks it."""
    def wrapper(model, *args, **kwargs):
        built.append(model)
        return fn(model, *args, **kwargs)
    return wrapper


user_model.check_model = capture_checked(user_model.check_model)
builtin.pixel_classifier = capture(builtin.pixel_classifier)
builtin.unet = capture(builtin.unet)
tf.train.CheckpointManager.save = counting(tf.train.CheckpointManager.save, "backup")
tf_keras.Model.save = counting_model_saves(tf_keras.Model.save)
run_summary.write_summary = counting_summary(run_summary.write_summary)  # the job's summary.json (harness.train.report.run_summary)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # tests/: call_counts
import call_counts  # noqa: E402

calls = call_counts.install()
args = build_parser().parse_args(["train", *sys.argv[1:]])
options, data = options_from_args(args)
summary = job.run(options, data_config=data)

# Horovod may already be shut down here (it shuts down everywhere once any rank exits): ask the launcher.
launcher = environment.read_launcher()
weights = np.concatenate([w.ravel().astype(np.float64) for w in built[-1].get_weights()])
digest = hashlib.sha256(b"".join(w.tobytes() for w in built[-1].get_weights())).hexdigest()
line = "HVD_TRAIN " + json.dumps({
    "rank": launcher.rank, "size": launcher.size, "launcher": launcher.launcher, "sha256": digest,
    "weights": weights[:64].tolist(), "writes": writes, "summary": summary, "calls": calls,
}, default=str)
# A line longer than a pipe's atomic write (4 KiB) can be cut by another rank's output under mpirun: the test
# reads each rank's line from its own file when it names a folder.
if os.environ.get("HARNESS_TEST_RESULTS"):
    with open(os.path.join(os.environ["HARNESS_TEST_RESULTS"], f"rank{launcher.rank}.txt"), "w") as f:
        f.write(line + "\n")
print(line, flush=True)
