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
