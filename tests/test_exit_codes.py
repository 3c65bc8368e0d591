"""The exit-code rule against training-operator's `IsRetryableExitCode` (pkg/util/train/train_util.go), code by
code, and the classes of errors the CLI maps to each."""
import pytest

from harness import errors, exit_codes


@pytest.mark.parametrize("code,retryable", [(0, False), (1, False), (2, False), (126, False), (127, False),
                                            (128, False), (139, False), (-11, False), (3, False), (255, False),
                                            (130, True), (137, True), (138, True), (143, True),
                                            (-2, True), (-9, True), (-15, True), (-10, True)])
def test_retryable_as_training_operator_rules(code, retryable):
    assert exit_codes.is_retryable(code) is retryable


def test_harness_codes_fall_on_the_right_side():
    assert not exit_codes.is_retryable(exit_codes.PERMANENT)
    assert exit_codes.is_retryable(exit_codes.RETRYABLE) and exit_codes.RETRYABLE == 138
    assert exit_codes.is_retryable(exit_codes.INTERRUPTED)


def test_cluster_faults_are_harness_errors_apart_from_input_errors():
    for fault in (errors.PeerLostError, errors.StalledWorkerError, errors.PreemptedError):
        assert issubclass(fault, errors.ClusterFault) and issubclass(fault, errors.HarnessError)
    for bad_input in (errors.SpecError, errors.ConfigError, errors.ShardDiscoveryError, errors.ClusterConfigError):
        assert not issubclass(bad_input, errors.ClusterFault)


def test_a_native_crash_prints_the_python_stack_and_keeps_its_signal():
    """A heap check's abort inside TensorFlow (glibc's `munmap_chunk(): invalid pointer`, seen once in a 2-worker
    `bench train`) ends a worker with SIGABRT and nothing else: the CLI's fault handler prints each Python thread's
    stack first (the call that was running), and the signal still ends the process (the launcher's exit code)."""
    import subprocess
    import sys

    code = ("import os, sys; from harness import cli\n"
            "def crash(args): os.abort()\n"
            "parser = cli.build_parser\n"
            "def patched():\n"
            "    p = parser(); p._subparsers._group_actions[0].choices['report'].set_defaults(handler=crash)\n"
            "    return p\n"
            "cli.build_parser = patched\n"
            "sys.exit(cli.main(['report', '/nonexistent']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -6, done.stderr
    assert "Fatal Python error: Aborted" in done.stderr and 'line 2 in crash' in done.stderr, done.stderr
