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
#   INPUT_PATH [/data/dlrm/criteo]  BINARY_PATH [/data/dlrm/binary_dataset]  FREQUENCY_LIMIT [15]  PYTHON [python3]
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
repo="$(cd "$here/../../.." && pwd)"

if [[ -n "${PREPROC_CONFIG:-}" ]]; then
    # shellcheck source=/dev/null
    source "$PREPROC_CONFIG"
fi

FREQUENCY_LIMIT="${1:-${FREQUENCY_LIMIT:-15}}"
DEVICE="${2:-CPU}"
if [[ -n "${SPARK_MASTER:-}" ]]; then default_engine=spark; else default_engine=polars; fi
ENGINE="${3:-${PREPROC_ENGINE:-$default_engine}}"

die() { echo "prepare_dataset.sh: error: $*" >&2; exit 2; }

[[ "$FREQUENCY_LIMIT" =~ ^[0-9]+$ ]] || die "FREQUENCY_LIMIT must be a non-negative integer, got '$FREQUENCY_LIMIT'"
case "$DEVICE" in
    CPU) ;;
    GPU) die "GPU Spark (RAPIDS Accelerator) is not packaged by this recipe. Run with CPU, or add the RAPIDS jar to
    Spark and pass SPARK_PREPROCESS_ARGS='--spark_conf spark.plugins=com.nvidia.spark.SQLPlugin' with CPU." ;;
    *) die "second argument must be CPU (or GPU), got '$DEVICE'" ;;
esac
case "${ENGINE,,}" in
    polars) ENGINE=polars ;;
    spark) ENGINE=spark ;;
    *) die "third argument (or PREPROC_ENGINE) must be Polars or Spark (NVIDIA's NVTabular path is not part of this recipe), got '$ENGINE'" ;;
esac

INPUT_PATH="${INPUT_PATH:-/data/dlrm/criteo}"
OUTPUT_PATH="${OUTPUT_PATH:-/data/dlrm/spark/output}"
SPARK_LOCAL_DIRS="${SPARK_LOCAL_DIRS:-/data/dlrm/spark/tmp}"
BINARY_PATH="${BINARY_PATH:-/data/dlrm/binary_dataset}"
TOTAL_CORES="${TOTAL_CORES:-$(nproc)}"
if [[ -z "${TOTAL_MEMORY:-}" ]]; then
    TOTAL_MEMORY=$(awk '/MemTotal/ {m = int($2 / 1048576 * 0.8); print (m < 1 ? 1 : m)}' /proc/meminfo)
fi
SPARK_MASTER="${SPARK_MASTER:-local[*]}"
PYTHON="${PYTHON:-python3}"
OVERWRITE="${OVERWRITE:-0}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"

# recsys_common is installed by the setup (pip install -e common); fall back to the checkout.
if ! "$PYTHON" -c "import recsys_common" 2>/dev/null; then
    export PYTHONPATH="$repo/common${PYTHONPATH:+:$PYTHONPATH}"
fi
overwrite_flag=()
[[ "$OVERWRITE" == "1" ]] && overwrite_flag=(--overwrite)

if [[ "$ENGINE" == polars ]]; then
    echo "[prepare_dataset] engine=polars input=$INPUT_PATH binary=$BINARY_PATH frequency_limit=$FREQUENCY_LIMIT"
    "$here/verify_criteo_downloaded.sh" "$INPUT_PATH"
    work_flag=()
    [[ -n "${WORK_DIR:-}" ]] && work_flag=(--work_dir "$WORK_DIR")
    # shellcheck disable=SC2086  # PREPROC_ARGS is a list of flags
    "$PYTHON" -m recsys_common.criteo.polars_preprocess \
        --input_path "$INPUT_PATH" --output_path "$BINARY_PATH" --frequency_limit "$FREQUENCY_LIMIT" \
        "${work_flag[@]}" "${overwrite_flag[@]}" ${PREPROC_ARGS:-}
    echo "[prepare_dataset] done: $BINARY_PATH/feature_spec.yaml"
    echo "[prepare_dataset] train with: python -m dlrm.scripts.main --mode train --dataset $BINARY_PATH"
    exit 0
fi

command -v java >/dev/null 2>&1 || die "Spark needs a Java runtime (17 or 21): install openjdk-17-jre-headless"

echo "[prepare_dataset] engine=spark input=$INPUT_PATH output=$OUTPUT_PATH binary=$BINARY_PATH frequency_limit=$FREQUENCY_LIMIT"
echo "[prepare_dataset] master=$SPARK_MASTER cores=$TOTAL_CORES memory=${TOTAL_MEMORY}g local_dirs=$SPARK_LOCAL_DIRS"

# 1. verify
"$here/verify_criteo_downloaded.sh" "$INPUT_PATH"

# 2. Spark (skipped when a finished run with the same frequency limit is already there)
report="$OUTPUT_PATH/preprocess_report.json"
# cardinalities.json is the job's completion marker (moved in last): without it the output is partial.
if [[ -f "$OUTPUT_PATH/cardinalities.json" && -f "$report" && "$OVERWRITE" != "1" ]]; then
    done_limit=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["frequency_limit"])' "$report")
    [[ "$done_limit" == "$FREQUENCY_LIMIT" ]] || die "$OUTPUT_PATH holds a run with frequency limit $done_limit; set OVERWRITE=1 to redo it with $FREQUENCY_LIMIT"
    echo "[prepare_dataset] $report exists: skipping the Spark job (OVERWRITE=1 redoes it)"
else
    mkdir -p "$SPARK_LOCAL_DIRS"
    # shellcheck disable=SC2086  # SPARK_PREPROCESS_ARGS is a list of flags
    "$PYTHON" -m recsys_common.criteo.spark_preprocess \
        --input_path "$INPUT_PATH" --output_path "$OUTPUT_PATH" --frequency_limit "$FREQUENCY_LIMIT" \
        --master "$SPARK_MASTER" --total_cores "$TOTAL_CORES" --total_memory "$TOTAL_MEMORY" \
        --spark_local_dirs "$SPARK_LOCAL_DIRS" "${overwrite_flag[@]}" ${SPARK_PREPROCESS_ARGS:-}
fi

# 3. parquet -> split binary
"$PYTHON" -m recsys_common.criteo.to_split_binary --input "$OUTPUT_PATH" --output "$BINARY_PATH" "${overwrite_flag[@]}"

echo "[prepare_dataset] done: $BINARY_PATH/feature_spec.yaml"
echo "[prepare_dataset] train with: python -m dlrm.scripts.main --mode train --dataset $BINARY_PATH"
