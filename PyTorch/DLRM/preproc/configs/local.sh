# Single machine: Spark local[N] on every core, 80 % of the RAM for the driver (which runs the tasks in local mode).
# Usage: PREPROC_CONFIG=configs/local.sh ./prepare_dataset.sh 15
: "${TOTAL_CORES:=$(nproc)}"
: "${TOTAL_MEMORY:=$(awk '/MemTotal/ {m = int($2 / 1048576 * 0.8); print (m < 1 ? 1 : m)}' /proc/meminfo)}"
: "${SPARK_MASTER:=local[$TOTAL_CORES]}"
: "${SPARK_LOCAL_DIRS:=/data/dlrm/spark/tmp}"
