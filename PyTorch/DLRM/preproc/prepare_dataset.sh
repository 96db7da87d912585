#!/usr/bin/env bash
# Criteo click logs -> the split-binary dataset DLRM trains on.
#
#   cd preproc && ./prepare_dataset.sh [FREQUENCY_LIMIT] [CPU] [Polars|Spark]
#
# Input (INPUT_PATH): the Criteo Terabyte days day_0 .. day_23 (uncompressed or .gz), or the Criteo Kaggle
# train.txt (a directory holding it, or the file itself). Two engines give the same dataset (byte for byte with
# --train_ordering input; common/tests/test_criteo_engine.py):
#   Polars (default): one machine, bounded memory, resumable after a kill
#     1. verify_criteo_downloaded.sh                the input is complete and readable
#     2. recsys_common.criteo.polars_preprocess    raw text -> BINARY_PATH/{train,test,validation}/*.bin + feature_spec.yaml
#   Spark (third argument Spark, PREPROC_ENGINE=spark, or SPARK_MASTER set): the cluster engine
#     1. verify_criteo_downloaded.sh
#     2. recsys_common.criteo.spark_preprocess     dictionaries + parquet train/test/validation in OUTPUT_PATH
#     3. recsys_common.criteo.to_split_binary      parquet -> BINARY_PATH/{train,test,validation}/*.bin + feature_spec.yaml
# Environment (defaults in brackets; PREPROC_CONFIG=configs/<name>.sh sets several at once):
#   INPUT_PATH [/data/dlrm/criteo]  BINARY_PATH [/data/dlrm/binary_dataset]  FREQUENCY_LIMIT [15]
#   PYTHON [the project's .venv python when there is one, else python3: common/recipe_env.sh]
#   OVERWRITE [0]  PREPROC_ENGINE [polars, or spark when SPARK_MASTER is set]
#   Polars: WORK_DIR [BINARY_PATH.work: intermediate files and resume state]  PREPROC_ARGS (more flags, see
#           python -m recsys_common.criteo.polars_preprocess --help)
#   Spark:  OUTPUT_PATH [/data/dlrm/spark/output]  SPARK_LOCAL_DIRS [/data/dlrm/spark/tmp]  TOTAL_CORES [all]
#           TOTAL_MEMORY [GiB, 80 % of RAM]  SPARK_MASTER [local[*]]
#           SPARK_PREPROCESS_ARGS  extra flags for spark_preprocess (see its --help), e.g. "--dictionary_source train",
#                                  or "--header yes --delimiter comma" for CSV copies (both detected per file by default)
# See README.md in this directory for the outputs, disk and memory needs, and how this differs from NVIDIA's script.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ -n "${PREPROC_CONFIG:-}" ]]; then
    # shellcheck source=/dev/null
    source "$PREPROC_CONFIG"
fi

FREQUENCY_LIMIT="${1:-${FREQUENCY_LIMIT:-15}}"
DEVICE="${2:-CPU}"
ENGINE="${3:-${PREPROC_ENGINE:-}}"   # empty: the shared steps pick polars, or spark when SPARK_MASTER is set
ENGINE_ERROR="third argument (or PREPROC_ENGINE) must be Polars or Spark (NVIDIA's NVTabular path is not part of this recipe)"

die() { echo "prepare_dataset.sh: error: $*" >&2; exit 2; }

[[ "$FREQUENCY_LIMIT" =~ ^[0-9]+$ ]] || die "FREQUENCY_LIMIT must be a non-negative integer, got '$FREQUENCY_LIMIT'"
case "$DEVICE" in
    CPU) ;;
    GPU) die "GPU Spark (RAPIDS Accelerator) is not packaged by this recipe. Run with CPU, or add the RAPIDS jar to
    Spark and pass SPARK_PREPROCESS_ARGS='--spark_conf spark.plugins=com.nvidia.spark.SQLPlugin' with CPU." ;;
    *) die "second argument must be CPU (or GPU), got '$DEVICE'" ;;
esac

# The interpreter: PYTHON as given (a path or a command name), else the project's .venv python when there is one,
# else python3; PYTHONPATH: the recipe and recsys_common, in a checkout or the Docker image. Both from
# common/recipe_env.sh, as quickstart.sh, sourced in the recipe directory.
pushd "$here/.." >/dev/null
# shellcheck source=../../../common/recipe_env.sh
source "$([[ -f ../../common/recipe_env.sh ]] && echo ../../common || echo ../common)/recipe_env.sh"
popd >/dev/null
PYTHON="${PYTHON:-$PY}"

# The steps (verify, then Polars; or verify, Spark, conversion) are shared with TensorFlow2/DLRM_DCNv2's script.
steps="$("$PYTHON" -c 'import os, recsys_common.criteo as c; print(os.path.dirname(c.__file__))')/prepare_dataset_steps.sh"
FREQUENCY="$FREQUENCY_LIMIT" FREQUENCY_NAME=frequency_limit VERIFY_INPUT="$here/verify_criteo_downloaded.sh"
REUSE_SPARK_OUTPUT=1
TRAIN_HINT="python -m dlrm.scripts.main --mode train --dataset {BINARY_PATH}"
# shellcheck source=../../../common/recsys_common/criteo/prepare_dataset_steps.sh
source "$steps"
