#!/bin/bash
# Runs one Horovod rank on the GPU of its local rank: horovodrun -np N sh hvd_wrapper.sh python main.py ...
# The local rank comes from Open MPI, SLURM or Horovod's own launcher (gloo); without a GPU it changes nothing.
LOCAL_RANK=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${HOROVOD_LOCAL_RANK:-0}}}
if [ -z "${WIDE_DEEP_KEEP_DEVICES}" ]; then
    export CUDA_VISIBLE_DEVICES=${LOCAL_RANK}
fi
exec "$@"
