"""Test driver: `harness train ARGS...` through the CLI (`harness.cli.main`), where worker 1's job meets a fault of
the cluster: its `job.run` raises `PeerLostError` (what the harness raises on a lost peer), the others' block. So a
test sees the CLI's exit code (138) of a real `harness train` process pass through `harness launch local`."""
import json
import os
import sys
import time

from harness import cli
from harness.errors import PeerLostError
from harness.train import job


def run(options, data_config=None):
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
        raise PeerLostError("worker 0 at localhost lost at step 0 (injected by the test); a re-run resumes from "
                            "the last backup")
    time.sleep(120)


job.run = run
sys.exit(cli.main(["train", *sys.argv[1:]]))
