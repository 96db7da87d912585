#!/usr/bin/env bash
# make quickstart's checkpoints -> the CPU Triton repository -> a real Triton server -> AUC through the server and
# latency, then the recipe's own --mode inference on the same batch sizes (the README's Deployment figures).
#   bash deployment/serve_quickstart.sh [quickstart_dir] [output_dir] [models...]
# Defaults: /tmp/dlrm_dcnv2_quickstart, /tmp/dlrm_dcnv2_serving, "dlrm dcnv2". The server binds 127.0.0.1 on free
# ports and is stopped on exit, also on failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# REPO, PY and PYTHONPATH: common/recipe_env.sh (../../common in a checkout, ../common in the Docker image)
source "$([[ -f ../../common/recipe_env.sh ]] && echo ../../common || echo ../common)/recipe_env.sh"
export TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
QS="${1:-/tmp/dlrm_dcnv2_quickstart}"; OUT="${2:-/tmp/dlrm_dcnv2_serving}"; shift 2 || shift $#
if [[ $# -gt 0 ]]; then MODELS=("$@"); else MODELS=(dlrm dcnv2); fi
BATCHES=(1 64 1024 8192)
mkdir -p "$OUT"
# The quickstart's model flags (quickstart.sh): --mode inference rebuilds the model from flags, then checks them
# against the checkpoint.
declare -A FLAGS=(
  [dlrm]="--interaction dot_tensorflow --embedding_dim 32 --bottom_mlp_dims 64,32 --top_mlp_dims 256,128,1"
  [dcnv2]="--embedding_dim 16 --bottom_mlp_dims 64,32,16 --top_mlp_dims 128,64,1 --num_cross_layers 3 --cross_layer_projection_dim 64"
)
SERVER=""
stop_server() { if [[ -n "$SERVER" ]]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=""; fi; }
trap stop_server EXIT

for MODEL in "${MODELS[@]}"; do
  echo "== $MODEL: deploy"
  "$PY" -m deployment.deploy --checkpoint-dir "$QS/${MODEL}_checkpoint" --model-repository-path "$OUT/repo_$MODEL" \
      --dataset_path "$QS/data" --cpu --overwrite --triton-backend python
  read -r HTTP_PORT GRPC_PORT < <("$PY" -c "from recsys_common.machine import free_port as f; print(f(), f())")
  "$PY" -m recsys_common.serving.triton_server --model-repository "$OUT/repo_$MODEL" --models "$MODEL-onnx" \
      --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" > "$OUT/server_$MODEL.log" 2>&1 &
  SERVER=$!
  echo "== $MODEL: accuracy through the server (waits for the model to be ready)"
  "$PY" -m deployment.evaluate_accuracy --dataset_path "$QS/data" --checkpoint "$QS/${MODEL}_checkpoint" \
      --model_name "$MODEL-onnx" --server_url "127.0.0.1:$GRPC_PORT" --http_url "127.0.0.1:$HTTP_PORT" \
      --batch_size 8192 --output_json "$OUT/accuracy_$MODEL.json"
  echo "== $MODEL: latency through the server"
  "$PY" -m deployment.evaluate_latency --server-url "127.0.0.1:$GRPC_PORT" --model-name "$MODEL-onnx" \
      --dataset_path "$QS/data" --batch-sizes "${BATCHES[@]}" --concurrency 1 2 --num-requests 50 \
      --warmup-requests 5 --output-json "$OUT/latency_$MODEL.json" --output-png "$OUT/latency_$MODEL.png"
  stop_server
  echo "== $MODEL: the recipe's --mode inference, same batch sizes"
  # shellcheck disable=SC2086
  "$PY" "$MODEL.py" --mode inference --cpu --dataset_path "$QS/data" --restore_checkpoint_path "$QS/${MODEL}_checkpoint" \
      --inference_batch_sizes "$(IFS=,; echo "${BATCHES[*]}")" --inference_steps 50 --inference_warmup_steps 5 \
      --log_path "$OUT/inference_$MODEL.json" ${FLAGS[$MODEL]}
done
