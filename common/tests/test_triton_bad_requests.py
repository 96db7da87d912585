"""Bad requests against a real Triton server, and a server that dies mid-run: each is a clear ``ServingError`` (from
Triton's own checks, from the CPU repository's ``model.py``, or from our client), within the client's timeout, and
the server keeps serving the good requests; no tritonserver is left running afterwards. One server for the module;
the tests that kill a server start their own."""
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

from recsys_common.machine import free_port
from recsys_common.serving.client import InferenceClient, ServingError
from recsys_common.serving.triton_server import serve_repository
from serving_tiny_model import (MAX_ID, MAX_TOKEN_BYTES, MODEL_NAME, STRING_MODEL_NAME, TOKENS, expected_probability,
                                tiny_inputs, token_ids, write_tiny_cpu_repository)
from triton_processes import group_alive, servers_of, tritonserver_processes

PROTOCOLS = ["grpc", "http"]
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("triton_bad") / "repo")
    write_tiny_cpu_repository(path)
    yield path
    assert servers_of(path) == [], "a tritonserver of this module's repository is still running"


@pytest.fixture(scope="module")
def server(repo):
    with serve_repository(repo, [MODEL_NAME, STRING_MODEL_NAME], startup_timeout_s=120) as handle:
        yield handle


def _bad(case):
    """(model, inputs, the message expected) of one bad request."""
    good = tiny_inputs(4)
    numerical, cat = good["numerical"], good["cat"]
    cases = {
        "wrong shape": {"numerical": numerical[:, :2], "cat": cat},
        "wrong rank": {"numerical": numerical, "cat": cat[:, 0]},
        "wrong type": {"numerical": numerical.astype(np.float64), "cat": cat},
        "ids as floats": {"numerical": numerical, "cat": cat.astype(np.float32)},
        "missing input": {"numerical": numerical},
        "unknown input": {"numerical": numerical, "cat": cat, "extra": cat},
        "batch sizes differ": {"numerical": numerical, "cat": cat[:3]},
        "empty batch": {"numerical": numerical[:0], "cat": cat[:0]},
        "id above the table": {"numerical": numerical, "cat": np.array([[0], [1], [MAX_ID], [2]], np.int64)},
        "negative id": {"numerical": numerical, "cat": np.array([[0], [-1], [1], [2]], np.int64)},
    }
    messages = {
        "wrong shape": r"unexpected shape for input 'numerical' for model 'tiny-onnx'. Expected \[-1,3\], got \[4,2\]",
        "wrong rank": r"unexpected shape for input 'cat' for model 'tiny-onnx'. Expected \[-1,1\], got \[4\]",
        "wrong type": r"input 'numerical' data-type is 'FP64', but model 'tiny-onnx' expects 'FP32'",
        "ids as floats": r"input 'cat' data-type is 'FP32', but model 'tiny-onnx' expects 'INT64'",
        "missing input": r"expected 2 inputs but got 1 inputs for model 'tiny-onnx'.*missing required input\(s\) "
                         r"\['cat'\]",
        "unknown input": r"expected 2 inputs but got 3 inputs for model 'tiny-onnx'. Got input\(s\) \[.*'extra'",
        "batch sizes differ": r"input '(cat|numerical)' batch size does not match other inputs for 'tiny-onnx'",
        "empty batch": r"input 'numerical' is an empty batch \(shape \[0, 3\]\); send at least one row",
        "id above the table": rf"model tiny-onnx: input 'cat': id {MAX_ID} \(row 2\) is out of range; ids must be in "
                              rf"\[0, {MAX_ID}\)",
        "negative id": rf"model tiny-onnx: input 'cat': id -1 \(row 1\) is out of range; ids must be in \[0, {MAX_ID}\)",
    }
    return MODEL_NAME, cases[case], messages[case]


BAD_CASES = ["wrong shape", "wrong rank", "wrong type", "ids as floats", "missing input", "unknown input",
             "batch sizes differ", "empty batch", "id above the table", "negative id"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_bad_request_is_a_clear_error_and_the_server_keeps_serving(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with InferenceClient(url, protocol, timeout_s=TIMEOUT_S) as client:
        for case in BAD_CASES:
            model, inputs, message = _bad(case)
            start = time.monotonic()
            with pytest.raises(ServingError, match=message) as info:
                client.infer(model, inputs, ["probability"])
            assert f"model '{model}'" in str(info.value) and url in str(info.value), case
            assert time.monotonic() - start < TIMEOUT_S, case
        good = tiny_inputs(5, seed=1)
        out = client.infer(MODEL_NAME, good, ["probability"])["probability"]
    np.testing.assert_allclose(out, expected_probability(**good), rtol=1e-6, atol=1e-7)


def test_refused_rows_do_not_spoil_the_requests_batched_with_them(server):
    """Triton's dynamic batcher may put a bad request and good ones into one execute: only the bad one fails."""
    tokens = [np.array([[t.encode()]], dtype=object) for t in TOKENS[:6]]
    too_long = np.array([[b"t" * (MAX_TOKEN_BYTES + 1)]], dtype=object)
    results, errors = {}, {}

    def send(key, array):
        try:
            with InferenceClient(server.grpc_url, "grpc", timeout_s=TIMEOUT_S) as client:
                results[key] = client.infer(STRING_MODEL_NAME, {"token": array}, ["cat"])["cat"]
        except ServingError as e:
            errors[key] = str(e)
    threads = [threading.Thread(target=send, args=(i, t)) for i, t in enumerate(tokens)]
    threads.append(threading.Thread(target=send, args=("long", too_long)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert list(errors) == ["long"], errors
    assert f"input 'token': element [0, 0] has {MAX_TOKEN_BYTES + 1} bytes; at most {MAX_TOKEN_BYTES} allowed" \
        in errors["long"]
    for i, array in enumerate(tokens):
        np.testing.assert_array_equal(results[i], token_ids(array))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_strings_too_long_not_text_or_not_strings(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with InferenceClient(url, protocol, timeout_s=TIMEOUT_S) as client:
        with pytest.raises(ServingError, match=r"input 'token': element \[1, 0\] has 9 bytes; at most 4 allowed"):
            client.infer(STRING_MODEL_NAME, {"token": np.array([[b"t1"], [b"x" * 9]], dtype=object)}, ["cat"])
        with pytest.raises(ServingError, match=r"input 'token': element \[0, 0\] is not UTF-8 text"):
            client.infer(STRING_MODEL_NAME, {"token": np.array([[b"\xff\xfe"]], dtype=object)}, ["cat"])
        with pytest.raises(ServingError, match=r"input 'token' data-type is 'INT64', but model 'tiny-strings' "
                                               r"expects 'BYTES'"):
            client.infer(STRING_MODEL_NAME, {"token": np.array([[1]], np.int64)}, ["cat"])
        ok = client.infer(STRING_MODEL_NAME, {"token": np.array([[b"t3"]], dtype=object)}, ["cat"])["cat"]
    assert ok.tolist() == [[3]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model_and_unknown_output(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with InferenceClient(url, protocol, timeout_s=TIMEOUT_S) as client:
        with pytest.raises(ServingError, match="Request for unknown model: 'no-such-model' is not found"):
            client.infer("no-such-model", tiny_inputs(2), ["probability"])
        with pytest.raises(ServingError, match="unexpected inference output 'logit' for model 'tiny-onnx'"):
            client.infer(MODEL_NAME, tiny_inputs(2), ["logit"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unreachable_and_silent_servers_fail_within_the_timeout(protocol):
    url = f"127.0.0.1:{free_port()}"   # nothing listens there
    start = time.monotonic()
    with InferenceClient(url, protocol, timeout_s=3) as client:
        with pytest.raises(ServingError, match=f"server not reachable at {url}"):
            client.infer(MODEL_NAME, tiny_inputs(2), ["probability"])
        with pytest.raises(ServingError, match="not ready after 1 s"):
            client.wait_until_ready(MODEL_NAME, timeout_s=1)
    assert time.monotonic() - start < 15
    with socket.socket() as listener:   # accepts connections (kernel backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        with InferenceClient(url, protocol, timeout_s=2) as client:
            with pytest.raises(ServingError, match=rf"request to {url} \({protocol}\), model '{MODEL_NAME}' timed out "
                                                   rf"after 2 s"):
                client.infer(MODEL_NAME, tiny_inputs(2), ["probability"])
        assert time.monotonic() - start < 10


def _group_members(pgid, name):
    """Pids of the processes of group ``pgid`` whose command line contains ``name``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
            if os.getpgid(int(entry)) == pgid and name.encode() in command:
                found.append(int(entry))
        except (OSError, ProcessLookupError):
            continue
    return found


def test_a_server_that_dies_mid_run(repo):
    """The model's stub killed: Triton answers its requests with an error at once. The server killed while a client
    sends: every later request fails as unreachable, nothing hangs, and leaving the block stops what is left."""
    with serve_repository(repo, [MODEL_NAME], startup_timeout_s=120) as handle:
        [stub] = _group_members(handle.pid, "triton_python_backend_stub")
        os.kill(stub, signal.SIGKILL)
        with InferenceClient(handle.grpc_url, "grpc", timeout_s=TIMEOUT_S) as client:
            start = time.monotonic()
            with pytest.raises(ServingError, match=f"Stub process '{MODEL_NAME}_0_0' is not healthy"):
                client.infer(MODEL_NAME, tiny_inputs(2), ["probability"])
            assert time.monotonic() - start < TIMEOUT_S
        [server] = tritonserver_processes(f"--http-port={handle.http_url.rsplit(':', 1)[1]}")
        outcomes = []

        def keep_sending():
            with InferenceClient(handle.http_url, "http", timeout_s=TIMEOUT_S) as client:
                for _ in range(200):
                    try:
                        client.infer(MODEL_NAME, tiny_inputs(2), ["probability"])
                        outcomes.append("ok")
                    except ServingError as e:
                        outcomes.append(str(e))
                        if "not reachable" in str(e):
                            return
        sender = threading.Thread(target=keep_sending)
        sender.start()
        time.sleep(0.5)
        os.kill(server, signal.SIGKILL)
        sender.join(timeout=3 * TIMEOUT_S)
        assert not sender.is_alive(), "the client hung on a dead server"
        assert f"server not reachable at {handle.http_url}" in outcomes[-1], outcomes[-3:]
    assert not group_alive(handle.pid)
