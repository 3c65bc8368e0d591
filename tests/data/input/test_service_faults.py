"""A tf.data service worker that stops serving while one training process depends on it: real processes (a
dispatcher, a service worker, `harness train` through tests/distribute/scripts/cli_worker.py), the service worker
killed mid-run."""
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
from procs import ended_within, kill_groups, one_line, wait_for_backup, wait_for_line

from harness.launch.local import free_ports

pytestmark = pytest.mark.waits("a service worker stopped: the watchdog's bound of 10 s")


def test_one_training_worker_whose_service_worker_stops_ends_within_the_bound_naming_the_service(table_export,
                                                                                             tmp_path):
    """One training process fed by the tf.data service: its only service worker killed mid-run left it waiting
    without end (the watchdog was armed for 2+ workers only). Now it ends within HARNESS_PEER_TIMEOUT_S, one
    StalledWorkerError line naming the service, exit 138 (retryable: a restarted service worker serves again)."""
    port = free_ports(1)[0]
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    harness = [sys.executable, "-m", "harness.cli", "data-service"]
    servers = []
    for role in (["dispatcher", "--port", str(port)], ["worker", "--dispatcher", f"localhost:{port}"]):
        log = tmp_path / f"{role[0]}.log"
        servers.append(subprocess.Popen(harness + role, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                        start_new_session=True))
        wait_for_line(log, "tf.data service", servers[-1])
    output, log = tmp_path / "run", tmp_path / "train.log"
    script = pathlib.Path(__file__).resolve().parents[2] / "distribute" / "scripts" / "cli_worker.py"
    trainer = subprocess.Popen(
        [sys.executable, str(script), "--data", str(table_export), "--output", str(output), "--epochs", "50",
         "--per-replica-batch-size", "8", "--data-service", f"grpc://localhost:{port}"],
        env=dict(env, HARNESS_PEER_TIMEOUT_S="10", HARNESS_TEST_STEP_DELAY_S="0.05"), stdout=open(log, "w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_backup(output, [trainer], 240)
        os.killpg(servers[1].pid, signal.SIGKILL)
        took = ended_within(trainer, time.monotonic(), 10 + 30)
    finally:
        kill_groups(trainer, *servers)
    assert trainer.returncode == 138, log.read_text()[-3000:]
    line = one_line(log, "StalledWorkerError")
    assert re.search(rf"has waited \d+ s for the batch after step \d+: its input, the tf.data service at "
                     rf"grpc://localhost:{port}, sends no batch", line), line
    assert took < 40
