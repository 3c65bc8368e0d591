"""`harness ARGS...` (`harness.cli.main`, as `python -m harness.cli` runs it) with the probes of `harness train
--tune` shortened, for tests/train/measure/test_tune.py: each timed window of a stage's probe lasts MIN_PASS_S
0.02 s of CPU (harness.data.tune.stage_rates: 0.2), and the step's probe on synthetic batches aims at PROBE_SECONDS 0.2
s of at least PROBE_STEPS 4 steps (harness.train.measure.probe: 2 s, 20). Every probe, the decision, its agreement and
its record run as they do at full length; their figures are noisier (the tests assert what is decided and applied,
not how fast a stage is), and the run costs ~4 CPU-s less (~11 -> ~7 for the tests' 64 patches and one_conv.py).
"""
import sys

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
from harness import cli
from harness.data.tune import stage_rates as stage_probe
from harness.train.measure import probe as step_probe

stage_probe.MIN_PASS_S = 0.02
step_probe.PROBE_SECONDS = 0.2
step_probe.PROBE_STEPS = 4
sys.exit(cli.main(sys.argv[1:]))
