"""A small KServe-v2 client over tritonclient (gRPC or HTTP) with a timeout on every call and one error type.

Tests point it at the real Triton server ``triton_server`` starts; users at theirs.

    with InferenceClient("127.0.0.1:8001", protocol="grpc", timeout_s=10) as client:
        client.wait_until_ready("dlrm-onnx", timeout_s=60)
        out = client.infer("dlrm-onnx", {"numerical": x, "categorical": c}, ["probability"])
        out["probability"]          # np.ndarray, batch first

Errors raise ``ServingError`` naming the url, protocol, model and cause: "server not reachable at ...", "timed out
after ... s", or the server's own message for a bad request (wrong shape, dtype, id out of range).

The HTTP path sends and reads tensors with Triton's binary tensor extension (``binary_data=True``, tritonclient's
default and what perf_analyzer sends): JSON tensors cost a Python-side encode and parse per value, about 3x the
client time at batch 512.
"""
from __future__ import annotations

import time
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from recsys_common.logger import Progress, log_to_stderr


class ServingError(RuntimeError):
    """A failed call to an inference server; the message names the url, model and cause."""


_UNREACHABLE = ("StatusCode.UNAVAILABLE", "failed to connect", "connection refused", "Connection refused",
                "Name or service not known", "No route to host", "Connection reset")
_TIMEOUT = ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", "timed out", "Timeout", "timeout")


class InferenceClient:
    """tritonclient's gRPC or HTTP client for one server.

    Args:
        url: "host:port" (no scheme), e.g. "127.0.0.1:8001" for gRPC, "127.0.0.1:8000" for HTTP.
        protocol: "grpc" or "http".
        timeout_s: the limit of every call (connect and response).
    """

    def __init__(self, url: str, protocol: str = "grpc", timeout_s: float = 30.0):
        if protocol not in ("grpc", "http"):
            raise ValueError(f"protocol must be 'grpc' or 'http', got {protocol!r}")
        if "://" in url:
            raise ValueError(f"url {url!r}: give host:port without a scheme (tritonclient adds it)")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url, self.protocol, self.timeout_s = url, protocol, float(timeout_s)
        if protocol == "grpc":
            import tritonclient.grpc as module
            self._client = module.InferenceServerClient(url)
        else:
            import tritonclient.http as module
            self._client = module.InferenceServerClient(url, connection_timeout=self.timeout_s,
                                                        network_timeout=self.timeout_s)
        self._module = module

    # ------------------------------------------------------------------------------------------------ errors
    def _error(self, model: Optional[str], exc: BaseException) -> ServingError:
        text = str(exc) or type(exc).__name__
        where = f"{self.url} ({self.protocol})" + (f", model {model!r}" if model else "")
        if any(s in text for s in _UNREACHABLE) or isinstance(exc, (ConnectionError,)):
            return ServingError(f"server not reachable at {where}: {text}")
        if any(s in text for s in _TIMEOUT) or isinstance(exc, TimeoutError):
            return ServingError(f"request to {where} timed out after {self.timeout_s:g} s: {text}")
        return ServingError(f"request to {where} failed: {text}")

    def _call(self, model: Optional[str], fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ServingError:
            raise
        except Exception as e:  # tritonclient raises InferenceServerException, socket and gevent errors
            raise self._error(model, e) from e

    # ------------------------------------------------------------------------------------------------ calls
    def is_model_ready(self, model: str) -> bool:
        """One readiness probe (``ServingError`` if the server cannot be reached)."""
        if self.protocol == "grpc":
            return bool(self._call(model, self._client.is_model_ready, model, client_timeout=self.timeout_s))
        return bool(self._call(model, self._client.is_model_ready, model))

    def wait_until_ready(self, model: str, timeout_s: float = 60.0, poll_s: float = 0.25) -> None:
        """Poll until ``model`` is ready; ``ServingError`` with the last cause after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        last = "not ready"
        while True:
            try:
                if self.is_model_ready(model):
                    return
                last = "the server answers but the model is not ready"
            except ServingError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise ServingError(f"model {model!r} at {self.url} ({self.protocol}) not ready after {timeout_s:g} s: "
                                   f"{last}")
            time.sleep(poll_s)

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]) -> Dict[str, np.ndarray]:
        """Run one request: ``inputs`` {name: array, batch first}; returns {output name: array}."""
        from tritonclient.utils import np_to_triton_dtype
        requests = []
        for name, array in inputs.items():
            array = np.ascontiguousarray(array)
            if array.ndim and array.shape[0] == 0:
                # Triton answers an empty batch with a byte-size mismatch of some other input; say what it is
                raise ServingError(f"{self.url} ({self.protocol}), model {model!r}: input {name!r} is an empty batch "
                                   f"(shape {list(array.shape)}); send at least one row")
            try:
                datatype = np_to_triton_dtype(array.dtype)
            except Exception:
                datatype = None
            if datatype is None:
                raise ServingError(f"input {name!r}: numpy dtype {array.dtype} has no KServe-v2 datatype")
            item = self._module.InferInput(name, list(array.shape), datatype)
            if self.protocol == "grpc":
                item.set_data_from_numpy(array)
            else:
                item.set_data_from_numpy(array, binary_data=True)
            requests.append(item)
        if self.protocol == "grpc":
            outputs = [self._module.InferRequestedOutput(n) for n in output_names]
            result = self._call(model, self._client.infer, model, requests, outputs=outputs,
                                client_timeout=self.timeout_s)
        else:
            outputs = [self._module.InferRequestedOutput(n, binary_data=True) for n in output_names]
            result = self._call(model, self._client.infer, model, requests, outputs=outputs)
        out = {}
        for name in output_names:
            value = result.as_numpy(name)
            if value is None:
                raise ServingError(f"{self.url} ({self.protocol}), model {model!r}: the response has no output "
                                   f"{name!r}")
            out[name] = value
        return out

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:  # closing a client whose server is gone must not mask the real error
            pass

    def __enter__(self) -> "InferenceClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def infer_in_batches(client: InferenceClient, model: str, inputs: Mapping[str, np.ndarray],
                     output_names: Sequence[str], batch_size: int, progress: bool = True) -> Dict[str, np.ndarray]:
    """Send ``inputs`` (rows = first dimension, equal across inputs) in requests of ``batch_size`` rows; return the
    outputs concatenated in row order. With ``progress`` prints to stderr, at most every 2 s and at the end:
    rows done of total, rows/s and the estimated time left (``recsys_common.logger.Progress``)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    sizes = {name: len(a) for name, a in inputs.items()}
    if not sizes or len(set(sizes.values())) != 1:
        raise ValueError(f"inputs must be non-empty with one row count, got {sizes}")
    rows = next(iter(sizes.values()))
    steps = (rows + batch_size - 1) // batch_size
    parts: Dict[str, List[np.ndarray]] = {n: [] for n in output_names}
    meter = Progress(f"[infer] {model}", rows, every=2.0, out=log_to_stderr if progress else False)
    for step in range(steps):
        lo, hi = step * batch_size, min(rows, (step + 1) * batch_size)
        result = client.infer(model, {n: a[lo:hi] for n, a in inputs.items()}, output_names)
        for n in output_names:
            parts[n].append(result[n])
        meter.set(hi)
    if steps == 0:
        return {n: np.zeros((0,)) for n in output_names}
    return {n: np.concatenate(p) for n, p in parts.items()}
