"""Served predictions: deploy.py's CPU repository (``--triton-backend python``) served by a real Triton server and
queried with tritonclient over HTTP and gRPC, for DLRM and DCNv2 (multi-hot tables).

One server for the whole module (``recsys_common.serving.triton_server.serve_repository``: loopback, free ports,
always stopped) serving, through Triton's Python backend, both ONNX models, DCNv2's SavedModel (TensorFlow inside the
stub), and both sparse/dense pairs chained by Triton's own ensemble scheduler. Tolerances measured 2026-11-24
(TF 2.21 CPU, onnxruntime 1.32): served vs Keras at most ~1e-7, asserted 1e-6.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from serving_fixtures import SHAPES, write_checkpoint, write_feature_spec

TOLERANCE = 1e-6
RECIPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the server loads (explicit model control): each ensemble brings its -sparse and -dense steps. One SavedModel
# only: every SavedModel instance is a stub importing TensorFlow (seconds and ~0.5 GB each).
SERVED = ["dlrm-onnx", "dcnv2-onnx", "dcnv2-savedmodel", "dlrm", "dcnv2"]


class Deployed:
    """Checkpoints, datasets and repositories of both models, plus the combined repository the server serves."""


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    from deployment import deploy
    root = tmp_path_factory.mktemp("serving")
    d = Deployed()
    d.checkpoints = {m: write_checkpoint(root / "ckpt" / m, m) for m in SHAPES}
    d.data = {m: os.path.dirname(write_feature_spec(root / "data" / m, m, rows=300)) for m in SHAPES}
    d.repos = {m: str(root / f"repo_{m}") for m in SHAPES}
    for m in SHAPES:
        result = deploy.main(["--checkpoint-dir", os.path.dirname(d.checkpoints[m]), "--model-repository-path",
                              d.repos[m], "--layout", "both", "--sparse-format", "onnx", "--dense-format", "onnx",
                              "--cpu", "--dataset_path", d.data[m], "--max-batch-size", "4096",
                              "--dynamic-batching-delay-us", "200", "--engine-count-per-device", "2",
                              "--triton-backend", "python"])
        assert result["models"] == {f"{m}-onnx": "onnxruntime_onnx", f"{m}-savedmodel": "tensorflow_savedmodel",
                                    f"{m}-sparse": "onnxruntime_onnx", f"{m}-dense": "onnxruntime_onnx",
                                    m: "ensemble"}
    # One repository with both models' models, so one server serves everything.
    d.served = str(root / "served")
    os.makedirs(d.served)
    for m in SHAPES:
        for suffix in ("", "-onnx", "-savedmodel", "-sparse", "-dense"):
            shutil.copytree(os.path.join(d.repos[m], m + suffix), os.path.join(d.served, m + suffix))
    return d


@pytest.fixture(scope="module")
def server(deployed):
    from recsys_common.serving.triton_server import serve_repository
    with serve_repository(deployed.served, SERVED, startup_timeout_s=240, intra_op_threads=1) as handle:
        yield handle


@pytest.fixture(scope="module")
def loaded(deployed):
    from dlrm_dcnv2.serving import load_checkpoint_model
    return {m: load_checkpoint_model(deployed.checkpoints[m]) for m in SHAPES}


def _infer(url, protocol, model, inputs, output):
    from recsys_common.serving.client import InferenceClient
    with InferenceClient(url, protocol, timeout_s=60) as client:
        return client.infer(model, inputs, [output])[output]


def test_generated_model_directories(deployed):
    from recsys_common.serving.model_config import check_model_directory
    from recsys_common.serving.repository import read_sidecar
    repo = deployed.repos["dcnv2"]
    configs = {name: check_model_directory(os.path.join(repo, name)) for name in os.listdir(repo)
               if not name.startswith(".")}
    assert sorted(configs) == ["dcnv2", "dcnv2-dense", "dcnv2-onnx", "dcnv2-savedmodel", "dcnv2-sparse"]
    onnx = configs["dcnv2-onnx"]
    assert onnx.max_batch_size == 4096 and onnx.dynamic_batching.max_queue_delay_microseconds == 200
    assert onnx.instance_group[0].count == 2 and onnx.instance_group[0].kind == 2  # KIND_CPU
    dims = {t.name: list(t.dims) for t in onnx.input}
    assert dims == {"numerical": [5], "cat_0": [1], "cat_1": [3], "cat_2": [1], "cat_3": [2]}
    assert onnx.backend == "python" and onnx.parameters["artifact"].string_value == "model.onnx"
    assert configs["dcnv2-savedmodel"].parameters["artifact"].string_value == "model.savedmodel"
    ensemble = configs["dcnv2"]
    assert ensemble.platform == "ensemble"
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == ["dcnv2-sparse", "dcnv2-dense"]
    assert dict(ensemble.ensemble_scheduling.step[1].input_map) == {"numerical": "numerical",
                                                                   "embeddings": "embeddings"}
    sidecar = read_sidecar(os.path.join(repo, "dcnv2-onnx"))
    assert sidecar["inputs"]["cat_1"] == {"dtype": "int64", "dims": [3], "max_id": 25, "min_id": -1}
    assert sidecar["features"]["cat_3"] == "cat_3.bin" and sidecar["feature_spec"]["channel_spec"]


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_keras_savedmodel_onnxruntime_and_served_agree(deployed, server, loaded, model):
    import onnxruntime as ort
    import tensorflow as tf
    from dlrm_dcnv2.serving import keras_probabilities, random_inputs
    batch = random_inputs(loaded[model], 29, seed=4)
    reference = keras_probabilities(loaded[model], batch)
    saved = tf.saved_model.load(os.path.join(deployed.repos[model], f"{model}-savedmodel", "1", "model.savedmodel"))
    outputs = {"savedmodel": saved.signatures["serving_default"](
        **{k: tf.constant(v) for k, v in batch.items()})["probability"].numpy()}
    session = ort.InferenceSession(os.path.join(deployed.repos[model], f"{model}-onnx", "1", "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    outputs["onnxruntime"] = session.run(["probability"], batch)[0]
    outputs["grpc"] = _infer(server.grpc_url, "grpc", f"{model}-onnx", batch, "probability")
    outputs["http"] = _infer(server.http_url, "http", f"{model}-onnx", batch, "probability")
    outputs["ensemble"] = _infer(server.grpc_url, "grpc", model, batch, "probability")   # Triton's scheduler
    if f"{model}-savedmodel" in SERVED:
        outputs["served savedmodel"] = _infer(server.http_url, "http", f"{model}-savedmodel", batch, "probability")
    for name, value in outputs.items():
        assert value.shape == (29, 1), name
        assert np.abs(value - reference).max() <= TOLERANCE, name


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_served_sparse_then_dense_equals_monolithic(server, loaded, model):
    from dlrm_dcnv2.serving import random_inputs
    batch = random_inputs(loaded[model], 21, seed=5)
    ids = {k: v for k, v in batch.items() if k.startswith("cat_")}
    embeddings = _infer(server.grpc_url, "grpc", f"{model}-sparse", ids, "embeddings")
    assert embeddings.shape == (21, sum(SHAPES[model]["embedding_dims"]))
    chained = _infer(server.http_url, "http", f"{model}-dense",
                     {"numerical": batch["numerical"], "embeddings": embeddings}, "probability")
    monolithic = _infer(server.grpc_url, "grpc", f"{model}-onnx", batch, "probability")
    assert np.abs(chained - monolithic).max() <= TOLERANCE


def test_bad_requests_are_clear_errors(server, loaded):
    from recsys_common.serving.client import InferenceClient, ServingError
    from recsys_common.machine import free_port
    from dlrm_dcnv2.serving import random_inputs
    good = random_inputs(loaded["dcnv2"], 4, seed=6)
    cases = [
        ("cat_0", np.zeros((4, 2), np.int64), r"unexpected shape for input 'cat_0' for model 'dcnv2-onnx'\. "
                                               r"Expected \[-1,1\], got \[4,2\]"),   # Triton's own checks
        ("cat_0", good["cat_0"].reshape(2, 2), r"input 'cat_0' batch size does not match other inputs"),
        ("cat_0", good["cat_0"].astype(np.int32), r"input 'cat_0' data-type is 'INT32', but model 'dcnv2-onnx' "
                                                  r"expects 'INT64'"),
        ("cat_2", np.full((4, 1), 10, np.int64), r"input 'cat_2': id 10 \(row 0\) is out of range; ids must be in "
                                                 r"\[0, 10\)"),
        ("cat_0", np.full((4, 1), -1, np.int64), r"input 'cat_0': id -1 \(row 0\) is out of range; ids must be in "
                                                 r"\[0, 40\)"),
        ("cat_1", np.full((4, 3), -2, np.int64), r"input 'cat_1': id -2 \(row 0\) is out of range; ids must be in "
                                                 r"\[-1, 25\)"),
    ]
    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        with InferenceClient(url, protocol, timeout_s=30) as client:
            for name, value, message in cases:
                with pytest.raises(ServingError, match=message):
                    client.infer("dcnv2-onnx", dict(good, **{name: value}), ["probability"])
            # the server survived every bad request
            assert client.infer("dcnv2-onnx", good, ["probability"])["probability"].shape == (4, 1)
    begin = time.monotonic()
    with pytest.raises(ServingError, match="not reachable"):
        with InferenceClient(f"127.0.0.1:{free_port()}", "grpc", timeout_s=3) as client:
            client.infer("dcnv2-onnx", good, ["probability"])
    assert time.monotonic() - begin < 20


def test_evaluate_accuracy_matches_the_recipe_over_http_and_grpc(deployed, server, tmp_path):
    from deployment import evaluate_accuracy
    out = tmp_path / "accuracy.json"
    argv = ["--dataset_path", deployed.data["dcnv2"], "--checkpoint", deployed.checkpoints["dcnv2"],
            "--model_name", "dcnv2-onnx", "--server_url", server.grpc_url, "--http_url", server.http_url,
            "--batch_size", "64", "--tolerance", "1e-6"]
    report = evaluate_accuracy.main(argv + ["--output_json", str(out)])
    assert report["rows"] == 300 and report["passed"]
    assert json.loads(out.read_text())["served"]["http"]["auc_exact"] == report["served"]["http"]["auc_exact"]
    for protocol in ("grpc", "http"):
        entry = report["served"][protocol]
        assert abs(entry["auc_exact_difference"]) <= 1e-6 and entry["max_abs_probability_difference"] <= TOLERANCE
        for key in ("log_loss", "normalized_entropy", "calibration"):   # issue 33: served = recipe
            assert abs(entry[f"{key}_difference"]) <= 1e-5, (protocol, key, entry)
    assert 0.2 < report["recipe"]["auc_exact"] < 0.8  # random labels: near 0.5, and the same on both sides
    # Another checkpoint of the same shape as the recipe's side: the comparison fails, exit status 1.
    other = write_checkpoint(tmp_path / "other", "dcnv2", seed=99)
    bad = list(argv)
    bad[bad.index("--checkpoint") + 1] = other
    assert evaluate_accuracy.cli(bad + ["--protocols", "grpc"]) == 1


def test_evaluate_latency_against_the_server(deployed, server, tmp_path):
    from deployment import evaluate_latency
    records = evaluate_latency.main(
        ["--server-url", server.grpc_url, "--model-name", "dlrm-onnx", "--dataset_path", deployed.data["dlrm"],
         "--batch-sizes", "1", "16", "--concurrency", "1", "2", "--num-requests", "6", "--warmup-requests", "1",
         "--output-json", str(tmp_path / "lat.json"), "--output-png", str(tmp_path / "lat.png")])
    assert [(r["batch_size"], r["concurrency"]) for r in records] == [(1, 1), (1, 2), (16, 1), (16, 2)]
    saved = json.loads((tmp_path / "lat.json").read_text())
    assert len(saved["records"] if isinstance(saved, dict) else saved) == 4
    assert (tmp_path / "lat.png").read_bytes()[:4] == b"\x89PNG"
    # random rows from the sidecar (multi-hot model) over HTTP
    records = evaluate_latency.main(
        ["--server-url", server.http_url, "--protocol", "http", "--model-name", "dcnv2-onnx",
         "--model-repository-path", deployed.served, "--batch-sizes", "8", "--concurrency", "1",
         "--num-requests", "3", "--warmup-requests", "1", "--output-json", str(tmp_path / "l2.json"),
         "--output-png", str(tmp_path / "l2.png")])
    assert records[0]["requests"] == 3


@pytest.mark.parametrize("protocol, name", [("grpc", "dlrm-onnx"), ("http", "dcnv2-onnx")])
def test_perf_analyzer_agrees_with_evaluate_latency(deployed, server, tmp_path, protocol, name):
    """Triton's perf_analyzer runs against the served model (metadata, config, binary tensors over HTTP; the
    multi-hot DCNv2 too) and its throughput agrees with evaluate_latency's on the same rows, batch sizes and
    concurrencies, within the bounds measured on a loaded 2-core VM (``perf_analyzer.check_agreement``)."""
    from deployment import evaluate_latency
    from recsys_common.serving.perf_analyzer import check_agreement
    from recsys_testing import perf_analyzer_path
    perf_analyzer_path()
    source = (["--dataset_path", deployed.data["dlrm"]] if name == "dlrm-onnx"
              else ["--model-repository-path", deployed.served])
    records = evaluate_latency.main(
        ["--server-url", server.grpc_url if protocol == "grpc" else server.http_url, "--protocol", protocol,
         "--model-name", name, *source, "--batch-sizes", "16", "256", "--concurrency", "1", "2",
         "--num-requests", "20", "--warmup-requests", "3", "--perf-analyzer", "--perf-analyzer-interval-ms", "300",
         "--output-json", str(tmp_path / "lat.json"), "--output-png", str(tmp_path / "lat.png")])
    assert [(r["batch_size"], r["concurrency"]) for r in records] == [(16, 1), (16, 2), (256, 1), (256, 2)]
    for r in records:
        assert (r["perf_analyzer"]["batch_size"], r["perf_analyzer"]["concurrency"], r["perf_analyzer"]["model"]) \
            == (r["batch_size"], r["concurrency"], name)
    check_agreement(records)


def test_deploy_refuses_what_it_must(deployed, tmp_path):
    from recsys_common.io import OutputDirectoryError
    from deployment import deploy
    from dlrm_dcnv2.checkpointing import CheckpointError
    ckpt = deployed.checkpoints["dlrm"]
    repo = deployed.repos["dlrm"]
    with pytest.raises(OutputDirectoryError, match="not empty"):
        deploy.main(["--checkpoint-dir", ckpt, "--model-repository-path", repo, "--formats", "onnx"])
    with pytest.raises(deploy.DeployError, match="Merlin HPS .* not on PyPI"):
        deploy.main(["--checkpoint-dir", ckpt, "--model-repository-path", str(tmp_path / "r"), "--layout",
                     "ensemble", "--sparse-format", "hps"])
    with pytest.raises(CheckpointError, match=r"feature 'cat_1.bin' \(table 1\) has max_hotness 3, the checkpoint "
                                              r"was trained with 1"):
        deploy.main(["--checkpoint-dir", ckpt, "--model-repository-path", str(tmp_path / "r"),
                     "--dataset_path", deployed.data["dcnv2"]])  # DCNv2's data (multi-hot) for the DLRM checkpoint
    assert not os.path.exists(tmp_path / "r") or not os.listdir(tmp_path / "r")
    # --overwrite replaces this tool's models and keeps a user's file
    mine = os.path.join(repo, "NOTES.txt")
    with open(mine, "w") as f:
        f.write("mine")
    result = deploy.main(["--checkpoint-dir", ckpt, "--model-repository-path", repo, "--formats", "onnx",
                          "--overwrite", "--model-name", "ctr"])
    assert result["models"] == {"ctr-onnx": "onnxruntime_onnx"}
    assert sorted(n for n in os.listdir(repo) if not n.startswith(".")) == ["NOTES.txt", "ctr-onnx"]


def test_deploy_command_line(deployed, tmp_path):
    """The module runs as the README says (``python -m deployment.deploy``); flag errors exit 2 naming the flag."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([RECIPE_DIR, os.path.join(RECIPE_DIR, "..", "..", "common")]))
    proc = subprocess.run([sys.executable, "-m", "deployment.deploy", "--checkpoint-dir", deployed.checkpoints["dlrm"],
                           "--model-repository-path", str(tmp_path / "r"), "--max-batch-size", "0"],
                          cwd=RECIPE_DIR, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--max-batch-size must be at least 1, got 0" in proc.stderr
