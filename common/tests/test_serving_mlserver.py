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
from serving_tiny_model import MAX_ID, MODEL_NAME, expected_probability, tiny_inputs, write_tiny_repository

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
    return path


@pytest.fixture(scope="module")
def server(repo):
    with serve_repository(repo, startup_timeout_s=120) as handle:
        yield handle
    assert not _group_alive(handle.pid)


def _url(server, protocol):
    return server.grpc_url if protocol == "grpc" else server.http_url


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_predictions_match_the_model(server, protocol):
    inputs = tiny_inputs(7)
    with InferenceClient(_url(server, protocol), protocol, timeout_s=20) as client:
        client.wait_until_ready(MODEL_NAME, timeout_s=20)
        out = client.infer(MODEL_NAME, inputs, ["probability"])
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
    assert "batch 5/5" in capsys.readouterr().err


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
