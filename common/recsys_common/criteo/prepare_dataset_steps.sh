# The steps both DLRM recipes' preproc/prepare_dataset.sh run once each has read its own command line (PyTorch:
# [FREQUENCY_LIMIT] [CPU] [Polars|Spark]; TensorFlow2: [CPU] [FREQUENCY_THRESHOLD], NVIDIA's orders): sourced, not
# run, so one copy serves both and the users' commands stay as they were.
#
# The sourcing script sets: ENGINE (polars or spark in any case; empty: spark when SPARK_MASTER is set, else polars),
# ENGINE_ERROR (the message for any other ENGINE, naming where the recipe reads it from), FREQUENCY (the frequency limit), FREQUENCY_NAME (its name in the
# progress lines), TRAIN_HINT (the command printed at the end; its {BINARY_PATH} becomes the path written),
# VERIFY_INPUT (a script checking INPUT_PATH first, or empty), REUSE_SPARK_OUTPUT (1: a finished Spark run with the same limit is not redone), PYTHON, with recsys_common
# importable, and a die() function. The environment (INPUT_PATH, BINARY_PATH, OVERWRITE, WORK_DIR, PREPROC_ARGS,
# OUTPUT_PATH, SPARK_*, TOTAL_CORES, TOTAL_MEMORY) is documented in each recipe's script.

if [[ -z "$ENGINE" ]]; then
    if [[ -n "${SPARK_MASTER:-}" ]]; then ENGINE=spark; else ENGINE=polars; fi
fi
case "${ENGINE,,}" in
    polars) ENGINE=polars ;;
    spark) ENGINE=spark ;;
    *) die "$ENGINE_ERROR, got '$ENGINE'" ;;
esac

# NVIDIA's folders under /data/dlrm when this user can write there (its containers), else the same layout under
# ~/dlrm_data: a non-root user's run never stops at a permission error. Each path can be set on its own.
DATA_ROOT="${DATA_ROOT:-/data/dlrm}"
if ! { [[ -d "$DATA_ROOT" && -w "$DATA_ROOT" ]] || mkdir -p "$DATA_ROOT" 2>/dev/null; }; then
    DATA_ROOT="$HOME/dlrm_data"
    echo "[prepare_dataset] /data/dlrm is not writable here: using $DATA_ROOT (set DATA_ROOT or the paths to choose)"
fi
INPUT_PATH="${INPUT_PATH:-$DATA_ROOT/criteo}"
OUTPUT_PATH="${OUTPUT_PATH:-$DATA_ROOT/spark/output}"
SPARK_LOCAL_DIRS="${SPARK_LOCAL_DIRS:-$DATA_ROOT/spark/tmp}"
BINARY_PATH="${BINARY_PATH:-$DATA_ROOT/binary_dataset}"
TOTAL_CORES="${TOTAL_CORES:-$(nproc)}"
if [[ -z "${TOTAL_MEMORY:-}" ]]; then
    TOTAL_MEMORY=$(awk '/MemTotal/ {m = int($2 / 1048576 * 0.8); print (m < 1 ? 1 : m)}' /proc/meminfo)
fi
SPARK_MASTER="${SPARK_MASTER:-local[*]}"
OVERWRITE="${OVERWRITE:-0}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"

overwrite_flag=()
[[ "$OVERWRITE" == "1" ]] && overwrite_flag=(--overwrite)

if [[ "$ENGINE" == polars ]]; then
    echo "[prepare_dataset] engine=polars input=$INPUT_PATH binary=$BINARY_PATH $FREQUENCY_NAME=$FREQUENCY"
    [[ -n "$VERIFY_INPUT" ]] && "$VERIFY_INPUT" "$INPUT_PATH"
    work_flag=()
    [[ -n "${WORK_DIR:-}" ]] && work_flag=(--work_dir "$WORK_DIR")
    # shellcheck disable=SC2086  # PREPROC_ARGS is a list of flags
    "$PYTHON" -m recsys_common.criteo.polars_preprocess \
        --input_path "$INPUT_PATH" --output_path "$BINARY_PATH" --frequency_limit "$FREQUENCY" \
        "${work_flag[@]}" "${overwrite_flag[@]}" ${PREPROC_ARGS:-}
    echo "[prepare_dataset] done: $BINARY_PATH/feature_spec.yaml"
    echo "[prepare_dataset] train with: ${TRAIN_HINT//\{BINARY_PATH\}/$BINARY_PATH}"
    exit 0
fi

command -v java >/dev/null 2>&1 || die "Spark needs a Java runtime (17 or 21): install openjdk-17-jre-headless"

echo "[prepare_dataset] engine=spark input=$INPUT_PATH spark_output=$OUTPUT_PATH binary=$BINARY_PATH $FREQUENCY_NAME=$FREQUENCY"
echo "[prepare_dataset] master=$SPARK_MASTER cores=$TOTAL_CORES memory=${TOTAL_MEMORY}g local_dirs=$SPARK_LOCAL_DIRS"

# 1. verify (where the recipe has a verification script; spark_preprocess checks its input either way)
[[ -n "$VERIFY_INPUT" ]] && "$VERIFY_INPUT" "$INPUT_PATH"

# 2. Spark (with REUSE_SPARK_OUTPUT=1, skipped when a finished run with the same frequency limit is already there)
report="$OUTPUT_PATH/preprocess_report.json"
# cardinalities.json is the job's completion marker (moved in last): without it the output is partial.
if [[ "$REUSE_SPARK_OUTPUT" == "1" && -f "$OUTPUT_PATH/cardinalities.json" && -f "$report" && "$OVERWRITE" != "1" ]]; then
    done_limit=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["frequency_limit"])' "$report")
    [[ "$done_limit" == "$FREQUENCY" ]] || die "$OUTPUT_PATH holds a run with frequency limit $done_limit; set OVERWRITE=1 to redo it with $FREQUENCY"
    echo "[prepare_dataset] $report exists: skipping the Spark job (OVERWRITE=1 redoes it)"
else
    mkdir -p "$SPARK_LOCAL_DIRS"
    # shellcheck disable=SC2086  # SPARK_PREPROCESS_ARGS is a list of flags
    "$PYTHON" -m recsys_common.criteo.spark_preprocess \
        --input_path "$INPUT_PATH" --output_path "$OUTPUT_PATH" --frequency_limit "$FREQUENCY" \
        --master "$SPARK_MASTER" --total_cores "$TOTAL_CORES" --total_memory "$TOTAL_MEMORY" \
        --spark_local_dirs "$SPARK_LOCAL_DIRS" "${overwrite_flag[@]}" ${SPARK_PREPROCESS_ARGS:-}
fi

# 3. parquet -> split binary
"$PYTHON" -m recsys_common.criteo.to_split_binary --input "$OUTPUT_PATH" --output "$BINARY_PATH" "${overwrite_flag[@]}"

echo "[prepare_dataset] done: $BINARY_PATH/feature_spec.yaml"
echo "[prepare_dataset] train with: ${TRAIN_HINT//\{BINARY_PATH\}/$BINARY_PATH}"
