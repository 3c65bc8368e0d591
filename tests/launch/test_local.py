"""The local launcher with real processes: TF_CONFIG per worker, prefixed output, failure of one fails all."""
import json
import subprocess
import sys
import time

import pytest

from harness.errors import WorkerFailedError
from harness.launch.local import run_local, worker_environments

PRINT_TASK = ("import json, os; c = json.loads(os.environ['TF_CONFIG']); "
              "print('task', c['task']['index'], len(c['cluster']['worker']))")


def test_worker_environments_form_one_cluster():
    envs = worker_environments(3, gpus_per_worker=2, base={})
    configs = [json.loads(e["TF_CONFIG"]) for e in envs]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    workers = configs[0]["cluster"]["worker"]
    assert len(set(workers)) == 3 and all(c["cluster"]["worker"] == workers for c in configs)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3", "4,5"]


def test_output_prefixed_by_worker(capsys):
    import io
    out = io.StringIO()
    run_local([sys.executable, "-c", PRINT_TASK], workers=2, out=out)
    lines = sorted(out.getvalue().splitlines())
    assert lines == ["[worker 0] task 0 2", "[worker 1] task 1 2"]


def test_one_failing_worker_stops_the_others():
    script = ("import json, os, sys, time; i = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
              "if i == 1: sys.exit(3)\ntime.sleep(60)")
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError, match=r"worker 1 exited with code 3, permanent: the first to fail, at localhost:\d+"):
        run_local([sys.executable, "-c", script], workers=2, out=open("/dev/null", "w"))
    assert time.monotonic() - t0 < 30


def test_timeout_is_a_named_error():
    with pytest.raises(WorkerFailedError, match="timed out after 2 s"):
        run_local([sys.executable, "-c", "import time; time.sleep(60)"], workers=2, timeout_s=2,
                  out=open("/dev/null", "w"))


def test_cli_exit_code_on_failure():
    r = subprocess.run([sys.executable, "-m", "harness.cli", "launch", "local", "--workers", "2", "--",
                        sys.executable, "-c", "import sys; sys.exit(5)"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "WorkerFailedError: worker" in r.stderr and "exited with code 5, permanent: the first to fail" in r.stderr
