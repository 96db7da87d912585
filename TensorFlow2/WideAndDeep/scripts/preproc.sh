#!/usr/bin/env bash
# NVIDIA's name for the Outbrain ETL: runs preproc/prepare_dataset.sh with the same arguments (see that file).
#   bash scripts/preproc.sh [RAW_DIR] [OUT_DIR] [extra flags of python -m wide_deep.data.outbrain.preproc]
exec bash "$(dirname "${BASH_SOURCE[0]}")/../preproc/prepare_dataset.sh" "$@"
