"""A worker's SIGABRT (134) as the launchers classify it (tensorflow#31917, #60706): after a lost peer (its own
output said so) TensorFlow's gRPC server aborted it, retryable (138); alone, a C++ check that failed, permanent (2).
Real SIGABRTs of small Python workers (no TensorFlow): the launchers' own code, not a training run."""
import io
import os
import sys

import pytest

from harness.errors import WorkerFailedError
from harness.launch import local, mpi, stopping

TF_LINE = ("E tensorflow/core/common_runtime/base_collective_executor.cc:249] BaseCollectiveExecutor::StartAbort "
           "UNAVAILABLE: Socket closed")


def test_an_abort_is_permanent_unless_a_peer_was_lost_before_it():
    assert stopping.launcher_code(-6) == 2 and stopping.launcher_code(134) == 2
    assert stopping.describe(-6) == ("exited with code -6 (SIGABRT, 134 to the shell), permanent: a C++ abort (a "
                                     "failed check) with no lost peer before it")
    assert stopping.launcher_code(-6, "its line 'x'") == 138 and stopping.launcher_code(134, "its line 'x'") == 138
    assert stopping.describe(134, "its line 'x'") == (
        "exited with code 134 (SIGABRT) after a lost peer (its line 'x'), retryable: TensorFlow's gRPC server "
        "aborts when a peer of its collective is lost")
    assert stopping.launcher_code(-11, "its line 'x'") == 2     # only an abort is read so
    assert stopping.peer_lost_line(TF_LINE) and not stopping.peer_lost_line("F ... Check failed: shape")


def _workers(script, n=2):
    envs = [dict(os.environ, W=str(i)) for i in range(n)]
    out = io.StringIO()
    with pytest.raises(WorkerFailedError) as failed:
        local._run([sys.executable, "-c", script], envs, [f"localhost:{2000 + i}" for i in range(n)], 60, out)
    return failed.value, out.getvalue()


def test_launch_local_reads_the_aborted_workers_own_lines():
    peer = ("import os, sys, time\n"
            "if os.environ['W'] == '0':\n"
            f"    print({TF_LINE!r}, flush=True); time.sleep(0.2); os.abort()\n"
            "time.sleep(60)\n")
    failed, out = _workers(peer)
    assert failed.exit_code == 138, str(failed)
    assert str(failed) == (f"worker 0 exited with code -6 (SIGABRT, 134 to the shell) after a lost peer (its line "
                           f"{TF_LINE!r}), retryable: TensorFlow's gRPC server aborts when a peer of its collective "
                           "is lost: the first to fail, at localhost:2000; stopped the other workers")
    alone, _ = _workers("import os, time\nif os.environ['W'] == '1': os.abort()\ntime.sleep(60)\n")
    assert alone.exit_code == 2 and str(alone).startswith(
        "worker 1 exited with code -6 (SIGABRT, 134 to the shell), permanent: a C++ abort (a failed check) with no "
        "lost peer before it: the first to fail, at localhost:2001")


def test_launch_mpi_reads_the_ranks_tagged_lines(capsys):
    """mpirun's report of rank 0's signal 6, after rank 0's own tagged line naming the lost peer (a stand-in for
    mpirun: the lines as it prints them, then its exit code)."""
    script = ("import sys\n"
              f"print('[1,0]<stderr>:' + {TF_LINE!r}, file=sys.stderr)\n"
              "print('[1,1]<stdout>:epoch 1/2', flush=True)\n"
              "print('mpirun noticed that process rank 0 with PID 0 on node node1 exited on signal 6 (Aborted).', "
              "file=sys.stderr)\n"
              "sys.exit(134)\n")
    with pytest.raises(WorkerFailedError) as failed:
        mpi.run([sys.executable, "-c", script], timeout_s=60)
    assert failed.value.exit_code == 138
    assert str(failed.value).endswith(
        f": rank 0 exited with code 134 (SIGABRT) after a lost peer (its line {TF_LINE!r}), retryable: TensorFlow's "
        "gRPC server aborts when a peer of its collective is lost: the first to fail, on node1")
    first = mpi.FirstFailure()
    first.feed("mpirun noticed that process rank 2 with PID 0 on node node1 exited on signal 6 (Aborted).\n")
    assert (first.rank, first.code, first.peer_lost) == (2, 134, {})
