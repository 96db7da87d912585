# A standalone Spark cluster (start-master.sh / start-worker.sh). INPUT_PATH, OUTPUT_PATH and BINARY_PATH must be
# on a file system that the driver and every worker mount at the same path (NFS, Lustre...).
# TOTAL_CORES -> spark.cores.max; TOTAL_MEMORY is shared by the executors of --executor_cores (5) cores each.
# Usage: SPARK_MASTER=spark://head:7077 PREPROC_CONFIG=configs/cluster.sh ./prepare_dataset.sh 15
: "${SPARK_MASTER:?set SPARK_MASTER=spark://<host>:7077}"
: "${TOTAL_CORES:=160}"
: "${TOTAL_MEMORY:=1600}"
: "${SPARK_LOCAL_DIRS:=/tmp/spark}"
