#!/usr/bin/env bash
# Quickstart on a CPU: generate a small synthetic Criteo-shaped dataset, train DLRM one epoch, print the test AUC.
#   bash quickstart.sh [output_dir]          (about a minute on 2 cores; any extra flags go to dlrm.scripts.main)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# REPO, PY and PYTHONPATH: common/recipe_env.sh (../../common in a checkout, ../common in the Docker image)
source "$([[ -f ../../common/recipe_env.sh ]] && echo ../../common || echo ../common)/recipe_env.sh"
OUT="${1:-/tmp/dlrm_quickstart}"; shift || true
TABLES="100000,50000,20000,10000,5000,2000,1000,500,200,100,100,50,50,20,20,10,10,10,5,5,5,4,4,3,3,2"

"$PY" -m dlrm.scripts.prepare_synthetic_dataset --synthetic_dataset_dir "$OUT/data" --overwrite \
    --synthetic_dataset_num_entries 262144 --synthetic_dataset_test_entries 32768 \
    --synthetic_dataset_table_sizes "$TABLES"
# A training run refuses a checkpoint directory holding another run's checkpoints: keep the previous quickstart's
# checkpoints as checkpoint.previous (replacing the one before it, which this script wrote too).
if [[ -d "$OUT/checkpoint" ]]; then
  rm -rf "$OUT/checkpoint.previous"
  mv "$OUT/checkpoint" "$OUT/checkpoint.previous"
fi
"$PY" -m dlrm.scripts.main --mode train --dataset "$OUT/data" --base_device cpu \
    --batch_size 2048 --test_batch_size 8192 --lr 2.0 --warmup_steps 20 --decay_start_step 64 --decay_steps 64 \
    --embedding_dim 32 --bottom_mlp_sizes 64,32 --top_mlp_sizes 256,128,1 --print_freq 32 \
    --save_checkpoint_path "$OUT/checkpoint" --log_path "$OUT/log.json" "$@"
echo "quickstart: log $OUT/log.json, checkpoint $OUT/checkpoint"
