#!/usr/bin/env bash
# Quickstart on a CPU: generate a small synthetic Criteo-shaped dataset, train DLRM and then DCNv2 for one epoch
# each (about a minute each on 2 cores), print their test AUC.
#   bash quickstart.sh [output_dir] [extra flags for both dlrm.py and dcnv2.py, e.g. --amp or --xla]
# Rerunning is safe: the dataset is regenerated in place, each model's previous checkpoints are kept as
# <model>_checkpoint.previous and its previous log as log_<model>.json.N.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# REPO, PY and PYTHONPATH: common/recipe_env.sh (../../common in a checkout, ../common in the Docker image)
source "$([[ -f ../../common/recipe_env.sh ]] && echo ../../common || echo ../common)/recipe_env.sh"
export TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
OUT="${1:-/tmp/dlrm_dcnv2_quickstart}"; shift || true
TABLES="100000,50000,20000,10000,5000,2000,1000,500,200,100,100,50,50,20,20,10,10,10,5,5,5,4,4,3,3,2"

# QUICKSTART_TRAIN_ROWS / QUICKSTART_TEST_ROWS shrink the dataset (the tests run a tiny quickstart).
"$PY" -m dlrm_dcnv2.dataloading.prepare_synthetic_dataset --synthetic_dataset_dir "$OUT/data" --overwrite \
    --synthetic_dataset_num_entries "${QUICKSTART_TRAIN_ROWS:-262144}" \
    --synthetic_dataset_test_entries "${QUICKSTART_TEST_ROWS:-32768}" --synthetic_dataset_table_sizes "$TABLES"

# 128 steps of batch 2048 each; the schedule (warmup, constant, poly-2 decay to 0) is scaled down to that length.
COMMON=(--dataset_path "$OUT/data" --cpu --batch_size 2048 --valid_batch_size 8192 --warmup_steps 20
        --decay_start_step 64 --decay_steps 64 --print_freq 32)
train() {  # train <model> <flags...>: one epoch, checkpoint at the end, the previous run's checkpoints kept aside
  local model="$1"; shift
  if [[ -d "$OUT/${model}_checkpoint" ]]; then
    rm -rf "$OUT/${model}_checkpoint.previous"
    mv "$OUT/${model}_checkpoint" "$OUT/${model}_checkpoint.previous"
  fi
  echo "== $model"
  "$PY" "$model.py" "${COMMON[@]}" --save_checkpoint_path "$OUT/${model}_checkpoint" \
      --log_path "$OUT/log_${model}.json" "$@"
}
# DLRM: SGD (its default optimizer) and the dot interaction written in TensorFlow (the CUDA op is GPU-only).
train dlrm --learning_rate 2.0 --interaction dot_tensorflow --embedding_dim 32 --bottom_mlp_dims 64,32 \
    --top_mlp_dims 256,128,1 "$@"
# DCNv2: Adam (its default) and 3 low-rank cross layers, scaled down.
train dcnv2 --learning_rate 0.002 --embedding_dim 16 --bottom_mlp_dims 64,32,16 --top_mlp_dims 128,64,1 \
    --num_cross_layers 3 --cross_layer_projection_dim 64 "$@"

"$PY" - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
for model in ("dlrm", "dcnv2"):
    final = None
    with open(os.path.join(out, f"log_{model}.json")) as f:
        for line in f:
            record = json.loads(line.split(" ", 1)[1]) if line.startswith("DLLL ") else None
            if record and record.get("step") == [] and "auc" in record.get("data", {}):
                final = record["data"]
    print(f"quickstart: {model}: test AUC {final['auc']:.4f} (exact {final['auc_exact']:.4f}), "
          f"{final['throughput']:,.0f} training samples/s")
PYEOF
echo "quickstart: logs $OUT/log_dlrm.json $OUT/log_dcnv2.json, checkpoints $OUT/dlrm_checkpoint $OUT/dcnv2_checkpoint"
