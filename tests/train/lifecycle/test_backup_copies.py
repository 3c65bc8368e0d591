"""A non-chief worker's backup copy (MultiWorkerMirroredStrategy saves on every worker): deleted at the run's end,
and those a killed worker left are deleted by the next worker on the host (`backups.sweep_copies`). The whole
cycle with real workers, one of them SIGKILLed, is `tests/launch/test_fault_tolerance.py`'s killed-worker test."""
import os
import subprocess
import sys

from harness.train.lifecycle import backup as backups


def _ns() -> str:
    return "".join(c for c in os.readlink("/proc/self/ns/pid") if c.isdigit())


def test_the_copies_of_processes_gone_are_deleted_and_the_others_kept(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    names = {
        "dead": f"harness-backup-worker1-pid{gone.pid}-ns{_ns()}-abc",
        "alive": f"harness-backup-worker1-pid{os.getpid()}-ns{_ns()}-def",
        "other pid namespace": f"harness-backup-worker2-pid{gone.pid}-ns1{_ns()}-ghi",
        "unrelated": f"harness-backup-worker1-{gone.pid}-jkl",   # the old name, no PID namespace: not ours to judge
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "ckpt-16.index").write_bytes(b"x" * 100)
    assert backups.sweep_copies(str(tmp_path)) == [str(tmp_path / names["dead"])]
    assert sorted(os.listdir(tmp_path)) == sorted(v for k, v in names.items() if k != "dead")
    assert backups.sweep_copies(str(tmp_path)) == []
    assert backups.sweep_copies(str(tmp_path / "missing")) == []
