#!/usr/bin/env bash
# Multi-node training on a Slurm cluster: one Horovod rank per GPU, every node's GPUs, all ranks one job.
#
#   sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 slurm_multinode.sh dlrm.py \
#       --dataset_path /data/dlrm/binary_dataset --amp --xla --batch_size 65536
#   (any dlrm.py / dcnv2.py flags after the script name; --batch_size is the GLOBAL batch, split over the ranks)
#
# How the ranks start (LAUNCHER):
#   mpi   [default] `srun --mpi=pmix` starts ntasks-per-node processes on every node; Horovod takes its rank and size
#         from MPI. Needs a Horovod built with MPI, which the NGC TensorFlow image of this recipe's Dockerfile has.
#   gloo  `horovodrun --gloo` runs on the first node and starts the ranks over ssh on every node of the allocation
#         (passwordless ssh between the nodes; Horovod without MPI, as `make setup` builds it).
# Environment [default]:
#   CONTAINER_IMAGE []   run inside this image on every node (pyxis/enroot: srun --container-image), e.g. the image
#                        built by `docker/build.sh TensorFlow2/DLRM_DCNv2`, imported with enroot; empty: the nodes'
#                        own Python environment
#   CONTAINER_MOUNTS []  srun --container-mounts, e.g. /lustre/data:/data
#   GPUS_PER_NODE [SLURM_NTASKS_PER_NODE, else 8]   ranks per node
#   WORKDIR [this directory, or /workspace/dlrm_dcnv2 in a container]
#   PYTHON [python]
#   DRY_RUN [0]          1: print the command instead of running it
# Every node must see the dataset at the same path (each rank reads its own tables' files and its slice of the
# numerical features and labels). NCCL picks the network itself; set NCCL_SOCKET_IFNAME / NCCL_IB_HCA if it does not.
# This script cannot run on the machines the recipe is developed on (no Slurm, no GPUs): tests check the commands it
# builds, with stand-ins for srun and horovodrun (tests/test_scripts.py).
#SBATCH --job-name=dlrm_dcnv2
#SBATCH --exclusive
#SBATCH --time=04:00:00
set -euo pipefail

usage() { sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
ENTRY="$1"; shift
case "$ENTRY" in
    dlrm.py|dcnv2.py) ;;
    -h|--help) usage ;;
    *) echo "slurm_multinode.sh: first argument must be dlrm.py or dcnv2.py, got '$ENTRY'" >&2; exit 2 ;;
esac

[[ -n "${SLURM_JOB_NODELIST:-}" ]] || { echo "slurm_multinode.sh: not inside a Slurm allocation (SLURM_JOB_NODELIST unset): submit it with sbatch" >&2; exit 2; }
NNODES="${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}"
GPUS_PER_NODE="${GPUS_PER_NODE:-${SLURM_NTASKS_PER_NODE:-8}}"
GPUS_PER_NODE="${GPUS_PER_NODE%%(*}"          # Slurm writes "8(x2)" when every node has the same count
NP=$((NNODES * GPUS_PER_NODE))
LAUNCHER="${LAUNCHER:-mpi}"
PYTHON="${PYTHON:-python}"
CONTAINER_IMAGE="${CONTAINER_IMAGE:-}"
if [[ -n "$CONTAINER_IMAGE" ]]; then
    WORKDIR="${WORKDIR:-/workspace/dlrm_dcnv2}"
else
    WORKDIR="${WORKDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
fi

container=()
if [[ -n "$CONTAINER_IMAGE" ]]; then
    container=(--container-image "$CONTAINER_IMAGE" --container-workdir "$WORKDIR")
    [[ -n "${CONTAINER_MOUNTS:-}" ]] && container+=(--container-mounts "$CONTAINER_MOUNTS")
fi
# Keras 2 (tf-keras) for Horovod's TensorFlow integration; one process per GPU, pinned by its local rank (hvd_utils.init).
export TF_USE_LEGACY_KERAS=1

case "$LAUNCHER" in
    mpi)
        cmd=(srun --mpi=pmix --nodes "$NNODES" --ntasks-per-node "$GPUS_PER_NODE" --kill-on-bad-exit=1
             "${container[@]}" --chdir "$WORKDIR" "$PYTHON" -u "$ENTRY" "$@") ;;
    gloo)
        [[ -z "$CONTAINER_IMAGE" ]] || { echo "slurm_multinode.sh: LAUNCHER=gloo starts ranks over ssh and cannot use CONTAINER_IMAGE; use LAUNCHER=mpi" >&2; exit 2; }
        hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/:$GPUS_PER_NODE/" | paste -sd, -)
        cmd=(horovodrun --gloo -np "$NP" -H "$hosts" "$PYTHON" -u "$WORKDIR/$ENTRY" "$@") ;;
    *) echo "slurm_multinode.sh: LAUNCHER must be mpi or gloo, got '$LAUNCHER'" >&2; exit 2 ;;
esac

echo "[slurm_multinode] $NNODES node(s) x $GPUS_PER_NODE rank(s) = $NP ranks, launcher $LAUNCHER: ${cmd[*]}"
if [[ "${DRY_RUN:-0}" == "1" ]]; then
    exit 0
fi
exec "${cmd[@]}"
