#!/usr/bin/env bash
# Outbrain ETL: the seven raw Kaggle CSVs -> parquet train/ and valid/, feature_spec.yaml and the NVTabular workflow.
#
#   bash scripts/preproc.sh [RAW_DIR] [OUT_DIR] [extra flags of python -m wide_deep.data.outbrain.preproc]
#   bash scripts/preproc.sh /outbrain/orig /outbrain/data --use_dask --dask_workers 2
#   bash scripts/preproc.sh /outbrain/orig /outbrain/data --dask_scheduler tcp://scheduler:8786
#   bash scripts/preproc.sh /outbrain/orig /outbrain/data --partition_rows 500000   # rows held at once
#
# Out of core: the CSVs are read in blocks and joined display range by display range; memory is bounded by
# --partition_rows (default 1,000,000), not by the size of clicks_train.csv.
# Defaults are NVIDIA's: /outbrain/orig -> /outbrain/data. Runs on the GPU where cuDF is installed, else on CPU.
set -euo pipefail
RECIPE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO="$(cd "$RECIPE/../.." && pwd)"
PY="${PYTHON:-python}"
if [[ -z "${PYTHON:-}" && -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"; fi
# --engine nvtabular runs in NVTabular's own environment (make setup-nvtabular), where there is one.
if [[ -z "${PYTHON:-}" && " $* " =~ \ --engine(=|\ )nvtabular\  && -x "$REPO/.venv-nvtabular/bin/python" ]]; then
  PY="$REPO/.venv-nvtabular/bin/python"
fi
RAW="${1:-/outbrain/orig}"
OUT="${2:-/outbrain/data}"
shift $(( $# < 2 ? $# : 2 ))
export PYTHONPATH="$RECIPE:$REPO/common${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m wide_deep.data.outbrain.preproc --input_dir "$RAW" --output_dir "$OUT" "$@"
