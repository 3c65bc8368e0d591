"""Test driver: `harness train ARGS...` through the CLI (`harness.cli.main`), held once its strategy is built until
the file HARNESS_TEST_GATE exists.

Once `make_strategy` returns, a MultiWorkerMirrored worker's gRPC server listens (on every interface, in the
worker's network); the worker then says so (it creates the file HARNESS_TEST_GATE.PID), waits, polling every 0.1 s,
until the test has probed its port and creates the gate file, and trains on from there. Before that, its port may
be closed for a moment: `strategy.wait_for_workers` listens on it from Python while the peers arrive and closes it
just before TensorFlow's server binds it, so a probe must wait for the `.PID` files, not for a listening socket. So a worker cannot end (and close its port) before the probe: a port found
closed is closed by the network, not by a worker that already finished. A gate that never opens ends the process
after GATE_S seconds (exit 3, one line), not a hang.
"""
import os
import sys
import time

import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
from harness.cli import main
from harness.distribute import strategy

GATE_S = 300
gate = os.environ["HARNESS_TEST_GATE"]
_make_strategy = strategy.make_strategy


def gated_make_strategy(*args, **kwargs):
    built = _make_strategy(*args, **kwargs)
    open(f"{gate}.{os.getpid()}", "w").close()
    deadline = time.monotonic() + GATE_S
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            print(f"gated_train: no {gate} after {GATE_S} s", file=sys.stderr, flush=True)
            os._exit(3)
        time.sleep(0.1)
    return built


strategy.make_strategy = gated_make_strategy   # harness.distribute.backend imports it when it builds the strategy
sys.exit(main(["train", *sys.argv[1:]]))
