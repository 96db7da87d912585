"""Imports and tiny real uses of every library the recipes stand on, with the pinned versions."""
import os

import numpy as np
import pytest


def test_tf_keras2_fit_step_learns():
    import tensorflow as tf
    import tf_keras

    assert tf.__version__ == "2.21.0"
    assert tf_keras.__version__ == "2.21.0"
    assert tf.keras.Model is tf_keras.Model, "tf.keras must be tf-keras (TF_USE_LEGACY_KERAS=1), not Keras 3"
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 3)).astype("float32")
    y = x @ np.array([[2.0], [-1.0], [0.5]], dtype="float32") + 0.3
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    assert after < 0.01 * before, (before, after)
    np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), [2.0, -1.0, 0.5], atol=0.05)


def test_nvtabular_cpu_workflow_in_its_own_environment(tmp_path):
    """NVTabular is not in this environment (its pins are numpy 1.26 / pandas 1.5 / pyarrow 12): it has its own,
    which the ETLs' ``--engine nvtabular`` runs in. Its CPU workflow works there (scripts/nvt_workflow_check.py)."""
    import importlib.util
    import subprocess
    from pathlib import Path
    from recsys_testing import nvtabular_python
    for name in ("nvtabular", "merlin"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed in the default environment"
    script = Path(__file__).parent / "scripts" / "nvt_workflow_check.py"
    proc = subprocess.run([nvtabular_python(), str(script), str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-4000:]


def test_pyspark_local_session_writes_parquet(tmp_path):
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession, functions as F

    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("".join(f"{i % 2}\t{i}\tc{i % 3}\n" for i in range(30)))
    spark = (SparkSession.builder.master("local[1]").appName("recsys-ci-smoke")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.local.dir", str(tmp_path / "spark-local"))
             # a short-lived JVM: C1 JIT only and the serial GC start much faster on 2 cores
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .getOrCreate())
    try:
        df = spark.read.csv(str(tsv), sep="\t", schema="label INT, num INT, cat STRING")
        counts = df.groupBy("cat").agg(F.count("*").alias("n"), F.sum("label").alias("clicks"))
        counts.write.parquet(str(tmp_path / "counts.parquet"))
    finally:
        spark.stop()
    # toPandas() needs pandas >= 2.2, excluded by the NVTabular pins: read back with pyarrow.
    table = pq.read_table(str(tmp_path / "counts.parquet")).to_pydict()
    got = {c: (n, k) for c, n, k in zip(table["cat"], table["n"], table["clicks"])}
    assert got == {"c0": (10, 5), "c1": (10, 5), "c2": (10, 5)}


def test_torchrec_embedding_bag_collection_forward():
    import torch
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm; the CPU build)
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="t_user", embedding_dim=4, num_embeddings=10, feature_names=["user"],
                           pooling=PoolingType.SUM),
        EmbeddingBagConfig(name="t_item", embedding_dim=4, num_embeddings=20, feature_names=["item"],
                           pooling=PoolingType.MEAN),
    ], device=torch.device("cpu"))
    # batch of 2: user = [[1, 2], [3]], item = [[5], [6, 7, 8]]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["user", "item"], values=torch.tensor([1, 2, 3, 5, 6, 7, 8]),
                                              lengths=torch.tensor([2, 1, 1, 3]))
    out = ebc(kjt).to_dict()
    user_w = ebc.embedding_bags["t_user"].weight.detach()
    item_w = ebc.embedding_bags["t_item"].weight.detach()
    torch.testing.assert_close(out["user"], torch.stack([user_w[1] + user_w[2], user_w[3]]))
    torch.testing.assert_close(out["item"], torch.stack([item_w[5], item_w[6:9].mean(0)]))
    assert torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([2, 1, 3])).tolist() == [0, 2, 3, 6]


def test_onnx_export_and_onnxruntime(tmp_path):
    import onnx
    import onnxruntime as ort
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.EmbeddingBag(50, 8, mode="sum")
            self.mlp = torch.nn.Sequential(torch.nn.Linear(8 + 3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))

        def forward(self, ids, dense):
            return torch.sigmoid(self.mlp(torch.cat([self.emb(ids), dense], dim=1)))

    torch.manual_seed(0)
    model = Tiny().eval()
    ids, dense = torch.randint(0, 50, (5, 3)), torch.randn(5, 3)
    path = tmp_path / "tiny.onnx"
    torch.onnx.export(model, (ids, dense), str(path), input_names=["ids", "dense"], output_names=["p"],
                      dynamic_axes={"ids": {0: "batch"}, "dense": {0: "batch"}, "p": {0: "batch"}}, dynamo=False)
    onnx.checker.check_model(onnx.load(str(path)))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"ids": ids.numpy(), "dense": dense.numpy()})
    np.testing.assert_allclose(got, model(ids, dense).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_tritonclient_builds_kserve_v2_requests():
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    for client in (grpcclient, httpclient):
        inp = client.InferInput("dense", list(data.shape), np_to_triton_dtype(data.dtype))
        inp.set_data_from_numpy(data)
        assert inp.name() == "dense" and inp.shape() == [2, 3] and inp.datatype() == "FP32"
    assert np_to_triton_dtype(np.int64) == "INT64"


@pytest.mark.parametrize("name", ["horovod", "tf2onnx", "onnxscript"])
def test_imports(name):
    import importlib
    importlib.import_module(name)


def test_tritonserver_installed_with_its_stub_environment():
    """``make setup``'s Triton server (ci/install_tritonserver.sh): the 2.51 binary loads its libraries, the Python
    backend holds the 3.11 stub, and the stub's interpreter has numpy 1.x (the stub was built against it) in front of
    the environment's packages."""
    import subprocess
    from recsys_common.serving.triton_server import find_tritonserver
    install = find_tritonserver()
    usage = subprocess.run([install.binary, "--help"], capture_output=True, text=True, timeout=60)
    assert "Usage: tritonserver" in usage.stdout + usage.stderr
    assert install.backends() == ["python"]
    assert os.access(os.path.join(install.backend_directory, "python", "triton_python_backend_stub"), os.X_OK)
    stub_python = subprocess.run([os.path.join(install.stub_bin, "python3"), "-c",
                                  "import numpy, onnxruntime, recsys_common; print(numpy.__version__)"],
                                 capture_output=True, text=True, timeout=120)
    assert stub_python.returncode == 0, stub_python.stderr[-2000:]
    assert stub_python.stdout.strip() == "1.26.4"
