# GPU image of harness: CUDA 12.5 and cuDNN 9 (the build TensorFlow 2.21 is made for), TensorFlow 2.21.0 and tf-keras,
# Open MPI, NCCL, Horovod 0.28.1 built with NCCL GPU operations (and MPI + Gloo controllers), and the harness.
# It installs through tools/install.sh, the script `make install` and CI run, so the image gets what CI tests.
#
#   docker build -t harness:0.1.0 .
#   docker run --rm --gpus all --shm-size=16g -v "$PWD/data:/data" harness:0.1.0 harness train --data /data ...
# More (several workers, mpirun, Kubernetes) in README.md, "Docker and Kubernetes".

ARG CUDA_VERSION=12.5.1
ARG UBUNTU=ubuntu22.04

# --- build: compilers, CUDA toolkit and NCCL headers for Horovod's extension ----------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-${UBUNTU} AS build
ARG TF_VERSION=2.21.0
ARG TF_KERAS_VERSION=2.21.0
# GPU architectures Horovod's CUDA kernels are compiled for: V100, A100, A10/RTX 30, L4/RTX 40, H100/H200.
ARG CUDA_CC_LIST=70,80,86,89,90
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# Python 3.11 (Ubuntu 22.04's python3.11 package; its default python3 is 3.10, older than setup.cfg allows), the
# version CI tests. Open MPI, g++ and cmake are installed by tools/install.sh.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/harness
COPY pyproject.toml setup.cfg README.md ./
COPY tools/ tools/
COPY harness/ harness/

# Exact versions within setup.cfg's ranges (pip reads PIP_CONSTRAINT on every install tools/install.sh runs).
RUN printf 'tensorflow==%s\ntf-keras==%s\n' "$TF_VERSION" "$TF_KERAS_VERSION" > /opt/constraints.txt
# HARNESS_HOROVOD_GPU=1: a GPU build even though no GPU is visible while building (nvcc is what matters).
ENV PIP_CONSTRAINT=/opt/constraints.txt HARNESS_HOROVOD_GPU=1 HOROVOD_GPU_OPERATIONS=NCCL PYTHON=python3.11 \
    HOROVOD_BUILD_CUDA_CC_LIST=${CUDA_CC_LIST}
RUN bash tools/install.sh /opt/venv gpu,mlflow \
 && /opt/venv/bin/python -c "import horovod.tensorflow as hvd; assert hvd.nccl_built(), 'Horovod without NCCL'"

# --- final: CUDA runtime (libcudart, NCCL), Open MPI, ssh, the venv; no compilers -------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
# The port sshd listens on for an MPIJob (its launcher reaches the workers over ssh) and the non-root user; both
# must match harness/launch/k8s.py (HOME, UID) and tests/launch/test_k8s_image.py checks that they do.
ARG SSH_PORT=2222
ARG HARNESS_USER=harness
ARG HARNESS_UID=1000
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive

# Package versions are those of the pinned base image's Ubuntu release (security updates included); python3.11 is
# the interpreter the venv was made with.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 openmpi-bin libopenmpi3 openssh-server openssh-client \
 && rm -rf /var/lib/apt/lists/*

# ssh between pods as the mpi-operator expects of a non-root image: no host key prompts, no known_hosts writes
# (the .ssh folder is a mounted Secret), sshd on SSH_PORT run by the user with the keys the operator mounts.
RUN sed -i "s/[ #]\(.*StrictHostKeyChecking \).*/ \1no/g" /etc/ssh/ssh_config \
 && echo "    UserKnownHostsFile /dev/null" >> /etc/ssh/ssh_config \
 && sed -i "s/[ #]\(.*Port \).*/ \1${SSH_PORT}/g" /etc/ssh/ssh_config \
 && mkdir -p /var/run/sshd \
 && useradd --create-home --uid "${HARNESS_UID}" --user-group --shell /bin/bash "${HARNESS_USER}" \
 && printf 'Port %s\nPidFile /home/%s/sshd.pid\nHostKey /home/%s/.ssh/id_rsa\nStrictModes no\n' \
      "${SSH_PORT}" "${HARNESS_USER}" "${HARNESS_USER}" > "/home/${HARNESS_USER}/.sshd_config" \
 && chown "${HARNESS_USER}:${HARNESS_USER}" "/home/${HARNESS_USER}/.sshd_config"

# The venv's editable install points at /opt/harness: both keep their paths from the build stage.
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/harness /opt/harness
# Open MPI's shared-memory transport copies between ranks with CMA (process_vm_readv), which Docker's default
# seccomp profile forbids: ranks print "Read -1, expected ..., errno = 1" (Horovod docs/docker.rst). Plain copies.
ENV PATH=/opt/venv/bin:${PATH} VIRTUAL_ENV=/opt/venv TF_USE_LEGACY_KERAS=1 PYTHONUNBUFFERED=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none

USER ${HARNESS_USER}
WORKDIR /home/${HARNESS_USER}
EXPOSE 2222
CMD ["harness", "--help"]
