"""The Criteo Spark job on a standalone Spark cluster (``--master spark://...``) writes what it writes on ``local[*]``.

The cluster is real: a standalone master and one worker (``spark-class org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker``, the programs ``start-master.sh`` / ``start-worker.sh`` run) on 127.0.0.1 with free ports,
each in its own process group, stopped in the fixture's teardown whatever happens. The job's executor then runs in a
JVM the worker starts, as on a real cluster, so what the ``--master`` path adds (executor settings, the driver
reached over the network, shuffle files of another process) is exercised. The input is a small generated Criteo
Terabyte layout (day_0, day_1 train; day_2 split into test / validation) with malformed and padded rows.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from recsys_common.criteo import spark_preprocess, to_split_binary
from recsys_testing import free_port

pyspark = pytest.importorskip("pyspark", reason="pyspark is needed for the Criteo Spark job (ci/requirements.txt)")

N_NUM, N_CAT = 13, 26
# C1-only JIT for every JVM: these jobs are tiny, so JVM warm-up dominates (see test_criteo_spark.py).
QUICK_JVM = "-XX:TieredStopAtLevel=1"
START_TIMEOUT_S = 60.0


# ------------------------------------------------------------------------------------------- input
def _criteo_line(rng):
    label = str(int(rng.random() < 0.3))
    ints = [str(int(rng.expovariate(0.05)) - 2) if rng.random() < 0.8 else "" for _ in range(N_NUM)]
    # power-law values: some frequent (kept by the frequency limit), a long tail (mapped to the rare id 1)
    cats = [f"{c:02d}{int(rng.paretovariate(1.2)):x}" if rng.random() < 0.9 else "" for c in range(N_CAT)]
    return "\t".join([label] + ints + cats)


def write_days(directory, rows_per_day=(300, 300, 200), seed=7):
    rng = random.Random(seed)
    directory.mkdir()
    for day, n in enumerate(rows_per_day):
        lines = [_criteo_line(rng) for _ in range(n)]
        lines[5] = "2" + lines[5][1:]                      # malformed: label
        lines[9] = "\t".join(lines[9].split("\t")[:20])   # padded: trailing fields stripped
        (directory / f"day_{day}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


# ------------------------------------------------------------------------------------------- the cluster
def _spark_class():
    path = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found: this pyspark install has no launcher scripts")
    return path


def _start(command, log_path, env):
    """A Spark daemon in its own process group (spark-class execs the JVM, so the group holds everything)."""
    log = open(log_path, "wb")
    try:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    finally:
        log.close()


def _stop(process):
    if process is None or process.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_for(log_path, marker, process, what):
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = open(log_path, encoding="utf-8", errors="replace").read()
        if marker in text:
            return
        if process.poll() is not None:
            break
        time.sleep(0.2)
    text = open(log_path, encoding="utf-8", errors="replace").read()
    raise AssertionError(f"{what} did not start (exit status {process.poll()}); log {log_path}:\n{text[-4000:]}")


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    """``spark://127.0.0.1:PORT`` of a running master with one registered worker (1 core, 1.5 GiB)."""
    spark_class = _spark_class()
    work = tmp_path_factory.mktemp("spark_cluster")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,
               # REST submission server off; the web UIs cannot be switched off, so they get free ports.
               SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
               SPARK_WORKER_DIR=str(work / "worker"))
    master_port = free_port()
    url = f"spark://127.0.0.1:{master_port}"
    master = worker = None
    try:
        master = _start([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(master_port), "--webui-port", str(free_port())], work / "master.log", env)
        _wait_for(work / "master.log", "I have been elected leader", master, f"Spark master {url}")
        worker = _start([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                         "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "1",
                         "--memory", "1536m", "--work-dir", str(work / "worker"), url], work / "worker.log", env)
        _wait_for(work / "worker.log", "Successfully registered with master", worker, f"Spark worker of {url}")
        yield {"url": url, "logs": work}
    finally:
        _stop(worker)
        _stop(master)


# ------------------------------------------------------------------------------------------- comparing outputs
def _parquet_rows(split_dir):
    import pyarrow.parquet as pq
    files = sorted(f for f in os.listdir(split_dir) if f.endswith(".parquet"))
    tables = [pq.read_table(os.path.join(split_dir, f)) for f in files]
    columns = tables[0].column_names
    return {c: np.concatenate([t.column(c).to_numpy() for t in tables]) for c in columns}


def _dictionaries(models_dir):
    rows = _parquet_rows(models_dir)
    order = np.lexsort((rows["value"].astype(str), rows["column"]))
    return {c: v[order] for c, v in rows.items()}


def _binary_files(directory):
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out


def run_job(input_dir, work, master, total_cores):
    out, binary = str(work / "spark_out"), str(work / "binary")
    report = spark_preprocess.main([
        "--input_path", str(input_dir), "--output_path", out, "--frequency_limit", "3", "--master", master,
        "--total_cores", str(total_cores), "--executor_cores", "1", "--total_memory", "1",
        "--max_malformed_fraction", "0.1", "--shuffle_partitions", "2",
        "--spark_conf", f"spark.driver.extraJavaOptions={QUICK_JVM}",
        "--spark_conf", f"spark.executor.extraJavaOptions={QUICK_JVM}",
        "--spark_conf", "spark.ui.enabled=false"])
    to_split_binary.main(["--input", out, "--output", binary])
    return report, out, binary


@pytest.mark.slow   # ~55 s on 2 cores: two Spark jobs plus the cluster's start
def test_cluster_output_equals_local_output(standalone_cluster, tmp_path):
    input_dir = write_days(tmp_path / "criteo")
    local_report, local_out, local_binary = run_job(input_dir, tmp_path / "local", "local[*]", 2)
    cluster_report, cluster_out, cluster_binary = run_job(input_dir, tmp_path / "cluster", standalone_cluster["url"], 1)

    # The run really went through the cluster: the worker launched an executor for it.
    worker_log = open(standalone_cluster["logs"] / "worker.log", encoding="utf-8", errors="replace").read()
    assert "Asked to launch executor" in worker_log, worker_log[-3000:]

    assert local_report["rows_written"] == {"train": 598, "test": 99, "validation": 100}
    for key in ("rows_written", "rows_malformed", "rows_padded", "cardinalities", "input"):
        assert cluster_report[key] == local_report[key], key
    for name in ("model_size.json", "cardinalities.json"):
        with open(os.path.join(local_out, name)) as a, open(os.path.join(cluster_out, name)) as b:
            assert json.load(b) == json.load(a), name
    local_dict, cluster_dict = _dictionaries(os.path.join(local_out, "models")), \
        _dictionaries(os.path.join(cluster_out, "models"))
    assert len(local_dict["id"]) > N_CAT     # frequent values exist, so the comparison has content
    for column in local_dict:
        np.testing.assert_array_equal(cluster_dict[column], local_dict[column], err_msg=f"models/{column}")
    # Row by row, in order: the train shuffle (rand(seed) drawn while reading) is the same on both masters.
    for split in ("train", "test", "validation"):
        local_rows = _parquet_rows(os.path.join(local_out, split))
        cluster_rows = _parquet_rows(os.path.join(cluster_out, split))
        assert sorted(cluster_rows) == sorted(local_rows)
        for column in local_rows:
            np.testing.assert_array_equal(cluster_rows[column], local_rows[column], err_msg=f"{split}/{column}")
    # And the split-binary dataset the recipes train on is byte for byte the same.
    local_files, cluster_files = _binary_files(local_binary), _binary_files(cluster_binary)
    assert sorted(cluster_files) == sorted(local_files)
    for name, data in local_files.items():
        assert cluster_files[name] == data, name
