"""The tiny ONNX model served by MLServer (``serve_repository``) and queried with tritonclient over gRPC and HTTP,
as users query Triton: predictions, bad requests answered with clear errors while the server keeps serving,
unreachable servers, failed starts, and the process group gone after the block. One server for the module.

mlserver is never imported here: it and ``tritonclient.grpc`` cannot share a process.
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from recsys_common.serving.client import InferenceClient, ServingError, infer_in_batches
from recsys_common.serving.mlserver_launcher import free_port, serve_repository
from recsys_testing import perf_analyzer_path
from serving_tiny_model import (MAX_BATCH_SIZE, MAX_ID, MODEL_NAME, TS_MODEL_NAME, expected_probability, tiny_inputs,
                                write_tiny_repository, write_tiny_torchscript)

PROTOCOLS = ["grpc", "http"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("serving") / "repo")
    write_tiny_repository(path)
    write_tiny_torchscript(path)
    return path


@pytest.fixture(scope="module")
def server(repo):
    with serve_repository(repo, startup_timeout_s=120) as handle:
        yield handle
    assert not _group_alive(handle.pid)


def _url(server, protocol):
    return server.grpc_url if protocol == "grpc" else server.http_url


@pytest.mark.parametrize("model", [MODEL_NAME, TS_MODEL_NAME])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_predictions_match_the_model(server, protocol, model):
    """The ONNX model (onnxruntime) and the same model as TorchScript (torch) both serve the expected scores."""
    inputs = tiny_inputs(7)
    with InferenceClient(_url(server, protocol), protocol, timeout_s=20) as client:
        client.wait_until_ready(model, timeout_s=20)
        out = client.infer(model, inputs, ["probability"])
    assert out["probability"].shape == (7, 1)
    assert out["probability"].dtype == np.float32
    np.testing.assert_allclose(out["probability"], expected_probability(**inputs), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case, message", [
    ("wrong_shape", "input 'numerical': expected shape [B, 3], got [4, 2]"),
    ("wrong_rank", "input 'cat': expected shape [B, 1] (rank 2), got [4]"),
    ("wrong_dtype", "input 'numerical': expected datatype FP32, got FP64"),
    ("missing_input", "missing input(s) ['cat']"),
    ("unknown_input", "unknown input(s) ['extra']"),
    ("id_above_max", f"input 'cat': id {MAX_ID + 3} (row 2) is out of range; ids must be in [0, {MAX_ID})"),
    ("negative_id", "input 'cat': id -1 (row 0) is out of range"),
    ("batch_mismatch", "batch size 3 differs"),
])
def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(server, protocol, case, message):
    good = tiny_inputs(4)
    bad = dict(good)
    if case == "wrong_shape":
        bad["numerical"] = good["numerical"][:, :2]
    elif case == "wrong_rank":
        bad["cat"] = good["cat"][:, 0]
    elif case == "wrong_dtype":
        bad["numerical"] = good["numerical"].astype(np.float64)
    elif case == "missing_input":
        del bad["cat"]
    elif case == "unknown_input":
        bad["extra"] = good["cat"]
    elif case == "id_above_max":
        bad["cat"] = np.array([[0], [1], [MAX_ID + 3], [2]], np.int64)
    elif case == "negative_id":
        bad["cat"] = np.array([[-1], [1], [2], [3]], np.int64)
    elif case == "batch_mismatch":
        bad["cat"] = good["cat"][:3]
    with InferenceClient(_url(server, protocol), protocol, timeout_s=20) as client:
        with pytest.raises(ServingError) as info:
            client.infer(MODEL_NAME, bad, ["probability"])
        assert message in str(info.value)
        assert MODEL_NAME in str(info.value) and _url(server, protocol) in str(info.value)
        # the server still answers good requests
        out = client.infer(MODEL_NAME, good, ["probability"])
    np.testing.assert_allclose(out["probability"], expected_probability(**good), rtol=1e-6, atol=1e-7)


def test_large_grpc_requests_and_max_batch_size(server):
    """A full batch (a 5 MiB message, above gRPC's 4 MiB default) is answered; one row more is refused with the
    model's limit, as Triton refuses it."""
    inputs = tiny_inputs(MAX_BATCH_SIZE + 1)
    with InferenceClient(server.grpc_url, "grpc", timeout_s=60) as client:
        with pytest.raises(ServingError, match=f"batch size {MAX_BATCH_SIZE + 1} exceeds the model's max_batch_size "
                                               f"{MAX_BATCH_SIZE}"):
            client.infer(MODEL_NAME, inputs, ["probability"])
        full = {name: a[:MAX_BATCH_SIZE] for name, a in inputs.items()}
        out = client.infer(MODEL_NAME, full, ["probability"])
    np.testing.assert_allclose(out["probability"], expected_probability(**full), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model_is_a_clear_error(server, protocol):
    with InferenceClient(_url(server, protocol), protocol, timeout_s=20) as client:
        with pytest.raises(ServingError, match="no-such-model"):
            client.infer("no-such-model", tiny_inputs(2), ["probability"])


def test_infer_in_batches_keeps_row_order(server, capsys):
    inputs = tiny_inputs(23, seed=3)
    with InferenceClient(server.grpc_url, "grpc", timeout_s=20) as client:
        out = infer_in_batches(client, MODEL_NAME, inputs, ["probability"], batch_size=5)
    np.testing.assert_allclose(out["probability"], expected_probability(**inputs), rtol=1e-6, atol=1e-7)
    assert f"[infer] {MODEL_NAME}: 23 of 23 rows (100.0 %)" in capsys.readouterr().err  # done of total, rate, left


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unreachable_server_raises_within_the_timeout(protocol):
    url = f"127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with InferenceClient(url, protocol, timeout_s=3) as client:
        with pytest.raises(ServingError, match=f"server not reachable at {url}"):
            client.infer(MODEL_NAME, tiny_inputs(2), ["probability"])
        with pytest.raises(ServingError, match="not ready after 1 s"):
            client.wait_until_ready(MODEL_NAME, timeout_s=1)
    assert time.monotonic() - start < 15


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_silent_server_times_out(protocol):
    import socket
    with socket.socket() as listener:  # accepts connections (kernel backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        with InferenceClient(url, protocol, timeout_s=2) as client:
            with pytest.raises(ServingError, match=f"request to {url} \\({protocol}\\), model '{MODEL_NAME}' timed out "
                                                   f"after 2 s"):
                client.infer(MODEL_NAME, tiny_inputs(2), ["probability"])
        assert time.monotonic() - start < 10


# ------------------------------------------------------------------------------------------------ latency
def test_latency_report_json_and_png(server, tmp_path):
    import json
    from recsys_common.serving.latency import measure_latency, write_latency_report
    records = measure_latency(server.grpc_url, "grpc", MODEL_NAME, tiny_inputs, ["probability"], [1, 8], [1, 2],
                              num_requests=6, warmup_requests=2, timeout_s=20, verbose=False)
    assert [(r["batch_size"], r["concurrency"], r["requests"]) for r in records] == \
        [(1, 1, 6), (1, 2, 6), (8, 1, 6), (8, 2, 6)]
    for r in records:
        lat = r["latency_ms"]
        # one client at a time: wall time >= sum of latencies, so throughput <= rows / sum(latency)
        if r["concurrency"] == 1:
            assert r["throughput_samples_per_s"] <= r["batch_size"] * 1000.0 / lat["mean"] * 1.01
        assert r["throughput_samples_per_s"] == pytest.approx(r["throughput_requests_per_s"] * r["batch_size"])
    json_path, png_path = str(tmp_path / "out" / "latency.json"), str(tmp_path / "out" / "latency.png")
    write_latency_report(records, json_path, png_path, "tiny model")
    with open(json_path) as f:
        report = json.load(f)
    assert report["records"] == records and report["title"] == "tiny model" and report["cpu"]
    import matplotlib.image
    image = matplotlib.image.imread(png_path)
    assert image.shape[0] == 420 and image.shape[1] == 1100   # figsize (11, 4.2) at 100 dpi
    assert image[..., :3].std() > 0.05   # not blank


def test_run_latency_from_the_shared_flags_over_http(server, tmp_path, capsys):
    import argparse
    import json
    from recsys_common.serving.latency import add_latency_arguments, run_latency
    parser = add_latency_arguments(argparse.ArgumentParser(), default_model_name=MODEL_NAME)
    args = parser.parse_args(["--server-url", server.http_url, "--protocol", "http", "--batch-sizes", "4",
                              "--concurrency", "2", "--num-requests", "4", "--warmup-requests", "1",
                              "--output-json", str(tmp_path / "l.json"), "--output-png", str(tmp_path / "l.png")])
    records = run_latency(server_url=args.server_url, protocol=args.protocol, model_name=args.model_name,
                          batch_sizes=args.batch_sizes, concurrency=args.concurrency, num_requests=args.num_requests,
                          warmup_requests=args.warmup_requests, timeout_s=args.timeout, output_json=args.output_json,
                          output_png=args.output_png, make_inputs=tiny_inputs, output_names=["probability"])
    assert [(r["batch_size"], r["concurrency"], r["protocol"]) for r in records] == [(4, 2, "http")]
    assert "batch      4  concurrency   2" in capsys.readouterr().out
    assert json.load(open(tmp_path / "l.json"))["records"] == records
    with open(tmp_path / "l.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_latency_against_a_bad_request_or_no_server_raises(server):
    from recsys_common.serving.latency import measure_latency
    with pytest.raises(ServingError, match="expected datatype FP32"):
        measure_latency(server.grpc_url, "grpc", MODEL_NAME,
                        lambda n: dict(tiny_inputs(n), numerical=np.zeros((n, 3))), ["probability"], [2], [2],
                        num_requests=4, warmup_requests=0, timeout_s=10, verbose=False)
    start = time.monotonic()
    with pytest.raises(ServingError, match="server not reachable"):
        measure_latency(f"127.0.0.1:{free_port()}", "http", MODEL_NAME, tiny_inputs, ["probability"], [2], [2],
                        num_requests=4, warmup_requests=1, timeout_s=3, verbose=False)
    assert time.monotonic() - start < 20


# ------------------------------------------------------------------------------------------------ server lifetime
def test_server_group_is_gone_after_a_failing_body(repo):
    with pytest.raises(RuntimeError, match="the body failed"):
        # the ONNX model only: a TorchScript model would make the server import torch (seconds per start)
        with serve_repository(repo, [MODEL_NAME], startup_timeout_s=120) as handle:
            assert _group_alive(handle.pid)
            raise RuntimeError("the body failed")
    assert not _alive(handle.pid) and not _group_alive(handle.pid)


def test_server_stops_itself_when_its_launcher_is_killed(repo):
    """SIGKILL of the process that started the server (no ``finally`` runs there): the server's watchdog stops it."""
    script = ("import sys, time\n"
              "from recsys_common.serving.mlserver_launcher import serve_repository\n"
              "with serve_repository(sys.argv[1], [sys.argv[2]]) as handle:\n"
              "    print(handle.pid, flush=True)\n"
              "    time.sleep(300)\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    launcher = subprocess.Popen([sys.executable, "-c", script, repo, MODEL_NAME], stdout=subprocess.PIPE, text=True,
                                env=env)
    server_pid = None
    try:
        server_pid = int(launcher.stdout.readline())
        assert _group_alive(server_pid)
        launcher.kill()
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 30
        while _group_alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(server_pid)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if server_pid and _group_alive(server_pid):
            os.killpg(server_pid, signal.SIGKILL)


def test_server_that_fails_to_start_reports_the_log_tail(tmp_path):
    from serving_tiny_model import tiny_config_text
    model_dir = tmp_path / "repo" / MODEL_NAME
    os.makedirs(model_dir / "1")
    (model_dir / "config.pbtxt").write_text(tiny_config_text())
    (model_dir / "1" / "model.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(ServingError) as info:
        with serve_repository(str(tmp_path / "repo"), startup_timeout_s=60):
            pass
    message = str(info.value)
    assert "exited with status" in message and f"{MODEL_NAME}" in message
    assert str(model_dir / "1" / "model.onnx") in message  # the cause, from the server log


def test_model_of_another_platform_is_refused(tmp_path):
    from recsys_common.serving.model_config import TensorSpec, model_config_text
    model_dir = tmp_path / "repo" / "m-tf"
    os.makedirs(model_dir / "1" / "model.savedmodel")
    (model_dir / "config.pbtxt").write_text(model_config_text(
        "m-tf", "tensorflow_savedmodel", [TensorSpec("x", "float32", [3])], [TensorSpec("y", "float32", [1])], 8))
    (model_dir / "1" / "model.savedmodel" / "saved_model.pb").write_bytes(b"x")
    with pytest.raises(ServingError, match="platform 'tensorflow_savedmodel'; MLServer here serves only ONNX and "
                                           "TorchScript"):
        with serve_repository(str(tmp_path / "repo"), ["m-tf"]):
            pass
    with pytest.raises(ServingError, match="no ONNX or TorchScript model to serve"):
        with serve_repository(str(tmp_path / "repo")):
            pass


def test_launcher_cli_serves_until_interrupted(repo):
    import re
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "recsys_common.serving.mlserver_launcher", "--model-repository", repo,
               "--models", MODEL_NAME, "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()  # the launcher prints one line once every model is ready
        match = re.search(r"server pid (\d+)", line)
        assert match and f"HTTP 127.0.0.1:{http_port}" in line and f"gRPC 127.0.0.1:{grpc_port}" in line, line
        server_pid = int(match.group(1))
        with InferenceClient(f"127.0.0.1:{grpc_port}", "grpc", timeout_s=20) as client:
            inputs = tiny_inputs(3)
            np.testing.assert_allclose(client.infer(MODEL_NAME, inputs, ["probability"])["probability"],
                                       expected_probability(**inputs), rtol=1e-6)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "server stopped" in output, output
        assert not _group_alive(server_pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ------------------------------------------------------------------------------------------------ Triton's protocol
def _http_json(url: str):
    import json
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("model, platform", [(MODEL_NAME, "onnxruntime_onnx"), (TS_MODEL_NAME, "pytorch_libtorch")])
def test_model_metadata_is_complete_over_http_and_grpc(server, model, platform):
    """A generic KServe-v2 client finds the real platform, version and tensors (from config.pbtxt)."""
    import tritonclient.grpc as grpcclient
    expected = {"name": model, "versions": ["1"], "platform": platform,
                "inputs": [{"name": "numerical", "datatype": "FP32", "shape": [-1, 3]},
                           {"name": "cat", "datatype": "INT64", "shape": [-1, 1]}],
                "outputs": [{"name": "probability", "datatype": "FP32", "shape": [-1, 1]}]}
    status, http = _http_json(f"http://{server.http_url}/v2/models/{model}")
    assert status == 200 and {k: http[k] for k in expected} == expected
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        grpc = client.get_model_metadata(model, as_json=True, client_timeout=20)
    finally:
        client.close()
    assert (grpc["name"], grpc["versions"], grpc["platform"]) == (model, ["1"], platform)
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in grpc["inputs"]] == \
        [(t["name"], t["datatype"], t["shape"]) for t in expected["inputs"]]


def test_model_config_endpoint_over_http_and_grpc(server, repo):
    """Triton's model-configuration extension: the config.pbtxt as JSON (HTTP, plain and versioned) and as the
    ModelConfig protobuf (gRPC, read by tritonclient); an unknown model is Triton's error message."""
    import tritonclient.grpc as grpcclient
    from recsys_common.serving.model_config import parse_model_config
    config = parse_model_config(os.path.join(repo, MODEL_NAME, "config.pbtxt"))
    for path in (f"/v2/models/{MODEL_NAME}/config", f"/v2/models/{MODEL_NAME}/versions/1/config"):
        status, body = _http_json(f"http://{server.http_url}{path}")
        assert status == 200, body
        assert body["name"] == MODEL_NAME and body["platform"] == "onnxruntime_onnx"
        assert body["max_batch_size"] == MAX_BATCH_SIZE   # a JSON number, as Triton writes it (not "262144")
        assert [(i["name"], i["data_type"], i["dims"]) for i in body["input"]] == \
            [("numerical", "TYPE_FP32", [3]), ("cat", "TYPE_INT64", [1])]
        assert body["instance_group"][0]["kind"] == "KIND_CPU"
    status, body = _http_json(f"http://{server.http_url}/v2/models/no-such-model/config")
    assert status == 400 and body == {"error": "Request for unknown model: 'no-such-model' is not found"}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        answer = client.get_model_config(TS_MODEL_NAME, client_timeout=20)
        assert answer.config.platform == "pytorch_libtorch" and answer.config.max_batch_size == MAX_BATCH_SIZE
        assert client.get_model_config(MODEL_NAME, client_timeout=20).config == config
        from tritonclient.utils import InferenceServerException
        with pytest.raises(InferenceServerException, match="unknown model: 'no-such-model'"):
            client.get_model_config("no-such-model", client_timeout=20)
    finally:
        client.close()


@pytest.mark.parametrize("binary_inputs, binary_outputs", [(True, True), (True, False), (False, True)])
def test_http_binary_tensor_extension(server, binary_inputs, binary_outputs):
    """tritonclient's defaults against Triton (binary_data=True) work here too, in each combination."""
    import tritonclient.http as httpclient
    inputs = tiny_inputs(9, seed=4)
    client = httpclient.InferenceServerClient(server.http_url, connection_timeout=20, network_timeout=20)
    try:
        items = []
        for name, array in inputs.items():
            item = httpclient.InferInput(name, list(array.shape), "FP32" if name == "numerical" else "INT64")
            item.set_data_from_numpy(array, binary_data=binary_inputs)
            items.append(item)
        result = client.infer(MODEL_NAME, items,
                              outputs=[httpclient.InferRequestedOutput("probability", binary_data=binary_outputs)])
    finally:
        client.close()
    output = result.get_output("probability")
    assert ("binary_data_size" in (output.get("parameters") or {})) == binary_outputs
    np.testing.assert_allclose(result.as_numpy("probability"), expected_probability(**inputs), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("body, header_length, message", [
    (b'{"inputs": [{"name": "cat", "datatype": "INT64", "shape": [1, 1], "parameters": {"binary_data_size": 8}}]}'
     b"\x01\x00\x00", None, "binary_data_size 8 runs past the end of the body (3 bytes left)"),
    (b'{"inputs": [{"name": "cat", "datatype": "INT64", "shape": [1, 1], "parameters": {"binary_data_size": 6}}]}'
     b"\x01\x00\x00\x00\x00\x00", None, "binary_data_size 6 is not a multiple of INT64's 8 bytes"),
    (b'{"inputs": [}' + b"\x00" * 8, 13, "is not valid JSON"),
    (b"{}", 99, "Inference-Header-Content-Length 99 is not within the body's 2 bytes"),
])
def test_malformed_binary_requests_are_clear_errors(server, body, header_length, message):
    import json
    import urllib.error
    import urllib.request
    if header_length is None:
        header_length = body.index(b"}]}") + 3
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{MODEL_NAME}/infer", data=body,
                                     method="POST", headers={"Inference-Header-Content-Length": str(header_length),
                                                             "Content-Type": "application/octet-stream"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=20)
    assert info.value.code == 400
    assert message in json.loads(info.value.read())["error"]


# ------------------------------------------------------------------------------------------------ perf_analyzer
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_perf_analyzer_runs_against_the_server(server, protocol):
    """Triton's own benchmarking client reads the metadata and config, sends our request rows (binary tensors over
    HTTP) and reports both concurrencies."""
    from recsys_common.serving.perf_analyzer import run_perf_analyzer
    perf_analyzer_path()
    records = run_perf_analyzer(_url(server, protocol), protocol, TS_MODEL_NAME if protocol == "http" else MODEL_NAME,
                                tiny_inputs, 8, [1, 2], measurement_interval_ms=300, timeout_s=120)
    assert [(r["batch_size"], r["concurrency"], r["protocol"]) for r in records] == [(8, 1, protocol),
                                                                                   (8, 2, protocol)]
    for r in records:
        assert r["throughput_samples_per_s"] == pytest.approx(8 * r["throughput_requests_per_s"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_perf_analyzer_bad_input_is_a_clear_error(server, protocol):
    from recsys_common.serving.perf_analyzer import run_perf_analyzer
    perf_analyzer_path()
    url = _url(server, protocol)
    start = time.monotonic()
    with pytest.raises(ServingError, match="(?s)model 'no-such-model' failed.*(unknown model|not found)"):
        run_perf_analyzer(url, protocol, "no-such-model", tiny_inputs, 4, [1], timeout_s=60)
    # ids outside the table: perf_analyzer stops on the server's refusal and shows its message
    with pytest.raises(ServingError, match="out of range"):
        run_perf_analyzer(url, protocol, MODEL_NAME, lambda n: dict(tiny_inputs(n), cat=np.full((n, 1), MAX_ID)),
                          4, [1], measurement_interval_ms=200, timeout_s=60)
    # a wrong shape: the server's message comes back through perf_analyzer (a wrong dtype cannot be sent: its
    # --input-data holds JSON numbers, which perf_analyzer itself converts to the config's datatype)
    with pytest.raises(ServingError, match=r"input 'numerical': expected shape \[B, 3\], got \[4, 2\]"):
        run_perf_analyzer(url, protocol, MODEL_NAME,
                          lambda n: dict(tiny_inputs(n), numerical=np.zeros((n, 2), np.float32)), 4, [1],
                          measurement_interval_ms=200, timeout_s=60)
    with pytest.raises(ServingError, match="(?i)connect"):
        run_perf_analyzer(f"127.0.0.1:{free_port()}", protocol, MODEL_NAME, tiny_inputs, 4, [1], timeout_s=60)
    with pytest.raises(ServingError, match="no result after 1 s"):
        run_perf_analyzer(url, protocol, MODEL_NAME, tiny_inputs, 4, [1], measurement_interval_ms=5000,
                          timeout_s=1)
    assert time.monotonic() - start < 120


def test_agreement_check_catches_a_unit_slip():
    """Requests/s reported as samples/s (a factor of the batch size) fails; loaded-machine noise passes."""
    from recsys_common.serving.perf_analyzer import check_agreement

    def record(ratio, batch=64):
        return {"protocol": "grpc", "batch_size": batch, "concurrency": 1, "throughput_samples_per_s": 1000.0 * ratio,
                "latency_ms": {"p50": 1.0}, "throughput_ratio": ratio,
                "perf_analyzer": {"throughput_samples_per_s": 1000.0, "latency_ms": {"p50": 1.0}}}
    assert check_agreement([record(r) for r in (0.19, 1.74, 1.35, 1.71)]) == pytest.approx(0.93, abs=0.01)
    with pytest.raises(AssertionError, match="disagree"):
        check_agreement([record(1 / 64), record(1.0), record(1.0), record(1.0)])
    with pytest.raises(AssertionError, match="geometric mean 0.25"):
        check_agreement([record(0.25)] * 4)
