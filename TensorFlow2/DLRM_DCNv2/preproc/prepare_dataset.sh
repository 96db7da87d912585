#!/usr/bin/env bash
# Criteo click logs -> the split-binary dataset dlrm.py / dcnv2.py train on (--dataset_type tf_raw).
#
#   cd preproc && ./prepare_dataset.sh [CPU] [FREQUENCY_THRESHOLD]       (NVIDIA's arguments: <DGX2|CPU> <threshold>)
#
# The shared implementation in common/recsys_common/criteo (the same PyTorch/DLRM runs), with two engines that give
# the same dataset (byte for byte with --train_ordering input; common/tests/test_criteo_engine.py):
#   Polars (default): python -m recsys_common.criteo.polars_preprocess   one machine, bounded memory, resumable:
#                     raw text -> BINARY_PATH/{train,test,validation}/*.bin + BINARY_PATH/feature_spec.yaml
#   Spark (PREPROC_ENGINE=spark, or SPARK_MASTER set): the cluster engine, two steps:
#     1. python -m recsys_common.criteo.spark_preprocess   checks the input, dictionaries of the categorical
#                                                        values seen >= FREQUENCY_THRESHOLD times, parquet splits
#                                                        train (day_0..22) / test / validation (halves of day_23)
#     2. python -m recsys_common.criteo.to_split_binary    parquet -> BINARY_PATH/{train,test,validation}/*.bin and
#                                                        BINARY_PATH/feature_spec.yaml
# Environment [default]:
#   INPUT_PATH [/data/dlrm/criteo]              day_0 .. day_23 (plain or .gz), or a directory with Kaggle's train.txt
#   BINARY_PATH [/data/dlrm/binary_dataset]     the dataset to train on
#   PREPROC_ENGINE [polars; spark when SPARK_MASTER is set]   OVERWRITE [0: refuse non-empty outputs]
#   PYTHON [the repository's .venv python when there is one (make setup), else python3]
#   Polars: WORK_DIR [BINARY_PATH.work]         intermediate files and the resume state of a killed run
#           PREPROC_ARGS                        more flags (python -m recsys_common.criteo.polars_preprocess --help)
#   Spark:  OUTPUT_PATH [/data/dlrm/spark/output]  Spark output (dictionaries + parquet), intermediate
#           SPARK_LOCAL_DIRS [/data/dlrm/spark/tmp]  Spark shuffle scratch (the most disk: ~2x the raw data)
#           SPARK_MASTER [local[*]]             or spark://host:7077, yarn, k8s://... (paths on a shared file system)
#           TOTAL_CORES [all]  TOTAL_MEMORY [GiB, 80 % of RAM]
#           SPARK_PREPROCESS_ARGS   more flags for spark_preprocess (python -m recsys_common.criteo.spark_preprocess --help)
# Then: python dlrm.py --dataset_path $BINARY_PATH   (README.md, "Criteo").
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"

die() { echo "prepare_dataset.sh: error: $*" >&2; exit 2; }

DEVICE="${1:-CPU}"
FREQUENCY_THRESHOLD="${2:-${FREQUENCY_LIMIT:-15}}"
case "$DEVICE" in
    CPU) ;;
    DGX2|GPU) die "GPU Spark (NVIDIA's DGX2 configuration, RAPIDS Accelerator) is not packaged by this recipe: run with
    CPU, or add the RAPIDS jar to Spark and pass SPARK_PREPROCESS_ARGS='--spark_conf spark.plugins=com.nvidia.spark.SQLPlugin'" ;;
    *) die "first argument must be CPU (or DGX2), got '$DEVICE'" ;;
esac
[[ "$FREQUENCY_THRESHOLD" =~ ^[0-9]+$ ]] || die "FREQUENCY_THRESHOLD (second argument) must be a non-negative integer, got '$FREQUENCY_THRESHOLD'"
[[ $# -le 2 ]] || die "at most two arguments (CPU FREQUENCY_THRESHOLD), got $#"

ENGINE="${PREPROC_ENGINE:-}"   # empty: the shared steps pick polars, or spark when SPARK_MASTER is set
ENGINE_ERROR="PREPROC_ENGINE must be polars or spark"

# The interpreter as common/recipe_env.sh picks it (quickstart.sh sources that; this script runs from anywhere):
# PYTHON when it names an executable, else the repository's .venv python when there is one, else python3.
PYTHON="${PYTHON:-$repo/.venv/bin/python}"
[[ -x "$PYTHON" ]] || command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
# recsys_common is installed by the setup (pip install -e common); fall back to the checkout.
if ! "$PYTHON" -c "import recsys_common" 2>/dev/null; then
    export PYTHONPATH="$repo/common${PYTHONPATH:+:$PYTHONPATH}"
fi

# The steps (Polars; or Spark, then the conversion) are shared with PyTorch/DLRM's script.
steps="$("$PYTHON" -c 'import os, recsys_common.criteo as c; print(os.path.dirname(c.__file__))')/prepare_dataset_steps.sh"
FREQUENCY="$FREQUENCY_THRESHOLD" FREQUENCY_NAME=frequency_threshold VERIFY_INPUT="" REUSE_SPARK_OUTPUT=0
TRAIN_HINT="python dlrm.py --dataset_path {BINARY_PATH}   (or dcnv2.py)"
# shellcheck source=../../../common/recsys_common/criteo/prepare_dataset_steps.sh
source "$steps"
