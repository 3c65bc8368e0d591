"""Test driver: `harness train ARGS` through the CLI (its parser, config merge, one-line errors and exit codes) for
each `---`-separated ARGS in turn, in one worker of `harness launch local`. The strategy is built once, before any
other TensorFlow op, and given to every run (`harness.train.job.run`'s `distribution`), so that the worker's start
(TensorFlow's import, the strategy) is paid once for several runs. Exits with the first non-zero code, before the
runs after it. Each run's output follows a line `RUN <i>` (0, 1, ...), so that a test can tell the runs' lines apart.

Usage: train_runs.py ARGS... [--- ARGS...]...
"""
import sys

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)

from harness.cli import main
from harness.distribute.strategy import make_strategy
from harness.train import job

distribution = make_strategy("auto")   # from TF_CONFIG, before any other TensorFlow op
_run = job.run
job.run = lambda options, **kwargs: _run(options, **kwargs, distribution=distribution)

runs = [[]]
for arg in sys.argv[1:]:
    if arg == "---":
        runs.append([])
    else:
        runs[-1].append(arg)
for i, args in enumerate(runs):
    print(f"RUN {i}", flush=True)   # after every line of the run before it (stdout is flushed in order)
    code = main(["train", *args])
    if code:
        sys.exit(code)
