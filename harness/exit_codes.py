"""The process exit codes of `harness` commands, chosen by the Kubernetes operators' rule for retrying a pod.

Kubeflow training-operator (`pkg/util/train/train_util.go`, `IsRetryableExitCode`, which `restartPolicy: ExitCode`
of TFJob, PyTorchJob and MPIJob applies): 130 (128 + SIGINT), 137 (SIGKILL: the OOM killer, an eviction past its
grace), 143 (SIGTERM) and 138 (128 + SIGUSR1, "for user defined retryable error") are retried; 1, 2, 126, 127, 128
and 139 (SIGSEGV) are permanent, and "no guarantee" is made for any other code, which it handles as permanent.

  PERMANENT (2):  bad input or configuration (`harness.errors.HarnessError`): a re-run fails the same way.
  RETRYABLE (138): a fault of the cluster (`harness.errors.ClusterFault`): a lost, stuck or late peer, a
                   preemption. A re-run of the same command resumes from the last backup.
  INTERRUPTED (130): Ctrl-C (SIGINT), the shell's 128 + 2.
"""
from __future__ import annotations

PERMANENT = 2
RETRYABLE = 138
INTERRUPTED = 130
# training-operator's rule, for the launchers that pass a worker's code on (Kubernetes reads the pod's code).
_RETRYABLE_CODES = frozenset({130, 137, 138, 143})


def is_retryable(code: int) -> bool:
    """True when Kubernetes' training-operator would retry a pod that exited with `code` (an int as
    `subprocess.Popen.returncode` gives it: negative -N for a process ended by signal N, read as 128 + N)."""
    return shell_code(code) in _RETRYABLE_CODES


def shell_code(code: int) -> int:
    """`subprocess.Popen.returncode` as a shell (and a container runtime) reports it: -N (ended by signal N) is
    128 + N."""
    return 128 - code if code < 0 else code
