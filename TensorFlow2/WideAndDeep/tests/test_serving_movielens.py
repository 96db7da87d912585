"""The MovieLens model of the HugeCTR notebook (our "graph exported for inference"): snapshot -> Triton repository
(SavedModel + ONNX) -> parity Keras vs SavedModel vs onnxruntime vs a real Triton server (its Python backend; HTTP,
gRPC), and the AUC through the server equal to the example's own evaluation. Real ml-100k (shared data); a short training run (40 steps)."""
import json
import os

import numpy as np
import pytest

from recsys_testing import shared_data_path

PARITY_ATOL = 1e-5


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    from wide_deep.movielens.etl import run_etl
    from wide_deep.movielens.train import train
    root = tmp_path_factory.mktemp("ml_serving")
    data = str(root / "data")
    run_etl(shared_data_path("movielens", "ml-100k"), data, seed=0, out=lambda s: None)
    summary = train(data, model_dir=str(root / "snapshots"), max_iter=40, batch_size=1024, eval_interval=40,
                    display=40, snapshot=40, learning_rate=0.003, seed=0, stdout=False)
    flags = ["--model", "movielens", "--checkpoint-dir", str(root / "snapshots" / "snapshot_40"),
             "--dataset_path", data]
    return {"root": root, "data": data, "flags": flags, "auc": summary["final_auc"]}


@pytest.fixture(scope="module")
def repo(snapshot):
    from deployment.deploy import main
    path = str(snapshot["root"] / "repo")
    assert main(snapshot["flags"] + ["--model-repository", path, "--max-batch-size", "2048",
                                     "--triton-backend", "python"]) == 0
    return path


@pytest.fixture(scope="module")
def server(repo):
    from recsys_common.serving.triton_server import serve_repository
    with serve_repository(repo, ["movielens-onnx"], startup_timeout_s=180) as handle:
        yield handle


def test_movielens_export_parity(snapshot, repo, server):
    import onnxruntime as ort
    import tensorflow as tf
    from recsys_common.feature_spec import FeatureSpec
    from recsys_common.serving.client import InferenceClient
    from recsys_common.serving.model_config import check_model_directory
    from recsys_common.serving.repository import read_sidecar
    from wide_deep.data.movielens import load_split, model_feature_names
    from deployment.evaluate_accuracy import to_request_arrays
    from wide_deep.serving import load_model, serving_inputs
    for name, artifact in (("movielens-onnx", "model.onnx"), ("movielens-savedmodel", "model.savedmodel")):
        config = check_model_directory(os.path.join(repo, name))
        assert (config.backend, config.parameters["artifact"].string_value) == ("python", artifact)
    sidecar = read_sidecar(os.path.join(repo, "movielens-onnx"))
    assert sidecar["inputs"]["genres"]["dims"] == [6] and sidecar["inputs"]["genres"]["min_id"] == -1
    assert sidecar["inputs"]["userId"]["dtype"] == "int64"
    model, config, spec = load_model("movielens", snapshot["flags"][3], dataset_path=snapshot["data"],
                                     hidden_units=[128, 128])
    data = load_split(spec, "test")
    batch = {k: v[:257] for k, v in data.items() if k in model_feature_names(spec)}
    keras = tf.sigmoid(model({k: tf.constant(v) for k, v in batch.items()}, training=False)).numpy()
    request = to_request_arrays(batch, serving_inputs(config, spec))
    saved = tf.saved_model.load(os.path.join(repo, "movielens-savedmodel", "1", "model.savedmodel"))
    savedmodel = saved.signatures["serving_default"](**{k: tf.constant(v) for k, v in request.items()})
    session = ort.InferenceSession(os.path.join(repo, "movielens-onnx", "1", "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    results = {"savedmodel": savedmodel["probability"].numpy().reshape(-1),
               "onnxruntime": session.run(["probability"], request)[0].reshape(-1)}
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        with InferenceClient(url, protocol, timeout_s=60) as client:
            results[protocol] = client.infer("movielens-onnx", request, ["probability"])["probability"].reshape(-1)
    assert np.std(keras) > 1e-3
    for name, other in results.items():
        diff = float(np.max(np.abs(other - keras)))
        print(f"movielens parity keras vs {name}: max |diff| {diff:.2e}")
        assert diff <= PARITY_ATOL, name


def test_movielens_served_auc_equals_example_auc(snapshot, server, tmp_path):
    from deployment.evaluate_accuracy import main
    out = str(tmp_path / "auc.json")
    assert main(snapshot["flags"] + ["--server-url", server.http_url, "--protocol", "http", "--batch-size", "2048",
                                     "--tolerance", "1e-6", "--output-json", out]) == 0
    result = json.load(open(out))
    # the framework side is the example's own evaluation: the AUC the training run printed at its last step
    assert result["framework"]["auc"] == pytest.approx(snapshot["auc"], abs=1e-9)
    assert abs(result["server"]["auc"] - snapshot["auc"]) <= 1e-6


def test_movielens_snapshot_flag_mismatch(snapshot, tmp_path, capsys):
    from deployment.deploy import main
    assert main(snapshot["flags"] + ["--embedding_dim", "8", "--model-repository", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "model/deep/embedding_" in err and "--embedding_dim" in err, err
