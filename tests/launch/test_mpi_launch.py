"""`harness launch mpi` / `harness launch horovod`: the command lines, --dry-run, the scripts in launch/ and real
2-rank launches of small commands (no TensorFlow), each under a timeout that fails the test."""
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

from harness import cli
from harness.launch import mpi as launch_mpi

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "distribute" / "scripts"
BIN = pathlib.Path(sys.executable).parent
HARNESS = [sys.executable, "-m", "harness.cli"]
TRAIN = ["harness", "train", "--backend", "horovod", "--data", "gs://b/export", "--output", "runs/x"]


def test_mpirun_command_has_horovods_flags_and_exports():
    env = {"PATH": "/bin", "NCCL_DEBUG": "INFO", "HARNESS_SHARED_DATA": "/d", "TF_CONFIG": "{}",
           "HOROVOD_RANK": "3", "OMPI_COMM_WORLD_RANK": "1", "HOME": "/root"}
    line = launch_mpi.mpirun_command(TRAIN, np=4, hosts="a:2,b:2", environ=env, as_root=False)
    assert line[:5] == ["mpirun", "-np", "4", "-H", "a:2,b:2"]
    joined = " ".join(line)
    assert "-bind-to none -map-by slot -mca pml ob1 -mca btl ^openib" in joined
    exported = [line[i + 1] for i, t in enumerate(line) if t == "-x"]
    assert exported == ["TF_USE_LEGACY_KERAS", "PATH", "HARNESS_SHARED_DATA", "NCCL_DEBUG"]  # not TF_CONFIG, ranks
    assert line[-len(TRAIN):] == TRAIN
    rooted = launch_mpi.mpirun_command(TRAIN, np=2, environ={}, as_root=True)
    assert rooted[:4] == ["mpirun", "--allow-run-as-root", "-np", "2"] and "-H" not in rooted


def test_horovodrun_command_and_controller():
    assert launch_mpi.horovodrun_command(TRAIN, np=2, horovodrun="horovodrun") == [
        "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", *TRAIN]
    line = launch_mpi.horovodrun_command(TRAIN, np=8, hosts="a:4,b:4", controller="mpi", horovodrun="horovodrun")
    assert line[1:6] == ["-np", "8", "-H", "a:4,b:4", "--mpi"]
    with pytest.raises(ValueError, match="controller must be one of"):
        launch_mpi.horovodrun_command(TRAIN, np=2, controller="nccl")


@pytest.mark.parametrize("hosts, message", [("a:2,b", "host:slots"), ("a:0", "host:slots"),
                                            ("a:1,b:1", "offers 2 slots for --np 4")])
def test_bad_hosts_are_named(hosts, message):
    with pytest.raises(ValueError, match=message):
        launch_mpi.check_hosts(4, hosts)
    with pytest.raises(ValueError, match="no command"):
        launch_mpi.mpirun_command([], np=2)


def test_dry_run_prints_the_lines(capsys):
    assert cli.main(["launch", "mpi", "--np", "2", "-H", "localhost:2", "--dry-run", "--", *TRAIN]) == 0
    printed = capsys.readouterr().out.strip()
    assert shlex.split(printed) == launch_mpi.mpirun_command(TRAIN, np=2, hosts="localhost:2")
    assert cli.main(["launch", "horovod", "--np", "2", "--controller", "mpi", "--dry-run", "--", *TRAIN]) == 0
    line = shlex.split(capsys.readouterr().out.strip())
    assert line[0].endswith("horovodrun") and line[1:] == ["-np", "2", "-H", "localhost:2", "--mpi", *TRAIN]


def test_mpirun_script_shows_the_same_line():
    env = dict(os.environ, DRY_RUN="1", NP="4", HOSTS="a:2,b:2", NCCL_DEBUG="INFO", TF_CONFIG="{}",
               HOROVOD_RANK="1")
    out = subprocess.run(["bash", ROOT / "launch" / "mpirun_horovod.sh", "--data", "gs://b/export", "--output",
                          "runs/x"], env=env, capture_output=True, text=True, timeout=30, check=True).stdout
    assert shlex.split(out) == launch_mpi.mpirun_command(TRAIN, np=4, hosts="a:2,b:2", environ=env)


def test_slurm_script_runs_srun_with_the_same_placement():
    env = dict(os.environ, DRY_RUN="1")
    out = subprocess.run(["bash", ROOT / "launch" / "slurm_horovod.sbatch", "--data", "gs://b/export", "--output",
                          "runs/x"], env=env, capture_output=True, text=True, timeout=30, check=True).stdout
    line = shlex.split(out)
    assert line[:5] == ["srun", "--mpi=pmix", "--cpu-bind=none", "--distribution=block", "--kill-on-bad-exit=1"]
    assert line[5:] == TRAIN
    directives = [ln for ln in (ROOT / "launch" / "slurm_horovod.sbatch").read_text().splitlines()
                  if ln.startswith("#SBATCH")]
    assert "#SBATCH --ntasks-per-node=4" in directives and "#SBATCH --gpus-per-node=4" in directives


def launch(*args, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        return subprocess.run([*HARNESS, "launch", *map(str, args)], capture_output=True, text=True, env=env,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"harness launch {args} hung past {timeout}s: {e.stdout}")


def test_launch_mpi_runs_the_ranks():
    r = launch("mpi", "--np", "2", "--timeout", "60", "--", sys.executable, SCRIPTS / "mpi_control.py")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("MPI_CONTROL") == 2 and '"size": 2' in r.stdout
    assert "launching: mpirun" in r.stderr and "-bind-to none -map-by slot" in r.stderr


def test_launch_horovod_runs_the_ranks():
    r = launch("horovod", "--np", "2", "--timeout", "60", "--", sys.executable, "-c",
               "import os; print('RANK', os.environ['HOROVOD_RANK'], os.environ['TF_USE_LEGACY_KERAS'])")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(line.split(":", 1)[-1] for line in r.stdout.splitlines() if "RANK" in line) == [
        "RANK 0 1", "RANK 1 1"]


def test_launch_fails_with_the_exit_code():
    r = launch("mpi", "--np", "2", "--timeout", "60", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert r.returncode == 2
    assert "WorkerFailedError: mpirun exited with code" in r.stderr


def test_timeout_stops_the_launcher_and_every_rank():
    import psutil

    marker = f"rank-sleeps-{os.getpid()}"
    r = launch("mpi", "--np", "2", "--timeout", "3", "--", sys.executable, "-c", "import time; time.sleep(120)",
               marker, timeout=60)
    assert r.returncode == 2 and "mpirun timed out after 3 s" in r.stderr, r.stderr[-2000:]
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    for p in left:
        p.kill()
    assert not left, "ranks outlived the launcher"
