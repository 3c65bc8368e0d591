#!/usr/bin/env bash
# N ranks of `harness train --backend horovod` under plain mpirun (Open MPI), with Horovod's flags: the same line
# `harness launch mpi` builds (tests/launch/test_mpi_launch.py compares them).
#
#   NP=8 HOSTS=node1:4,node2:4 launch/mpirun_horovod.sh --data gs://bucket/export --output gs://bucket/run
#   DRY_RUN=1 NP=2 launch/mpirun_horovod.sh --data ...      # print the command line only
#
# -bind-to none -map-by slot: ranks fill each host's slots in turn and are not pinned to one core (a pinned rank
# starves TensorFlow's thread pools). -mca pml ob1 -mca btl ^openib: no InfiniBand verbs transport, which breaks
# when processes fork; NCCL or Gloo carry the tensors. -x NAME: what remote ranks need from this environment.
# Without HOSTS, mpirun uses this host, or the batch system's allocation.
set -euo pipefail

NP=${NP:-2}
export TF_USE_LEGACY_KERAS=1   # Keras 2 in every rank

args=(mpirun)
if [ "$(id -u)" = 0 ]; then args+=(--allow-run-as-root); fi
args+=(-np "$NP")
if [ -n "${HOSTS:-}" ]; then args+=(-H "$HOSTS"); fi
args+=(-bind-to none -map-by slot -mca pml ob1 -mca btl ^openib)
for name in TF_USE_LEGACY_KERAS PATH LD_LIBRARY_PATH PYTHONPATH VIRTUAL_ENV CUDA_VISIBLE_DEVICES \
            GOOGLE_APPLICATION_CREDENTIALS; do
  if [ -n "${!name+set}" ]; then args+=(-x "$name"); fi
done
# HARNESS_*, HOROVOD_*, NCCL_*, TF_* settings, but never one process's identity (TF_CONFIG, a launcher's rank).
per_process='^(TF_CONFIG|TF_USE_LEGACY_KERAS|(HARNESS|HOROVOD)_(RANK|SIZE|NUM_WORKERS|LOCAL_RANK|LOCAL_SIZE))$'
for name in $(compgen -e | grep -E '^(HARNESS_|HOROVOD_|NCCL_|TF_)' | grep -vE "$per_process" | LC_ALL=C sort); do
  args+=(-x "$name")
done
args+=(harness train --backend horovod "$@")

if [ -n "${DRY_RUN:-}" ]; then
  printf '%q ' "${args[@]}"; echo
else
  exec "${args[@]}"
fi
