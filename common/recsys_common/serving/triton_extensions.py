"""Two parts of Triton's protocol that MLServer 1.7.1 lacks, added to it from outside (no fork), for the tools made for
Triton (perf_analyzer, tritonclient's defaults, Triton's model analyzer):

- ``BinaryTensorMiddleware``: Triton's HTTP binary tensor extension (``binary_data=True`` in tritonclient, what
  perf_analyzer always sends): a request body is a JSON header of ``Inference-Header-Content-Length`` bytes followed
  by the raw tensors, each input naming its ``parameters.binary_data_size``. The middleware turns such a request into
  the plain JSON request MLServer reads, and, when the request asks for binary outputs (``binary_data_output`` or an
  output's ``binary_data``), turns MLServer's JSON answer into Triton's binary answer.
- ``model_config_grpc_handler``: the gRPC ``inference.GRPCInferenceService/ModelConfig`` method (Triton's
  model-configuration extension; perf_analyzer ``-i grpc`` calls it first), answering the serialized
  ``ModelConfigResponse`` the launcher wrote into each model's settings. MLServer's own custom handlers are REST only
  (its gRPC registration is commented out in ``mlserver/server.py`` 1.7.1), so this handler is added to the gRPC
  server that MLServer creates.

``install(settings_dir)`` (called by ``_mlserver_entry`` before MLServer starts) puts both in: it wraps the app
factory of ``mlserver.rest.server`` to add the middleware, and subclasses ``mlserver.grpc.GRPCServer`` to add the
handler. Both hooks are module attributes of mlserver 1.7.1 (pinned in ci/constraints.txt); the serving tests fail
if a later MLServer moves them. This module runs inside the MLServer process: it must not import tritonclient.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Dict, Optional, Tuple

import numpy as np

from recsys_common.cli import InputError

# KServe-v2 datatype -> numpy dtype of its binary (little-endian, row-major) encoding. BYTES (length-prefixed
# strings) is not served by any model here and is refused.
_NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
          "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
          "FP32": np.float32, "FP64": np.float64}
_INFER_PATH = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
_HEADER = b"inference-header-content-length"
#: {model name: Triton config JSON} of the loaded models, filled by ``mlserver_runtime`` (read by its config route).
MODEL_CONFIGS: Dict[str, dict] = {}


class BinaryTensorError(InputError):
    """A binary-extension request that cannot be read; answered as HTTP 400 ``{"error": message}``."""


def decode_binary_request(body: bytes, header_length: int) -> Tuple[dict, bool]:
    """Split a binary-extension request body into the JSON request with every binary input given as ``data`` (a flat
    list) instead. Returns (request, binary outputs wanted)."""
    import orjson
    if not 0 < header_length <= len(body):
        raise BinaryTensorError(f"Inference-Header-Content-Length {header_length} is not within the body's "
                                f"{len(body)} bytes")
    try:
        request = orjson.loads(body[:header_length])
    except orjson.JSONDecodeError as e:
        raise BinaryTensorError(f"the request's JSON header (first {header_length} bytes) is not valid JSON: {e}")
    offset = header_length
    for item in request.get("inputs") or []:
        params = item.get("parameters") or {}
        size = params.pop("binary_data_size", None)
        if size is None:
            continue
        name, datatype = item.get("name"), item.get("datatype")
        if datatype not in _NUMPY:
            raise BinaryTensorError(f"input {name!r}: binary data of datatype {datatype!r} is not supported here "
                                    f"(supported: {', '.join(_NUMPY)})")
        if not isinstance(size, int) or size < 0 or offset + size > len(body):
            raise BinaryTensorError(f"input {name!r}: binary_data_size {size!r} runs past the end of the body "
                                    f"({len(body) - offset} bytes left)")
        itemsize = np.dtype(_NUMPY[datatype]).itemsize
        if size % itemsize:
            raise BinaryTensorError(f"input {name!r}: binary_data_size {size} is not a multiple of {datatype}'s "
                                    f"{itemsize} bytes")
        item["data"] = np.frombuffer(body, _NUMPY[datatype], size // itemsize, offset).tolist()
        offset += size
        if not params:
            item.pop("parameters", None)
    if offset != len(body):
        raise BinaryTensorError(f"the body has {len(body) - offset} bytes after the last binary input")
    return request, _binary_outputs_wanted(request)


def _binary_outputs_wanted(request: dict) -> bool:
    if (request.get("parameters") or {}).get("binary_data_output"):
        return True
    return any((o.get("parameters") or {}).get("binary_data") for o in request.get("outputs") or [])


def encode_binary_response(response: dict, request: dict) -> Tuple[bytes, int]:
    """MLServer's JSON answer with the outputs the request wants binary moved behind the JSON header. Returns (body,
    JSON header length)."""
    import orjson
    everything = bool((request.get("parameters") or {}).get("binary_data_output"))
    asked = {o.get("name"): bool((o.get("parameters") or {}).get("binary_data", everything))
             for o in request.get("outputs") or []}
    blobs = []
    for output in response.get("outputs") or []:
        wanted = asked.get(output.get("name"), everything) if asked else everything
        if not wanted or output.get("datatype") not in _NUMPY or "data" not in output:
            continue
        blob = np.asarray(output.pop("data"), dtype=_NUMPY[output["datatype"]]).tobytes()
        output.setdefault("parameters", {})["binary_data_size"] = len(blob)
        blobs.append(blob)
    header = orjson.dumps(response)
    return header + b"".join(blobs), len(header)


class BinaryTensorMiddleware:
    """ASGI middleware: Triton's binary tensor extension in front of MLServer's JSON-only infer endpoint."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or not _INFER_PATH.match(scope.get("path", "")):
            return await self.app(scope, receive, send)
        headers = [(k, v) for k, v in scope.get("headers", [])]
        header_length = next((v for k, v in headers if k.lower() == _HEADER), None)
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        request, binary_out = None, False
        try:
            if header_length is not None:
                try:
                    length = int(header_length)
                except ValueError:
                    raise BinaryTensorError(f"Inference-Header-Content-Length {header_length!r} is not an integer")
                request, binary_out = decode_binary_request(body, length)
            elif b"binary_data" in body:   # JSON inputs, binary outputs asked for
                import orjson
                try:
                    parsed = orjson.loads(body)
                except orjson.JSONDecodeError:
                    parsed = None   # MLServer reports the malformed JSON itself
                if isinstance(parsed, dict) and _binary_outputs_wanted(parsed):
                    request, binary_out = parsed, True
        except BinaryTensorError as e:
            return await _send_json(send, 400, {"error": str(e)})
        if request is not None and header_length is not None:
            import orjson
            body = orjson.dumps(request)
        if header_length is not None:
            # the binary request's Content-Type is application/octet-stream; what MLServer reads now is JSON
            headers = [(k, v) for k, v in headers if k.lower() not in (_HEADER, b"content-length", b"content-type")]
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        scope = dict(scope, headers=headers)
        sent = [False]

        async def replay():
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if not binary_out:
            return await self.app(scope, replay, send)
        await self.app(scope, replay, _BinaryResponse(send, request))


class _BinaryResponse:
    """``send`` wrapper buffering a successful JSON answer and sending it in the binary form instead."""

    def __init__(self, send, request: dict):
        self.send, self.request = send, request
        self.start: Optional[dict] = None
        self.chunks = []

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            self.start = message
            return
        if message["type"] != "http.response.body" or self.start is None:
            return await self.send(message)
        self.chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body, extra = b"".join(self.chunks), []
        if self.start["status"] == 200:
            import orjson
            try:
                body, length = encode_binary_response(orjson.loads(body), self.request)
                extra = [(b"inference-header-content-length", str(length).encode())]
            except (orjson.JSONDecodeError, ValueError, TypeError):
                pass   # not an inference answer: sent as it came
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        headers += [(b"content-length", str(len(body)).encode())] + extra
        await self.send(dict(self.start, headers=headers))
        await self.send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_json(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# ------------------------------------------------------------------------------------------------ gRPC ModelConfig
def _read_string_fields(data: bytes) -> Dict[int, str]:
    """The string fields of a serialized protobuf message ({field number: value}); ``ModelConfigRequest`` is
    ``name = 1; version = 2``. Read by hand: the message classes live in tritonclient, which cannot load here."""
    fields, i = {}, 0

    def varint(i):
        shift = value = 0
        while True:
            if i >= len(data):
                raise ValueError("truncated varint")
            byte = data[i]
            value |= (byte & 0x7F) << shift
            i += 1
            if not byte & 0x80:
                return value, i
            shift += 7
    while i < len(data):
        key, i = varint(i)
        number, wire = key >> 3, key & 7
        if wire == 2:
            length, i = varint(i)
            fields[number] = data[i:i + length].decode("utf-8", "replace")
            i += length
        elif wire == 0:
            _, i = varint(i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return fields


def model_config_grpc_handler(responses: Dict[str, bytes]):
    """A gRPC generic handler for ``/inference.GRPCInferenceService/ModelConfig`` answering ``responses`` {model name:
    serialized ModelConfigResponse}; an unknown name is ``NOT_FOUND`` with Triton's message."""
    import grpc

    async def model_config(request: bytes, context):
        try:
            name = _read_string_fields(request).get(1, "")
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ModelConfigRequest: {e}")
        if name not in responses:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        return responses[name]

    handler = grpc.unary_unary_rpc_method_handler(model_config)   # no (de)serializers: bytes in, bytes out
    return grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelConfig": handler})


def grpc_model_configs(settings_dir: str) -> Dict[str, bytes]:
    """{model name: serialized ModelConfigResponse} from the launcher's ``models/*/model-settings.json``."""
    import base64
    out = {}
    for path in sorted(glob.glob(os.path.join(settings_dir, "models", "*", "model-settings.json"))):
        with open(path, "r", encoding="utf-8") as f:
            settings = json.load(f)
        encoded = ((settings.get("parameters") or {}).get("extra") or {}).get("model_config_grpc")
        if encoded:
            out[settings["name"]] = base64.b64decode(encoded)
    return out


def install(settings_dir: str) -> None:
    """Add the binary middleware and the gRPC ModelConfig method to the MLServer that starts next in this process."""
    import mlserver.grpc.server as grpc_server_module
    import mlserver.rest.server as rest_server_module
    import mlserver.server as server_module

    create_app = rest_server_module.create_app

    def create_app_with_binary_tensors(*args, **kwargs):
        app = create_app(*args, **kwargs)
        app.add_middleware(BinaryTensorMiddleware)
        return app
    rest_server_module.create_app = create_app_with_binary_tensors

    handler = model_config_grpc_handler(grpc_model_configs(settings_dir))

    class GRPCServerWithModelConfig(grpc_server_module.GRPCServer):
        def _create_server(self):
            server = super()._create_server()
            server.add_generic_rpc_handlers((handler,))
            return server
    server_module.GRPCServer = GRPCServerWithModelConfig
