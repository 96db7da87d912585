#!/usr/bin/env bash
# Outbrain ETL: the seven raw Kaggle CSVs -> parquet train/ and valid/, feature_spec.yaml and the NVTabular workflow.
# NVIDIA's scripts/preproc.sh runs this file with the same arguments.
#
#   bash preproc/prepare_dataset.sh [RAW_DIR] [OUT_DIR] [extra flags of python -m wide_deep.data.outbrain.preproc]
#   bash preproc/prepare_dataset.sh /outbrain/orig /outbrain/data --use_dask --dask_workers 2
#   bash preproc/prepare_dataset.sh /outbrain/orig /outbrain/data --dask_scheduler tcp://scheduler:8786
#   bash preproc/prepare_dataset.sh /outbrain/orig /outbrain/data --partition_rows 500000   # rows held at once
#
# Out of core: the CSVs are read in blocks and joined display range by display range; memory is bounded by
# --partition_rows (default 1,000,000), not by the size of clicks_train.csv.
# Defaults: NVIDIA's /outbrain/orig -> /outbrain/data where /outbrain/data can be written (root in NVIDIA's
# container); otherwise, for a user who cannot write there, ~/outbrain/orig -> ~/outbrain/data (the input stays
# /outbrain/orig when that directory exists). Arguments given are used as given. Runs on the GPU where cuDF is
# installed, else on CPU. The interpreter: $PYTHON when set, else the repository's .venv when there is one.
set -euo pipefail
RECIPE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO="$(cd "$RECIPE/../.." && pwd)"
PY="${PYTHON:-python}"
if [[ -z "${PYTHON:-}" && -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"; fi
# --engine nvtabular runs in NVTabular's own environment (make setup-nvtabular), where there is one.
if [[ -z "${PYTHON:-}" && " $* " =~ \ --engine(=|\ )nvtabular\  && -x "$REPO/.venv-nvtabular/bin/python" ]]; then
  PY="$REPO/.venv-nvtabular/bin/python"
fi

# Whether this user can create or write directory $1: its nearest existing ancestor is writable.
writable() {
  local dir="$1"
  while [[ ! -e "$dir" ]]; do dir="$(dirname "$dir")"; done
  [[ -d "$dir" && -w "$dir" ]]
}
NVIDIA_RAW=/outbrain/orig NVIDIA_OUT=/outbrain/data USER_BASE="${HOME:-/tmp}/outbrain"
if writable "$NVIDIA_OUT"; then
  DEFAULT_RAW="$NVIDIA_RAW" DEFAULT_OUT="$NVIDIA_OUT"
else
  DEFAULT_OUT="$USER_BASE/data"
  if [[ -d "$NVIDIA_RAW" ]]; then DEFAULT_RAW="$NVIDIA_RAW"; else DEFAULT_RAW="$USER_BASE/orig"; fi
fi
RAW="${1:-$DEFAULT_RAW}"
OUT="${2:-$DEFAULT_OUT}"
if [[ $# -lt 2 ]]; then echo "prepare_dataset.sh: input $RAW, output $OUT (defaults; pass RAW_DIR OUT_DIR to choose)"; fi
shift $(( $# < 2 ? $# : 2 ))
export PYTHONPATH="$RECIPE:$REPO/common${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m wide_deep.data.outbrain.preproc --input_dir "$RAW" --output_dir "$OUT" "$@"
