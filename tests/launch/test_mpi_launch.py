"""`harness launch mpi` / `harness launch horovod`: the command lines, --dry-run, the scripts in launch/ and real
2-rank launches of small commands (no TensorFlow), each under a timeout that fails the test."""
import math
import os
import pathlib
import secrets
import shlex
import subprocess
import sys

import pytest

from harness import cli
from harness.distribute import environment
from harness.errors import ConfigError
from harness.launch import mpi as launch_mpi

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "distribute" / "scripts"
BIN = pathlib.Path(sys.executable).parent
HARNESS = [sys.executable, "-m", "harness.cli"]
TRAIN = ["harness", "train", "--backend", "horovod", "--data", "gs://b/export", "--output", "runs/x"]


def _exported(line):
    return [line[i + 1] for i, t in enumerate(line) if t == "-x"]


def test_mpirun_command_has_horovods_flags_and_exports():
    env = {"PATH": "/bin", "NCCL_DEBUG": "INFO", "HARNESS_SHARED_DATA": "/d", "TF_CONFIG": "{}",
           "HOROVOD_RANK": "3", "OMPI_COMM_WORLD_RANK": "1", "HOME": "/root", "TF_CPP_MIN_LOG_LEVEL": "2",
           "GCS_RETRY_CONFIG_MAX_RETRIES": "3"}   # TensorFlow's Cloud Storage settings reach every rank (issue 45)
    line = launch_mpi.mpirun_command(TRAIN, np=4, hosts="a:2,b:2", environ=env, as_root=False)
    assert line[:5] == ["mpirun", "-np", "4", "-H", "a:2,b:2"]
    joined = " ".join(line)
    assert ("-bind-to none -map-by slot -mca pml ob1 -mca btl ^openib -mca btl_tcp_if_exclude lo,docker0 "
            "--tag-output -x") in joined   # Horovod docs/mpi.rst: no loopback / Docker bridge; a rank per line
    assert _exported(line) == ["TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "PATH", "GCS_RETRY_CONFIG_MAX_RETRIES",
                               "HARNESS_SHARED_DATA", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME=^lo,docker0"]  # not TF_CONFIG
    assert line[-len(TRAIN):] == TRAIN
    # The user's own interface choice is exported as it is, not replaced.
    own = launch_mpi.mpirun_command(TRAIN, np=2, environ={"NCCL_SOCKET_IFNAME": "eth1"}, as_root=False)
    assert _exported(own) == ["TF_USE_LEGACY_KERAS", "NCCL_SOCKET_IFNAME"]
    rooted = launch_mpi.mpirun_command(TRAIN, np=2, environ={}, as_root=True)
    assert rooted[:4] == ["mpirun", "--allow-run-as-root", "-np", "2"] and "-H" not in rooted


def test_horovodrun_command_and_controller(monkeypatch):
    monkeypatch.delenv("HARNESS_WORKER_WAIT_S", raising=False)
    # Gloo gets the harness's peer wait (120 s), not its own 30 s default
    assert launch_mpi.horovodrun_command(TRAIN, np=2, horovodrun="horovodrun") == [
        "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "--gloo-timeout-seconds", "120", *TRAIN]
    monkeypatch.setenv("HARNESS_WORKER_WAIT_S", "44.5")
    assert launch_mpi.horovodrun_command(TRAIN, np=2, horovodrun="horovodrun")[5:8] == [
        "--gloo", "--gloo-timeout-seconds", "45"]
    own = launch_mpi.horovodrun_command(TRAIN, np=2, horovodrun="horovodrun", extra=["--gloo-timeout-seconds", "9"])
    assert own.count("--gloo-timeout-seconds") == 1 and own[own.index("--gloo-timeout-seconds") + 1] == "9"
    line = launch_mpi.horovodrun_command(TRAIN, np=8, hosts="a:4,b:4", controller="mpi", horovodrun="horovodrun")
    assert line[1:6] == ["-np", "8", "-H", "a:4,b:4", "--mpi"]
    with pytest.raises(ConfigError, match="controller must be one of"):
        launch_mpi.horovodrun_command(TRAIN, np=2, controller="nccl")


def test_network_interfaces_where_hosts_name_their_links_differently():
    """`--network-interface eno1,enp129s0f1`: mpirun includes those (each host the names it has) instead of
    excluding lo and docker0, NCCL gets the list (a user's NCCL_SOCKET_IFNAME gives way to the flag); horovodrun
    gets --network-interfaces, which skips its search for one name every host has (horovod/horovod#2431)."""
    line = launch_mpi.mpirun_command(TRAIN, np=2, environ={"NCCL_SOCKET_IFNAME": "eth1"}, as_root=False,
                                     interfaces="eno1, enp129s0f1")
    joined = " ".join(line)
    assert "-mca btl_tcp_if_include eno1,enp129s0f1 --tag-output" in joined and "btl_tcp_if_exclude" not in joined
    assert _exported(line) == ["TF_USE_LEGACY_KERAS", "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME=eno1,enp129s0f1"]
    line = launch_mpi.horovodrun_command(TRAIN, np=2, horovodrun="horovodrun", interfaces="eno1,enp129s0f1",
                                         local_interfaces=["lo", "enp129s0f1"])
    assert line[:11] == ["env", "HARNESS_NETWORK_INTERFACES=eno1,enp129s0f1", "horovodrun", "-np", "2", "-H",
                         "localhost:2", "--gloo", "--gloo-timeout-seconds", "120", "--network-interfaces"]
    assert line[11] == "enp129s0f1"   # the launcher's host's name: horovodrun serves the rendezvous on it
    with pytest.raises(ConfigError, match=r"^--network-interface eno1: none is on this host \(lo, eth0\)"):
        launch_mpi.horovodrun_command(TRAIN, np=2, interfaces="eno1", local_interfaces=["lo", "eth0"])
    for bad in ("eth0,", "a/b", "averyveryverylongname0"):
        with pytest.raises(ConfigError, match="--network-interface expects interface names.*got '"):
            launch_mpi.check_interfaces(bad)


def test_each_rank_gives_gloo_the_interface_its_host_has():
    from harness.distribute.horovod import gloo_interface
    from harness.errors import ClusterConfigError

    given = {"HOROVOD_GLOO_IFACE": "eno1", "NCCL_SOCKET_IFNAME": "eno1", "HOROVOD_RANK": "1",
             "HARNESS_NETWORK_INTERFACES": "eno1,enp129s0f1"}
    env = dict(given)
    assert gloo_interface(env, ["lo", "enp129s0f1"]) == "enp129s0f1"
    assert env == dict(given, HOROVOD_GLOO_IFACE="enp129s0f1", NCCL_SOCKET_IFNAME="eno1,enp129s0f1")
    env = dict(given)
    assert gloo_interface(env, ["lo", "eno1"]) == "eno1" and env == dict(given, NCCL_SOCKET_IFNAME="eno1,enp129s0f1")
    assert gloo_interface({"HOROVOD_GLOO_IFACE": "eth0"}, ["lo", "eth0"]) == "eth0"   # horovodrun's own choice
    assert gloo_interface({}, ["lo"]) is None
    with pytest.raises(ClusterConfigError, match=r"^rank 1 on .*: none of the network interfaces given \(eno1, "
                                                 r"enp129s0f1\) is on this host, which has lo, eth0: add this host's "
                                                 r"name .* --network-interface eno1,enp129s0f1,eth0\)$"):
        gloo_interface(dict(given), ["lo", "eth0"])


def test_ranks_on_cpu_beside_ranks_on_gpus_are_named_before_the_first_collective():
    from harness.distribute.horovod import agree_devices
    from harness.errors import ClusterConfigError

    agree_devices(0, lambda mine: [(0, "a"), (0, "b")])
    agree_devices(1, lambda mine: [(1, "a"), (1, "a"), (1, "b")])
    with pytest.raises(ClusterConfigError, match=r"^some ranks have no GPU \(ranks 2, 3 on b\) and the others have "
                                                 r"\(ranks 0, 1 on a\): Horovod runs one rank per GPU"):
        agree_devices(1, lambda mine: [(1, "a"), (1, "a"), (0, "b"), (0, "b")])


@pytest.mark.parametrize("hosts, message", [("a:2,b", "host:slots"), ("a:0", "host:slots"),
                                            ("a:1,b:1", "offers 2 slots for --np 4")])
def test_bad_hosts_are_named(hosts, message):
    with pytest.raises(ConfigError, match=message):
        launch_mpi.check_hosts(4, hosts)
    with pytest.raises(ConfigError, match="no command"):
        launch_mpi.mpirun_command([], np=2)


def test_secrets_and_host_devices_are_not_exported(capsys, monkeypatch):
    """Terraform's TF_VAR_* share TensorFlow's prefix; CUDA_VISIBLE_DEVICES describes this host only (horovodrun
    does not forward it either). Only named variables travel, plus `--export NAME`."""
    monkeypatch.setenv("TF_VAR_db_password", "hunter2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("FOO", "bar")
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    assert cli.main(["launch", "mpi", "--np", "2", "--dry-run", "--", *TRAIN]) == 0
    printed = capsys.readouterr().out
    assert "TF_VAR_db_password" not in printed and "CUDA_VISIBLE_DEVICES" not in printed
    assert "-x FOO" not in printed
    assert cli.main(["launch", "mpi", "--np", "2", "--export", "FOO", "--export", "PATH", "--dry-run", "--",
                     *TRAIN]) == 0
    line = shlex.split(capsys.readouterr().out)
    assert "FOO" in _exported(line) and _exported(line).count("PATH") == 1
    with pytest.raises(ConfigError, match="--export NOT_SET_HERE: NOT_SET_HERE is not set"):
        launch_mpi.mpirun_command(TRAIN, np=2, export=["NOT_SET_HERE"])
    with pytest.raises(ConfigError, match="--export TF_CONFIG: TF_CONFIG describes one process"):
        launch_mpi.mpirun_command(TRAIN, np=2, environ={"TF_CONFIG": "{}"}, export=["TF_CONFIG"])


def test_a_credential_typed_into_the_line_is_printed_redacted(capsys, monkeypatch):
    """Names travel (`-x NAME`); a value typed into the line (`-x HF_TOKEN=...`) is shown as <redacted>."""
    value = "hx-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("MY_API_KEY", value)
    assert cli.main(["launch", "mpi", "--np", "2", "--dry-run", "--export", "MY_API_KEY",
                     f"--mpirun-args=-x HF_TOKEN={value} -x NCCL_DEBUG=INFO", "--", *TRAIN]) == 0
    out, err = capsys.readouterr()
    assert value not in out + err
    line = shlex.split(out)
    assert "HF_TOKEN=<redacted>" in line and "NCCL_DEBUG=INFO" in line and "MY_API_KEY" in _exported(line)
    assert "the values of HF_TOKEN are <redacted> in the printed line" in err


@pytest.mark.parametrize("command, match", [
    (["harness", "train", "--data", "d"], "harness train without --backend under MPI would train one "
                                          "independent copy per rank.*add --backend horovod after `harness train`"),
    (["harness", "train", "--backend", "tf"], "with --backend tf"),
    ([sys.executable, "-m", "harness.cli", "train", "--backend=tf"], "with --backend tf"),
    (["/opt/venv/bin/harness", "bench", "train", "--data", "synthetic"], "benchmark several workers with"),
])
def test_harness_train_under_mpi_needs_the_horovod_backend(command, match):
    for build in (lambda: launch_mpi.mpirun_command(command, np=2),
                  lambda: launch_mpi.horovodrun_command(command, np=2)):
        with pytest.raises(ConfigError, match=match):
            build()


def test_horovod_backend_and_other_commands_are_accepted():
    for command in (TRAIN, [sys.executable, "-m", "harness.cli", "train", "--backend=horovod"],
                    [sys.executable, "train.py"], ["harness", "inspect", "d"], ["python", "/mnt/harness", "train"]):
        assert launch_mpi.horovod_backend_error(command) is None, command


def test_dry_run_without_the_backend_fails_naming_the_fix():
    r = subprocess.run([*HARNESS, "launch", "mpi", "--np", "2", "--dry-run", "--", "harness", "train", "--data",
                        "d"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "ConfigError" in r.stderr and "add --backend horovod" in r.stderr, r.stderr


def test_dry_run_prints_the_lines(capsys):
    assert cli.main(["launch", "mpi", "--np", "2", "-H", "localhost:2", "--dry-run", "--", *TRAIN]) == 0
    printed = capsys.readouterr().out.strip()
    assert shlex.split(printed) == launch_mpi.mpirun_command(TRAIN, np=2, hosts="localhost:2")
    assert cli.main(["launch", "horovod", "--np", "2", "--controller", "mpi", "--dry-run", "--", *TRAIN]) == 0
    line = shlex.split(capsys.readouterr().out.strip())
    assert line[0].endswith("horovodrun") and line[1:] == ["-np", "2", "-H", "localhost:2", "--mpi", *TRAIN]
    assert cli.main(["launch", "horovod", "--np", "2", "--dry-run", "--", *TRAIN]) == 0
    line = shlex.split(capsys.readouterr().out.strip())
    assert line[1:8] == ["-np", "2", "-H", "localhost:2", "--gloo", "--gloo-timeout-seconds",
                         str(math.ceil(environment.read_worker_wait_s()))]


@pytest.mark.parametrize("extra", [{}, {"NCCL_SOCKET_IFNAME": "eth0", "EXPORT": "FOO PATH", "FOO": "1"}])
def test_mpirun_script_shows_the_same_line(extra):
    env = dict(os.environ, DRY_RUN="1", NP="4", HOSTS="a:2,b:2", NCCL_DEBUG="INFO", TF_CONFIG="{}",
               HOROVOD_RANK="1", TF_VAR_db_password="hunter2", CUDA_VISIBLE_DEVICES="0")
    env.pop("NCCL_SOCKET_IFNAME", None)
    env.update(extra)
    out = subprocess.run(["bash", ROOT / "launch" / "mpirun_horovod.sh", "--data", "gs://b/export", "--output",
                          "runs/x"], env=env, capture_output=True, text=True, timeout=30, check=True).stdout
    line = shlex.split(out)
    assert line == launch_mpi.mpirun_command(TRAIN, np=4, hosts="a:2,b:2", environ=env,
                                             export=env.get("EXPORT", "").split())
    assert "TF_VAR_db_password" not in out and "CUDA_VISIBLE_DEVICES" not in out
    assert "--tag-output" in line and "btl_tcp_if_exclude" in line
    assert ("NCCL_SOCKET_IFNAME" if extra else "NCCL_SOCKET_IFNAME=^lo,docker0") in _exported(line)


@pytest.mark.parametrize("export, message", [("NOT_SET_HERE", "is not set"), ("TF_CONFIG", "describes one process"),
                                             ("HOROVOD_RANK", "describes one process")])
def test_mpirun_script_refuses_what_launch_mpi_refuses(export, message):
    env = dict(os.environ, DRY_RUN="1", EXPORT=export, TF_CONFIG="{}", HOROVOD_RANK="1")
    env.pop("NOT_SET_HERE", None)
    r = subprocess.run(["bash", ROOT / "launch" / "mpirun_horovod.sh"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and f"EXPORT: {export} {message}" in r.stderr, r.stderr
    with pytest.raises(ConfigError, match=f"--export {export}: {export} {message}"):
        launch_mpi.mpirun_command(TRAIN, np=2, environ=env, export=[export])


def test_slurm_script_runs_srun_with_the_same_placement():
    env = {k: v for k, v in os.environ.items()
           if k not in ("NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_exclude", "SLURM_CPUS_PER_TASK")}
    env["DRY_RUN"] = "1"
    out = subprocess.run(["bash", ROOT / "launch" / "slurm_horovod.sbatch", "--data", "gs://b/export", "--output",
                          "runs/x"], env=env, capture_output=True, text=True, timeout=30, check=True).stdout
    line = shlex.split(out)
    # Slurm 22.05+: srun no longer inherits sbatch's --cpus-per-task; NCCL and Open MPI off lo and docker0.
    directives = [ln for ln in (ROOT / "launch" / "slurm_horovod.sbatch").read_text().splitlines()
                  if ln.startswith("#SBATCH")]
    (cpus,) = [d.split("=")[1] for d in directives if d.startswith("#SBATCH --cpus-per-task=")]
    assert line[:2] == ["NCCL_SOCKET_IFNAME=^lo,docker0", "OMPI_MCA_btl_tcp_if_exclude=lo,docker0"]
    assert line[2:9] == ["srun", "--mpi=pmix", "--cpu-bind=none", "--distribution=block", "--kill-on-bad-exit=1",
                         "--label", f"--cpus-per-task={cpus}"]
    assert line[9:] == TRAIN
    assert "#SBATCH --ntasks-per-node=4" in directives and "#SBATCH --gpus-per-node=4" in directives
    inside = dict(env, SLURM_CPUS_PER_TASK="6", NCCL_SOCKET_IFNAME="ib0")   # as sbatch sets it in the job
    out = subprocess.run(["bash", ROOT / "launch" / "slurm_horovod.sbatch"], env=inside, capture_output=True,
                         text=True, timeout=30, check=True).stdout
    assert "--cpus-per-task=6" in shlex.split(out) and shlex.split(out)[0] == "NCCL_SOCKET_IFNAME=ib0"


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


def test_first_failure_reads_the_launchers_report_not_the_ranks_output():
    first = launch_mpi.FirstFailure()
    for line in ["[1,0]<stdout>:Process name: 7\n", "[1,0]<stdout>:Exit code: 9\n",   # a rank's own text
                 "  Process name: [[23946,1],1]\n", "  Exit code:    2\n", "Process name: 0\n", "Exit code: 5\n"]:
        first.feed(line)
    assert (first.rank, first.code, first.host) == (1, 2, None)
    signalled = launch_mpi.FirstFailure()
    signalled.feed("mpirun noticed that process rank 3 with PID 0 on node node2 exited on signal 9 (Killed).\n")
    assert (signalled.rank, signalled.code, signalled.host) == (3, 137, "node2")
    assert [launch_mpi.rank_host(["horovodrun", "-np", "4", "-H", "a:2,b:2"], r) for r in range(4)] == [
        "a", "a", "b", "b"]
    assert launch_mpi.rank_host(["mpirun", "-np", "2"], 1) is None
