"""A real Triton server (``recsys_common.serving.triton_server``) serving the tiny CPU repository: every model through
the Python backend (ONNX, TorchScript, a BYTES model) and Triton's own ensemble, queried with tritonclient over gRPC
and HTTP, with our latency tool and with perf_analyzer. One server for the module; the server's lifetime (failing
body, killed launcher, failed start, CLI) with servers of their own.

The values are checked, not only the shapes: the Python backend's stub under numpy 2 returned every element equal to
the first one (``ci/install_tritonserver.sh``), which only a value check catches.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest

from recsys_common.machine import free_port
from recsys_common.serving.client import InferenceClient, ServingError, infer_in_batches
from recsys_common.serving.triton_server import serve_repository
from recsys_testing import perf_analyzer_path
from serving_tiny_model import (ENSEMBLE_NAME, MAX_BATCH_SIZE, MAX_ID, MODEL_NAME, STRING_MODEL_NAME, TOKENS,
                                TS_MODEL_NAME, expected_probability, tiny_inputs, token_ids, write_tiny_cpu_repository)
from triton_processes import group_alive, servers_of, tritonserver_processes

PROTOCOLS = ["grpc", "http"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("triton") / "repo")
    write_tiny_cpu_repository(path)
    yield path
    assert servers_of(path) == [], "a tritonserver of this module's repository is still running"


@pytest.fixture(scope="module")
def server(repo):
    with serve_repository(repo, startup_timeout_s=120) as handle:
        yield handle
    assert not group_alive(handle.pid)


def _url(server, protocol):
    return server.grpc_url if protocol == "grpc" else server.http_url


def _raw_inputs(rows, seed=0):
    rng = np.random.default_rng(seed)
    tokens = np.array([[TOKENS[i].encode()] for i in rng.integers(0, MAX_ID, rows)] + [[b"zz"]], dtype=object)
    return {"numerical": rng.random((rows + 1, 3), dtype=np.float32), "token": tokens}


@pytest.mark.parametrize("model", [MODEL_NAME, TS_MODEL_NAME])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_values_match_the_model(server, protocol, model):
    """ONNX (onnxruntime) and TorchScript (torch) inside the Python backend give the model's values."""
    inputs = tiny_inputs(7)
    with InferenceClient(_url(server, protocol), protocol, timeout_s=30) as client:
        out = client.infer(model, inputs, ["probability"])
    assert out["probability"].shape == (7, 1) and out["probability"].dtype == np.float32
    np.testing.assert_allclose(out["probability"], expected_probability(**inputs), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bytes_inputs_and_triton_ensemble(server, protocol):
    """BYTES tensors reach the model intact (raw tokens -> ids, an unknown token -> 0), and Triton's ensemble
    scheduler chains the string model and the ONNX model."""
    raw = _raw_inputs(6, seed=2)
    with InferenceClient(_url(server, protocol), protocol, timeout_s=30) as client:
        ids = client.infer(STRING_MODEL_NAME, {"token": raw["token"]}, ["cat"])["cat"]
        chained = client.infer(ENSEMBLE_NAME, raw, ["probability"])["probability"]
    np.testing.assert_array_equal(ids, token_ids(raw["token"]))
    assert ids[-1, 0] == 0
    np.testing.assert_allclose(chained, expected_probability(raw["numerical"], ids), rtol=1e-6, atol=1e-7)


def test_served_configuration_is_the_python_backend_variant(server):
    """Triton loaded the configs as written (auto-complete off): names, tensors, batching, the artifact."""
    def config(model):
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/config", timeout=20) as response:
            return json.loads(response.read())
    onnx = config(MODEL_NAME)
    assert (onnx["backend"], onnx["platform"], onnx["max_batch_size"]) == ("python", "", MAX_BATCH_SIZE)
    assert onnx["parameters"]["artifact"]["string_value"] == "model.onnx"
    assert [(i["name"], i["data_type"], i["dims"]) for i in onnx["input"]] == \
        [("numerical", "TYPE_FP32", [3]), ("cat", "TYPE_INT64", [1])]
    assert config(TS_MODEL_NAME)["parameters"]["artifact"]["string_value"] == "model.pt"
    ensemble = config(ENSEMBLE_NAME)
    assert ensemble["platform"] == "ensemble"
    assert [s["model_name"] for s in ensemble["ensemble_scheduling"]["step"]] == [STRING_MODEL_NAME, MODEL_NAME]


def test_concurrent_requests_are_batched_and_split_back(server):
    """Requests that Triton's dynamic batcher gathers run as one call; each gets its own rows back."""
    def stats():
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{STRING_MODEL_NAME}/stats",
                                    timeout=20) as response:
            entry = json.loads(response.read())["model_stats"][0]
        return entry["inference_count"], entry["execution_count"]
    before = stats()
    requests = [_raw_inputs(n, seed=n)["token"] for n in range(1, 25)]
    results, errors = [None] * len(requests), []

    def send(i):
        try:
            with InferenceClient(server.grpc_url, "grpc", timeout_s=60) as client:
                for _ in range(5):
                    results[i] = client.infer(STRING_MODEL_NAME, {"token": requests[i]}, ["cat"])["cat"]
        except Exception as e:  # reported below, with the request
            errors.append((i, e))
    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for tokens, ids in zip(requests, results):
        np.testing.assert_array_equal(ids, token_ids(tokens))
    inferences, executions = (a - b for a, b in zip(stats(), before))
    assert inferences == 5 * sum(len(r) for r in requests)
    assert executions < 5 * len(requests), "no two requests ran in one execution"


def test_full_batch_over_grpc_and_one_row_more_refused(server):
    """A full batch (a 5 MiB message, above gRPC's 4 MiB default) is answered; one row more, Triton refuses."""
    inputs = tiny_inputs(MAX_BATCH_SIZE + 1)
    with InferenceClient(server.grpc_url, "grpc", timeout_s=60) as client:
        with pytest.raises(ServingError, match=f"batch-size must be <= {MAX_BATCH_SIZE} for .{MODEL_NAME}."):
            client.infer(MODEL_NAME, inputs, ["probability"])
        full = {name: a[:MAX_BATCH_SIZE] for name, a in inputs.items()}
        out = client.infer(MODEL_NAME, full, ["probability"])
    np.testing.assert_allclose(out["probability"], expected_probability(**full), rtol=1e-5, atol=1e-6)


def test_infer_in_batches_keeps_row_order(server, capsys):
    inputs = tiny_inputs(23, seed=3)
    with InferenceClient(server.grpc_url, "grpc", timeout_s=20) as client:
        out = infer_in_batches(client, MODEL_NAME, inputs, ["probability"], batch_size=5)
    np.testing.assert_allclose(out["probability"], expected_probability(**inputs), rtol=1e-6, atol=1e-7)
    assert f"[infer] {MODEL_NAME}: 23 of 23 rows (100.0 %)" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ latency tools
def test_run_latency_from_the_shared_flags(server, tmp_path, capsys):
    import argparse
    from recsys_common.serving.latency import add_latency_arguments, run_latency
    parser = add_latency_arguments(argparse.ArgumentParser(), default_model_name=MODEL_NAME)
    args = parser.parse_args(["--server-url", server.http_url, "--protocol", "http", "--batch-sizes", "1", "8",
                              "--concurrency", "1", "2", "--num-requests", "6", "--warmup-requests", "1",
                              "--output-json", str(tmp_path / "l.json")])
    records = run_latency(server_url=args.server_url, protocol=args.protocol, model_name=args.model_name,
                          batch_sizes=args.batch_sizes, concurrency=args.concurrency, num_requests=args.num_requests,
                          warmup_requests=args.warmup_requests, timeout_s=args.timeout, output_json=args.output_json,
                          output_png=None, make_inputs=tiny_inputs, output_names=["probability"])
    assert [(r["batch_size"], r["concurrency"], r["requests"]) for r in records] == \
        [(1, 1, 6), (1, 2, 6), (8, 1, 6), (8, 2, 6)]
    for r in records:
        if r["concurrency"] == 1:   # one client at a time: throughput <= rows / mean latency
            assert r["throughput_samples_per_s"] <= r["batch_size"] * 1000.0 / r["latency_ms"]["mean"] * 1.01
    assert "batch      8  concurrency   2" in capsys.readouterr().out
    assert json.load(open(tmp_path / "l.json"))["records"] == records


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_perf_analyzer_runs_against_the_server(server, protocol):
    """Triton's own benchmarking client reads the metadata and config of the real server and sends our rows."""
    from recsys_common.serving.perf_analyzer import run_perf_analyzer
    perf_analyzer_path()
    model = TS_MODEL_NAME if protocol == "http" else MODEL_NAME
    records = run_perf_analyzer(_url(server, protocol), protocol, model, tiny_inputs, 8, [1, 2],
                                measurement_interval_ms=300, timeout_s=120)
    assert [(r["batch_size"], r["concurrency"], r["protocol"]) for r in records] == [(8, 1, protocol),
                                                                                   (8, 2, protocol)]
    for r in records:
        assert r["throughput_samples_per_s"] == pytest.approx(8 * r["throughput_requests_per_s"])


def test_perf_analyzer_refusals_are_clear_errors(server):
    from recsys_common.serving.perf_analyzer import run_perf_analyzer
    perf_analyzer_path()
    start = time.monotonic()
    with pytest.raises(ServingError, match="(?s)model 'no-such-model' failed.*(unknown model|not found)"):
        run_perf_analyzer(server.grpc_url, "grpc", "no-such-model", tiny_inputs, 4, [1], timeout_s=60)
    with pytest.raises(ServingError, match=r"input 'cat': id 10 \(row 0\) is out of range"):
        run_perf_analyzer(server.grpc_url, "grpc", MODEL_NAME,
                          lambda n: dict(tiny_inputs(n), cat=np.full((n, 1), MAX_ID)), 4, [1],
                          measurement_interval_ms=200, timeout_s=60)
    with pytest.raises(ServingError, match="(?i)connect"):
        run_perf_analyzer(f"127.0.0.1:{free_port()}", "http", MODEL_NAME, tiny_inputs, 4, [1], timeout_s=60)
    assert time.monotonic() - start < 120


# ------------------------------------------------------------------------------------------------ lifetime
def test_explicit_models_load_an_ensemble_with_its_steps(repo):
    """``models`` given: explicit model control; the ensemble's steps load with it, the other models do not."""
    with serve_repository(repo, [ENSEMBLE_NAME], startup_timeout_s=120) as handle:
        raw = _raw_inputs(3)
        with InferenceClient(handle.grpc_url, "grpc", timeout_s=30) as client:
            out = client.infer(ENSEMBLE_NAME, raw, ["probability"])["probability"]
            assert not client.is_model_ready(TS_MODEL_NAME)
        np.testing.assert_allclose(out, expected_probability(raw["numerical"], token_ids(raw["token"])), rtol=1e-6)
        with pytest.raises(RuntimeError, match="the body failed"):   # and the group goes when the body raises
            with serve_repository(repo, [MODEL_NAME]) as inner:
                raise RuntimeError("the body failed")
        assert not group_alive(inner.pid)
    assert not group_alive(handle.pid)


def test_server_stops_itself_when_its_launcher_is_killed(repo):
    """SIGKILL of the process that started the server (no ``finally`` runs there): the watchdog stops it."""
    script = ("import sys, time\n"
              "from recsys_common.serving.triton_server import serve_repository\n"
              "with serve_repository(sys.argv[1], [sys.argv[2]]) as handle:\n"
              "    print(handle.pid, flush=True)\n"
              "    time.sleep(300)\n")
    launcher = subprocess.Popen([sys.executable, "-c", script, repo, MODEL_NAME], stdout=subprocess.PIPE, text=True)
    watchdog_pid = None
    try:
        watchdog_pid = int(launcher.stdout.readline())
        assert group_alive(watchdog_pid)   # the watchdog, the server and its stub: one process group
        launcher.kill()
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 30
        while group_alive(watchdog_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_alive(watchdog_pid)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if watchdog_pid and group_alive(watchdog_pid):
            os.killpg(watchdog_pid, signal.SIGKILL)


def test_a_model_triton_refuses_fails_the_start_with_the_log(tmp_path):
    """Triton's own validation is the test: a config it refuses stops the start with its message."""
    from serving_tiny_model import write_tiny_repository
    model_dir = write_tiny_repository(str(tmp_path / "repo"), backend="python")
    config = os.path.join(model_dir, "config.pbtxt")
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:   # a preferred batch size above max_batch_size: Triton refuses the config
        f.write(text + "dynamic_batching {\n  preferred_batch_size: 1000000\n}\n")
    start = time.monotonic()
    with pytest.raises(ServingError) as info:
        with serve_repository(str(tmp_path / "repo"), startup_timeout_s=60):
            pass
    message = str(info.value)
    assert "exited with status" in message and f"preferred size must be <= max batch size for {MODEL_NAME}" in message
    assert time.monotonic() - start < 60 and servers_of(str(tmp_path / "repo")) == []


def test_a_repository_this_server_cannot_run_is_refused_before_starting(tmp_path):
    from serving_tiny_model import write_tiny_repository
    write_tiny_repository(str(tmp_path / "repo"))   # platform onnxruntime_onnx: the GPU repository
    with pytest.raises(ServingError, match="needs Triton's 'onnxruntime' backend, which the tritonserver at .* "
                                           "lacks .*backend \"python\""):
        with serve_repository(str(tmp_path / "repo")):
            pass
    with pytest.raises(ServingError, match="no model 'nope'"):
        with serve_repository(str(tmp_path / "repo"), ["nope"]):
            pass


def test_cli_serves_until_interrupted(repo):
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "recsys_common.serving.triton_server", "--model-repository", repo,
               "--models", MODEL_NAME, "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()  # one line once every model is ready
        assert re.search(f"HTTP 127.0.0.1:{http_port}, gRPC 127.0.0.1:{grpc_port}", line), line
        with InferenceClient(f"127.0.0.1:{http_port}", "http", timeout_s=20) as client:
            inputs = tiny_inputs(3)
            np.testing.assert_allclose(client.infer(MODEL_NAME, inputs, ["probability"])["probability"],
                                       expected_probability(**inputs), rtol=1e-6)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "server stopped" in output, output
        assert tritonserver_processes(f"--http-port={http_port}") == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
