#!/usr/bin/env bash
# Every recipe's quick-start model served by the real Triton server (the CPU repository), measured by our client and
# by perf_analyzer: see triton_serving.py (at commit a2f23de it also served the native repositories on MLServer).
#
#   bash common/benchmarks/triton_serving.sh OUT_DIR        (from the repository root, after make quickstart)
#
# Writes OUT_DIR/<recipe>_python/ (each recipe's CPU repository) and OUT_DIR/triton_serving.json.
set -euo pipefail
OUT="${1:?usage: triton_serving.sh OUT_DIR}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

for backend in python; do
  (cd "$REPO/PyTorch/DLRM" && "$PY" -m deployment.deploy --deploy_cpu --onnx --triton-backend "$backend" --overwrite \
      --save-dir "$OUT/dlrm_$backend" -- --model_checkpoint /tmp/dlrm_quickstart/checkpoint \
      --dataset /tmp/dlrm_quickstart/data --check_rows 0)
  (cd "$REPO/PyTorch/NCF" && "$PY" deployment/deploy.py --load_checkpoint_path /tmp/ncf_quickstart/checkpoints/model.pth \
      --save-dir "$OUT/ncf_$backend" --deploy_cpu --onnx --triton-backend "$backend" --overwrite)
  (cd "$REPO/TensorFlow2/DLRM_DCNv2" && "$PY" -m deployment.deploy --checkpoint-dir /tmp/dlrm_dcnv2_quickstart/dlrm_checkpoint \
      --model-repository-path "$OUT/dlrm_dcnv2_$backend" --dataset_path /tmp/dlrm_dcnv2_quickstart/data --cpu --overwrite \
      --max-batch-size 32768 --triton-backend "$backend")
  Q=/tmp/wide_deep_quickstart
  (cd "$REPO/TensorFlow2/WideAndDeep" && "$PY" deployment/deploy.py --checkpoint-dir $Q/model --dataset_path $Q/data \
      --embedding_sizes_file $Q/embedding_sizes.json --deep_hidden_units 32 32 --model-repository "$OUT/wide_deep_$backend" \
      --max-batch-size 4096 --overwrite --triton-backend "$backend")
done

"$PY" "$REPO/common/benchmarks/triton_serving.py" --output "$OUT/triton_serving.json" \
  --case "dlrm=$OUT/dlrm_python:dlrm-onnx" --case "ncf=$OUT/ncf_python:ncf-onnx" \
  --case "dlrm_dcnv2=$OUT/dlrm_dcnv2_python:dlrm-onnx" --case "wide_deep=$OUT/wide_deep_python:widedeep-onnx"
