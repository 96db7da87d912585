"""Serving end to end: checkpoint -> deployer.py -> the CPU repository (``--triton-backend python``) -> a real Triton
server (``recsys_common.serving.triton_server``) -> tritonclient.

One server for the module (Triton 2.51, both models through its Python backend). Checked: Triton loads every
generated config.pbtxt as written and they match the flags; eager vs
TorchScript vs onnxruntime vs served (HTTP and gRPC) predictions on one batch (measured: TorchScript identical,
onnxruntime and served within 6e-8; allowed 1e-6); evaluate_accuracy over the server equals the recipe's own
``ncf.py --mode test`` HR@10 / NDCG@10; evaluate_latency writes its JSON and PNG; bad input is a clear error.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

NCF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(NCF_DIR, "deployment"))

import deploy as deployer  # noqa: E402
import evaluate_accuracy  # noqa: E402
import evaluate_latency  # noqa: E402
from neumf import train as ncf_train  # noqa: E402
from conftest import train_tiny_neumf  # noqa: E402
from neumf.recommend import load_model  # noqa: E402
from recsys_common.cli import CheckFailedError  # noqa: E402
from recsys_common.serving.client import InferenceClient, ServingError  # noqa: E402
from recsys_common.serving.triton_server import serve_repository  # noqa: E402
from recsys_common.serving.model_config import check_model_directory  # noqa: E402
from recsys_testing import free_port  # noqa: E402


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """Tiny dataset, a 4-epoch NeuMF checkpoint (HR@10 0.46), its CPU repository (ncf-onnx + ncf-ts), and Triton
    serving it."""
    root = tmp_path_factory.mktemp("serving")
    data, checkpoint = train_tiny_neumf(str(root))
    repo = str(root / "repo")
    result = deployer.main(["--load_checkpoint_path", checkpoint, "--save-dir", repo, "--deploy_cpu",
                            "--triton-max-batch-size", "8192", "--triton-dyn-batching-delay", "0.5",
                            "--triton-engine-count", "2", "--check_rows", "512", "--triton-backend", "python"])
    with serve_repository(repo, log_path=str(root / "tritonserver.log")) as server:
        yield {"root": root, "data": data, "checkpoint": checkpoint, "repo": repo, "server": server,
               "deploy": result}


def test_repository_configs_are_valid_triton_configs(deployed):
    onnx = check_model_directory(os.path.join(deployed["repo"], "ncf-onnx"))
    ts = check_model_directory(os.path.join(deployed["repo"], "ncf-ts"))
    assert (onnx.backend, ts.backend) == ("python", "python")
    assert (onnx.parameters["artifact"].string_value, ts.parameters["artifact"].string_value) == ("model.onnx",
                                                                                                  "model.pt")
    for config in (onnx, ts):
        assert config.max_batch_size == 8192
        assert config.dynamic_batching.max_queue_delay_microseconds == 500
        assert [(g.count, g.kind) for g in config.instance_group] == [(2, 2)]  # KIND_CPU = 2
        assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("user", 9, [1]), ("item", 9, [1])]
        assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("probability", 11, [1])]
    assert os.path.isfile(os.path.join(deployed["repo"], "ncf-onnx", "1", "model.onnx"))
    assert os.path.isfile(os.path.join(deployed["repo"], "ncf-ts", "1", "model.pt"))
    assert os.path.isfile(os.path.join(deployed["repo"], "ncf-ts", "1", "model.py"))
    # the deployer's own check after export, on 512 random rows
    assert deployed["deploy"]["max_abs_diff"]["ncf-ts"] == 0.0
    assert deployed["deploy"]["max_abs_diff"]["ncf-onnx"] <= 1e-6


def test_eager_torchscript_onnx_served_agree(deployed):
    import onnxruntime as ort
    model, config = load_model(deployed["checkpoint"])
    rng = np.random.default_rng(0)
    batch = {"user": rng.integers(0, config["num_users"], (300, 1)).astype(np.int64),
             "item": rng.integers(0, config["num_items"], (300, 1)).astype(np.int64)}
    with torch.no_grad():
        eager = torch.sigmoid(model(torch.from_numpy(batch["user"][:, 0]),
                                    torch.from_numpy(batch["item"][:, 0]))).numpy()[:, None]
        ts = torch.jit.load(os.path.join(deployed["repo"], "ncf-ts", "1", "model.pt"))(
            torch.from_numpy(batch["user"]), torch.from_numpy(batch["item"])).numpy()
    session = ort.InferenceSession(os.path.join(deployed["repo"], "ncf-onnx", "1", "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    onnx = session.run(["probability"], batch)[0]
    server = deployed["server"]
    served = {}
    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        with InferenceClient(url, protocol=protocol, timeout_s=30) as client:
            for model in ("ncf-onnx", "ncf-ts"):   # both exported formats, served by the same server
                served[protocol, model] = client.infer(model, batch, ["probability"])["probability"]
    assert eager.std() > 0.05  # a spread of scores, not a constant
    np.testing.assert_array_equal(ts, eager)
    for name, got in (("onnx", onnx), *served.items()):
        assert got.shape == (300, 1), name
        assert np.abs(got - eager).max() <= 1e-6, name
    np.testing.assert_array_equal(served["grpc", "ncf-onnx"], onnx)  # the server runs the same onnxruntime graph
    np.testing.assert_array_equal(served["http", "ncf-ts"], ts)      # ... and the same TorchScript module


def test_evaluate_accuracy_over_the_server_equals_the_recipe(deployed, tmp_path):
    recipe = ncf_train.main(["--data", deployed["data"], "--mode", "test", "--load_checkpoint_path",
                       deployed["checkpoint"], "-f", "8", "--layers", "16", "8", "--dropout", "0.5",
                       "--log_path", str(tmp_path / "test_log.json")])
    server = deployed["server"]
    out = tmp_path / "accuracy.json"
    result = evaluate_accuracy.main(["--data", deployed["data"], "--load_checkpoint_path", deployed["checkpoint"],
                                     "--grpc-url", server.grpc_url, "--http-url", server.http_url,
                                     "--batch-size", "5000", "--tolerance", "0", "--output-json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["framework"]["hr"] == pytest.approx(recipe["hr@10"], abs=1e-12)
    assert result["framework"]["ndcg"] == pytest.approx(recipe["ndcg@10"], abs=1e-12)
    for protocol in ("grpc", "http"):
        assert result[protocol]["hr"] == pytest.approx(recipe["hr@10"], abs=1e-12)
        assert result[protocol]["ndcg"] == pytest.approx(recipe["ndcg@10"], abs=1e-12)
        assert result[protocol]["users"] == result["framework"]["users"] > 100
        assert result[protocol]["max_abs_prob_diff"] <= 1e-6
    assert result["passed"] is True


def test_evaluate_accuracy_fails_beyond_tolerance(deployed, tmp_path):
    """Another checkpoint's evaluation against this server: the metrics differ, so exit 1 and say so."""
    other_ck = tmp_path / "ck"
    ncf_train.main(["--data", deployed["data"], "-e", "1", "-b", "4096", "-f", "8", "--layers", "16", "8", "--dropout",
              "0.5", "--seed", "7", "--checkpoint_dir", str(other_ck), "--log_path", str(tmp_path / "l.json")])
    with pytest.raises(CheckFailedError, match="differs by more than --tolerance") as err:
        evaluate_accuracy.main(["--data", deployed["data"], "--load_checkpoint_path", str(other_ck / "model.pth"),
                                "--grpc-url", deployed["server"].grpc_url, "--batch-size", "8192",
                                "--tolerance", "1e-4"])
    assert err.value.result["passed"] is False and err.value.result["grpc"]["passed"] is False


def test_evaluate_latency_writes_json_and_png(deployed, tmp_path):
    out_json, out_png = tmp_path / "latency.json", tmp_path / "latency.png"
    evaluate_latency.main(["--server-url", deployed["server"].grpc_url, "--protocol", "grpc",
                           "--model-name", "ncf-onnx", "--batch-sizes", "1", "64", "--concurrency", "1", "2",
                           "--num-requests", "8", "--warmup-requests", "2", "--data", deployed["data"],
                           "--output-json", str(out_json), "--output-png", str(out_png)])
    records = json.loads(out_json.read_text())
    records = records["records"] if isinstance(records, dict) else records
    assert sorted((r["batch_size"], r["concurrency"]) for r in records) == [(1, 1), (1, 2), (64, 1), (64, 2)]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("protocol, model", [("grpc", "ncf-onnx"), ("http", "ncf-ts")])
def test_perf_analyzer_agrees_with_evaluate_latency(deployed, tmp_path, protocol, model):
    """Triton's perf_analyzer runs against the served model (it reads the metadata and config, sends binary tensors
    over HTTP) and its throughput agrees with evaluate_latency's on the same rows, batch sizes and concurrencies,
    within the bounds measured on a loaded 2-core VM (``recsys_common.serving.perf_analyzer.check_agreement``)."""
    from recsys_common.serving.perf_analyzer import check_agreement
    from recsys_testing import perf_analyzer_path
    perf_analyzer_path()
    server = deployed["server"]
    records = evaluate_latency.main(["--server-url", server.grpc_url if protocol == "grpc" else server.http_url,
                                     "--protocol", protocol, "--model-name", model, "--batch-sizes", "64", "1024",
                                     "--concurrency", "1", "2", "--num-requests", "20", "--warmup-requests", "4",
                                     "--data", deployed["data"], "--perf-analyzer", "--perf-analyzer-interval-ms", "300",
                                     "--output-json", str(tmp_path / "l.json"), "--output-png", str(tmp_path / "l.png")])
    assert [(r["batch_size"], r["concurrency"]) for r in records] == [(64, 1), (64, 2), (1024, 1), (1024, 2)]
    for r in records:
        assert (r["perf_analyzer"]["batch_size"], r["perf_analyzer"]["concurrency"]) == (r["batch_size"],
                                                                                       r["concurrency"])
    check_agreement(records)
    assert json.loads((tmp_path / "l.json").read_text())["records"][0]["perf_analyzer"]["tool"] == "perf_analyzer"


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_ids_out_of_range_wrong_dtype_and_shape_are_clear_errors(deployed, protocol):
    server = deployed["server"]
    url = server.grpc_url if protocol == "grpc" else server.http_url
    _, config = load_model(deployed["checkpoint"])
    with InferenceClient(url, protocol=protocol, timeout_s=30) as client:
        with pytest.raises(ServingError, match="item"):
            client.infer("ncf-onnx", {"user": np.array([[0], [1]], np.int64),
                                      "item": np.array([[0], [config["num_items"]]], np.int64)}, ["probability"])
        with pytest.raises(ServingError, match="user"):
            client.infer("ncf-onnx", {"user": np.array([[-1]], np.int64), "item": np.array([[0]], np.int64)},
                         ["probability"])
        with pytest.raises(ServingError, match="(?i)dtype|datatype|int64|FP32"):
            client.infer("ncf-onnx", {"user": np.array([[0.0]], np.float32), "item": np.array([[0]], np.int64)},
                         ["probability"])
        with pytest.raises(ServingError, match="(?i)shape"):
            client.infer("ncf-onnx", {"user": np.zeros((2, 2), np.int64), "item": np.zeros((2, 2), np.int64)},
                         ["probability"])
        # the server is still serving after the bad requests
        ok = client.infer("ncf-onnx", {"user": np.array([[0]], np.int64), "item": np.array([[0]], np.int64)},
                          ["probability"])
        assert ok["probability"].shape == (1, 1)


def test_existing_repository_needs_overwrite_and_keeps_user_files(deployed, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(deployed["repo"], repo)
    notes = repo / "NOTES.txt"
    notes.write_text("mine")
    before = (repo / "ncf-onnx" / "config.pbtxt").read_text()
    args = ["--load_checkpoint_path", deployed["checkpoint"], "--save-dir", str(repo), "--onnx", "--deploy_cpu",
            "--triton-max-batch-size", "16", "--check_rows", "0"]
    with pytest.raises(FileExistsError, match="--overwrite"):
        deployer.main(args)
    assert (repo / "ncf-onnx" / "config.pbtxt").read_text() == before
    deployer.main(args + ["--overwrite"])
    assert check_model_directory(str(repo / "ncf-onnx")).max_batch_size == 16
    assert notes.read_text() == "mine"


@pytest.mark.parametrize("extra, message", [
    (["--layers", "32", "16"], "--layers 32 16 given, the checkpoint was trained with --layers 16 8"),
    (["-f", "64"], "-f/--factors 64 given, the checkpoint was trained with -f/--factors 8"),
    (["--n_items", "5"], "--n_items 5 given"),
    (["--ts-script", "--ts-trace"], "choose one"),
])
def test_deployer_flag_checkpoint_mismatch_is_a_clear_error(deployed, tmp_path, extra, message):
    repo = tmp_path / "repo"
    with pytest.raises(deployer.INPUT_ERRORS) as err:
        deployer.main(["--load_checkpoint_path", deployed["checkpoint"], "--save-dir", str(repo), *extra])
    assert message in str(err.value)
    assert not repo.exists()


def test_unreachable_server_is_a_clear_error_within_the_timeout(deployed):
    port = free_port()
    start = time.monotonic()
    with pytest.raises(ServingError) as err:
        evaluate_accuracy.main(["--data", deployed["data"], "--load_checkpoint_path", deployed["checkpoint"],
                                "--grpc-url", f"127.0.0.1:{port}", "--timeout", "3", "--max_users", "5"])
    assert f"127.0.0.1:{port}" in str(err.value)
    assert time.monotonic() - start < 30


def test_deployer_command_line(deployed, tmp_path):
    """The README's command, as a user runs it (script path, not an import)."""
    repo = tmp_path / "repo"
    proc = subprocess.run([sys.executable, os.path.join(NCF_DIR, "deployment", "deployer.py"), "--ts-trace",
                           "--load_checkpoint_path", deployed["checkpoint"], "--save-dir", str(repo),
                           "--check_rows", "64"], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["max_abs_diff"] == {"ncf-ts": 0.0}
    assert check_model_directory(str(repo / "ncf-ts")).instance_group[0].kind == 1  # KIND_GPU by default
