# The sizes NVIDIA's DLRM README gives for its Spark job on a DGX-2 class machine (80 cores, 800 GiB), local mode.
# The full Terabyte run needs about 3 TB free under SPARK_LOCAL_DIRS for shuffle data (see README.md).
# Usage: PREPROC_CONFIG=configs/dgx2.sh ./prepare_dataset.sh 15
: "${TOTAL_CORES:=80}"
: "${TOTAL_MEMORY:=800}"
: "${SPARK_MASTER:=local[$TOTAL_CORES]}"
: "${SPARK_LOCAL_DIRS:=/data/dlrm/spark/tmp}"
