#!/usr/bin/env bash
# N ranks of `harness train --backend horovod` under plain mpirun (Open MPI), with Horovod's flags: the same line
# `harness launch mpi` builds (tests/launch/test_mpi_launch.py compares them).
#
#   NP=8 HOSTS=node1:4,node2:4 launch/mpirun_horovod.sh --data gs://bucket/export --output gs://bucket/run
#   DRY_RUN=1 NP=2 launch/mpirun_horovod.sh --data ...      # print the command line only
#   EXPORT="WANDB_API_KEY MY_SETTING" NP=8 ... launch/mpirun_horovod.sh ...   # further variables for every rank
#
# -bind-to none -map-by slot: ranks fill each host's slots in turn and are not pinned to one core (a pinned rank
# starves TensorFlow's thread pools). -mca pml ob1 -mca btl ^openib: no InfiniBand verbs transport, which breaks
# when processes fork; NCCL or Gloo carry the tensors. -mca btl_tcp_if_exclude lo,docker0 and
# NCCL_SOCKET_IFNAME=^lo,docker0: MPI and NCCL never pick the loopback or Docker bridge, which are not routed
# between hosts (Horovod docs/mpi.rst). --tag-output: each line prefixed with its rank. -x NAME: what remote ranks
# need from this environment, by name (never all TF_*: Terraform's TF_VAR_* secrets share the prefix; never
# CUDA_VISIBLE_DEVICES, which is this host's). Without HOSTS, mpirun uses this host, or the batch system's
# allocation.
# Ports (README, Security): between the job's hosts only, TCP both ways: ssh 22 from this host to the others, Open
# MPI's runtime and TCP BTL (pinned to 50000-50199 by adding to the mpirun line: -mca oob_tcp_static_ipv4_ports
# 50000 -mca oob_tcp_static_ipv6_ports 50000 -mca btl_tcp_port_min_v4 50001 -mca btl_tcp_port_range_v4 199, the
# same _v6; harness.ports.open_mpi_pin), a second BTL socket and NCCL on ephemeral ports; no other host needs any.
set -euo pipefail

NP=${NP:-2}
export TF_USE_LEGACY_KERAS=1   # Keras 2 in every rank

args=(mpirun)
if [ "$(id -u)" = 0 ]; then args+=(--allow-run-as-root); fi
args+=(-np "$NP")
if [ -n "${HOSTS:-}" ]; then args+=(-H "$HOSTS"); fi
args+=(-bind-to none -map-by slot -mca pml ob1 -mca btl ^openib -mca btl_tcp_if_exclude lo,docker0 --tag-output)
exported=" "
for name in TF_USE_LEGACY_KERAS TF_CPP_MIN_LOG_LEVEL TF_FORCE_GPU_ALLOW_GROWTH PYTHONUNBUFFERED PATH \
            LD_LIBRARY_PATH PYTHONPATH VIRTUAL_ENV GOOGLE_APPLICATION_CREDENTIALS; do
  if [ -n "${!name+set}" ]; then args+=(-x "$name"); exported+="$name "; fi
done
# HARNESS_*, HOROVOD_*, NCCL_*, GCS_* (TensorFlow's Cloud Storage) settings, but never one process's identity (a launcher's rank).
per_process='^(HARNESS_(RANK|NUM_WORKERS|LOCAL_RANK|LOCAL_SIZE)|HOROVOD_(RANK|SIZE|LOCAL_RANK|LOCAL_SIZE))$'
for name in $(compgen -e | grep -E '^(HARNESS_|HOROVOD_|NCCL_|GCS_)' | grep -vE "$per_process" | LC_ALL=C sort); do
  args+=(-x "$name"); exported+="$name "
done
for name in ${EXPORT:-}; do
  if [ -z "${!name+set}" ]; then echo "EXPORT: $name is not set in this environment" >&2; exit 2; fi
  if [ "$name" = TF_CONFIG ] || [[ "$name" =~ $per_process ]]; then
    echo "EXPORT: $name describes one process" >&2; exit 2
  fi
  if [[ "$exported" != *" $name "* ]]; then args+=(-x "$name"); exported+="$name "; fi
done
if [ -z "${NCCL_SOCKET_IFNAME+set}" ]; then args+=(-x "NCCL_SOCKET_IFNAME=^lo,docker0"); fi
args+=(harness train --backend horovod "$@")

if [ -n "${DRY_RUN:-}" ]; then
  printf '%q ' "${args[@]}"; echo
else
  exec "${args[@]}"
fi
