#!/usr/bin/env bash
# Quickstart on a CPU (a few minutes on 2 cores): generate raw Outbrain-format CSVs, run the Outbrain ETL
# (preproc/prepare_dataset.sh, our engine), train a small Wide & Deep for 4 epochs and print its validation MAP@12, AUC and BCE; then,
# where MovieLens ml-100k is available ($RECSYS_DATA_DIR/movielens/ml-100k), the MovieLens example prints its AUC.
#   bash quickstart.sh [output_dir] [extra flags for main.py, e.g. --xla]
# Rerunning is safe: the generator and the ETL replace only their own earlier outputs (--overwrite), the previous
# checkpoint is kept as model.previous/ and the previous log as results/log.json.N.
# QUICKSTART_DISPLAYS shrinks the data (the tests run a tiny quickstart); QUICKSTART_MOVIELENS=0 skips MovieLens.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# REPO, PY and PYTHONPATH: common/recipe_env.sh (../../common in a checkout, ../common in the Docker image)
source "$([[ -f ../../common/recipe_env.sh ]] && echo ../../common || echo ../common)/recipe_env.sh"
export PYTHON="$PY"   # preproc/prepare_dataset.sh runs the ETL with it
export TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
OUT="${1:-/tmp/wide_deep_quickstart}"; shift || true
mkdir -p "$OUT"

echo "== 1/3 generator: raw Outbrain-format CSVs with a planted signal"
"$PY" -m wide_deep.data.outbrain.generator --output_dir "$OUT/orig" --num_displays "${QUICKSTART_DISPLAYS:-3000}" \
    --seed 3 --overwrite
echo "== 2/3 ETL: our engine on CPU (preproc/prepare_dataset.sh; --engine nvtabular for NVTabular's)"
bash preproc/prepare_dataset.sh "$OUT/orig" "$OUT/data" --cpu --num_partitions 2 --num_train_files 2 --num_valid_files 2 \
    --overwrite
# 8-wide embeddings (NVIDIA's widths, up to 128, are for the full data set): the spec's cardinalities, capped.
"$PY" gen_embedding_sizes.py --feature_spec_in "$OUT/data/feature_spec.yaml" --output "$OUT/embedding_sizes.json" \
    --max_size 8

echo "== 3/3 training: Wide & Deep (FTRL wide part, RMSprop deep part), 4 epochs"
if [[ -d "$OUT/model" ]]; then rm -rf "$OUT/model.previous"; mv "$OUT/model" "$OUT/model.previous"; fi
"$PY" main.py --dataset_path "$OUT/data" --embedding_sizes_file "$OUT/embedding_sizes.json" --cpu \
    --global_batch_size 256 --eval_batch_size 1024 --num_epochs 4 --deep_warmup_epochs 1 \
    --deep_hidden_units 32 32 --deep_learning_rate 0.01 --linear_learning_rate 0.1 --print_freq 1000 \
    --model_dir "$OUT/model" --results_dir "$OUT/results" "$@"
"$PY" - "$OUT/results/log.json" <<'PYEOF'
import sys
from recsys_common.logger import read_log
final = [r["data"] for r in read_log(sys.argv[1]) if r["step"] == []][-1]
print(f"quickstart: Outbrain-format validation MAP@12 {final['eval_map12']:.4f} AUC {final['eval_auc']:.4f} "
      f"BCE {final['eval_loss']:.4f}")
PYEOF

ML100K="${RECSYS_DATA_DIR:-$REPO/../shared/data}/movielens/ml-100k"
if [[ "${QUICKSTART_MOVIELENS:-1}" != 0 && -f "$ML100K/u.data" ]]; then
  echo "== MovieLens example (HugeCTR notebook flow): ETL, training, AUC"
  "$PY" -m wide_deep.movielens.etl --input_dir "$ML100K" --output_dir "$OUT/movielens" --overwrite
  "$PY" -m wide_deep.movielens.train --dataset_path "$OUT/movielens" --max_iter 150 --batch_size 1024 \
      --learning_rate 0.003 --display 50 --eval_interval 50
else
  echo "quickstart: MovieLens example skipped (no $ML100K/u.data; set RECSYS_DATA_DIR)"
fi
echo "quickstart: outputs under $OUT (orig/, data/, model/, results/log.json)"
