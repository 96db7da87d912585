"""``OnnxModel`` and ``TorchScriptModel``: the MLServer runtimes that serve a Triton repository's ONNX models (with
onnxruntime) and TorchScript models (``pytorch_libtorch``, with torch), and answer Triton's model-configuration
endpoint (``GET /v2/models/{name}/config``, registered as MLServer custom handlers).

Imported ONLY inside the MLServer process (``mlserver_launcher`` writes ``"implementation":
"recsys_common.serving.mlserver_runtime.OnnxModel"`` into each ``model-settings.json``). Never import this module
next to ``tritonclient.grpc``: the two define the same protobuf symbols.

Model settings it reads (``parameters``): ``uri`` = the Triton model directory (``<repo>/<model>``), ``version`` =
the version directory to load (default: the highest), ``extra.intra_op_threads`` = onnxruntime's intra-op threads
(0: onnxruntime's default), ``extra.max_batch_size`` = config.pbtxt's ``max_batch_size`` (requests with more rows are
refused, as Triton refuses them; 0 or absent: no limit). The launcher fills these in.

Every request is checked before it reaches the model: input names (missing / unknown), KServe datatypes, shapes
(rank, the non-batch dims of the model, one batch size across inputs) and ids against the sidecar's ``max_id``
(``0 <= id < max_id``). A failed check raises ``mlserver.errors.InferenceError``, which MLServer returns as HTTP 400
(``{"error": message}``) or gRPC ``INVALID_ARGUMENT`` with the message; the server keeps serving.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse

from .repository import SIDECAR_NAME, read_sidecar
from .request_checks import check_request_arrays

# onnxruntime tensor type -> KServe-v2 datatype.
_ONNX_TO_KSERVE = {
    "tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(float16)": "FP16", "tensor(int64)": "INT64",
    "tensor(int32)": "INT32", "tensor(int16)": "INT16", "tensor(int8)": "INT8", "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(bool)": "BOOL",
}


def _latest_version(model_dir: str, file_name: str = "model.onnx") -> str:
    versions = sorted(int(n) for n in os.listdir(model_dir)
                      if n.isdigit() and os.path.isfile(os.path.join(model_dir, n, file_name)))
    if not versions:
        raise FileNotFoundError(f"{model_dir}: no version directory with a {file_name}")
    return str(versions[-1])


# Every loaded model's Triton configuration (the JSON of ``GET /v2/models/{name}/config``), by name. All models run in
# the one MLServer process (``parallel_workers: 0``), so one registry answers for any name, including unknown ones.
# It lives in ``triton_extensions``: MLServer re-imports (reloads) this module for every model it loads, which would
# give each model a registry of its own.
from .triton_extensions import MODEL_CONFIGS as _CONFIGS  # noqa: E402


def _config_handlers(model: "TritonRepositoryModel"):
    """The HTTP routes of Triton's model-configuration extension, as MLServer custom handlers (registered by MLServer
    for each loaded model; the routes take the model name as a path parameter, so whichever model registered first
    answers for all, from ``_CONFIGS``)."""
    from fastapi.responses import JSONResponse
    from mlserver.handlers.custom import CustomHandler, register_custom_handler

    async def model_config(model_name: str, model_version: Optional[str] = None):
        config = _CONFIGS.get(model_name)
        if config is None:
            # Triton's wording and status; perf_analyzer prints the "error" member
            return JSONResponse({"error": f"Request for unknown model: '{model_name}' is not found"}, status_code=400)
        return JSONResponse(config)

    async def model_config_versioned(model_name: str, model_version: str):
        return await model_config(model_name, model_version)

    register_custom_handler(CustomHandler(rest_path="/v2/models/{model_name}/config", rest_method="GET"),
                            model_config)
    register_custom_handler(CustomHandler(rest_path="/v2/models/{model_name}/versions/{model_version}/config",
                                          rest_method="GET"), model_config_versioned)
    return model_config, model_config_versioned


class TritonRepositoryModel(MLModel):
    """What every runtime here shares: the request checks (names, datatypes, shapes, ids, ``max_batch_size``) and
    Triton's model-configuration endpoint. Subclasses set ``_expected``, ``_output_names`` in ``_load_model`` and
    implement ``_run(wanted, arrays) -> list of arrays``."""

    MODEL_FILE = ""

    def __init__(self, settings):
        super().__init__(settings)
        # instance attributes holding MLServer custom handlers: ``get_custom_handlers`` finds them with
        # ``inspect.getmembers`` and adds their routes to the REST app when the model loads
        self._config_route, self._config_route_versioned = _config_handlers(self)

    async def load(self) -> bool:
        params = self.settings.parameters
        model_dir = params.uri
        version = params.version or _latest_version(model_dir, self.MODEL_FILE)
        path = os.path.join(model_dir, version, self.MODEL_FILE)
        extra = getattr(params, "extra", None) or {}
        self._load_model(path, extra)
        self._max_ids: Dict[str, Optional[int]] = {}
        self._min_ids: Dict[str, int] = {}
        if os.path.exists(os.path.join(model_dir, SIDECAR_NAME)):
            sidecar = read_sidecar(model_dir)
            self._max_ids = {name: entry.get("max_id") for name, entry in sidecar["inputs"].items()}
            self._min_ids = {name: entry.get("min_id", 0) for name, entry in sidecar["inputs"].items()}
        self._max_batch_size = int(extra.get("max_batch_size", 0))
        self._path = path
        if extra.get("model_config"):
            _CONFIGS[self.name] = extra["model_config"]
        return True

    async def unload(self) -> bool:
        _CONFIGS.pop(self.name, None)
        return True

    def _load_model(self, path: str, extra: dict) -> None:
        raise NotImplementedError

    def _run(self, wanted: List[str], arrays: Dict[str, np.ndarray]) -> List[np.ndarray]:
        raise NotImplementedError

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays, datatypes = {}, {}
        for request_input in payload.inputs:
            if request_input.name in arrays:
                raise InferenceError(f"model {self.name}: input {request_input.name!r} given twice")
            datatypes[request_input.name] = getattr(request_input.datatype, "value", str(request_input.datatype))
            try:
                arrays[request_input.name] = NumpyCodec.decode_input(request_input)
            except Exception as e:  # a data length that does not fit the shape, values that are not numbers
                raise InferenceError(f"model {self.name}: input {request_input.name!r} (shape "
                                     f"{list(request_input.shape)}, datatype {datatypes[request_input.name]}) "
                                     f"cannot be decoded: {e}") from None
        try:
            check_request_arrays(arrays, datatypes, self._expected, self._max_ids, self._min_ids)
        except ValueError as e:
            raise InferenceError(f"model {self.name}: {e}") from None
        if self._max_batch_size:
            rows = max((len(a) for a in arrays.values() if a.ndim), default=0)
            if rows > self._max_batch_size:
                raise InferenceError(f"model {self.name}: batch size {rows} exceeds the model's max_batch_size "
                                     f"{self._max_batch_size} (config.pbtxt); send smaller requests")
        wanted = [o.name for o in payload.outputs] if payload.outputs else self._output_names
        unknown = [n for n in wanted if n not in self._output_names]
        if unknown:
            raise InferenceError(f"model {self.name}: unknown output(s) {unknown}; the model has "
                                 f"{self._output_names}")
        try:
            results = self._run(wanted, arrays)
        except Exception as e:  # the framework's own checks (e.g. an id the model's range check refuses)
            raise InferenceError(f"model {self.name}: {type(self).__name__} failed on this request: {e}") from None
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id,
                                 outputs=[NumpyCodec.encode_output(name, np.asarray(value))
                                          for name, value in zip(wanted, results)])


class OnnxModel(TritonRepositoryModel):
    """Serves ``<uri>/<version>/model.onnx`` with onnxruntime (CPUExecutionProvider)."""

    MODEL_FILE = "model.onnx"

    def _load_model(self, path: str, extra: dict) -> None:
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(extra.get("intra_op_threads", 0))
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self._expected = {}
        for i in self._session.get_inputs():
            if i.type not in _ONNX_TO_KSERVE:
                raise TypeError(f"{path}: input {i.name!r} has type {i.type}, which this runtime does not serve")
            self._expected[i.name] = {"datatype": _ONNX_TO_KSERVE[i.type], "shape": list(i.shape)}
        self._output_names: List[str] = [o.name for o in self._session.get_outputs()]

    def _run(self, wanted: List[str], arrays: Dict[str, np.ndarray]) -> List[np.ndarray]:
        return self._session.run(wanted, arrays)


class TorchScriptModel(TritonRepositoryModel):
    """Serves ``<uri>/<version>/model.pt`` (TorchScript, Triton's ``pytorch_libtorch`` platform) with
    ``torch.jit.load`` on the CPU. As Triton's libtorch backend, the inputs are passed to ``forward`` in the order of
    ``config.pbtxt``'s inputs and the outputs map, in order, to its outputs; shapes and datatypes come from
    ``config.pbtxt`` (a TorchScript file records none), given by the launcher as ``extra.inputs`` / ``extra.outputs``
    (the KServe metadata, batch dimension -1)."""

    MODEL_FILE = "model.pt"

    def _load_model(self, path: str, extra: dict) -> None:
        import torch
        threads = int(extra.get("intra_op_threads", 0))
        if threads > 0:
            torch.set_num_threads(threads)
        self._module = torch.jit.load(path, map_location="cpu").eval()
        inputs, outputs = extra.get("inputs") or [], extra.get("outputs") or []
        if not inputs or not outputs:
            raise ValueError(f"{path}: the launcher gave no inputs/outputs from config.pbtxt")
        self._input_order = [t["name"] for t in inputs]
        self._expected = {t["name"]: {"datatype": t["datatype"], "shape": [None if d < 0 else d for d in t["shape"]]}
                          for t in inputs}
        self._output_names = [t["name"] for t in outputs]

    def _run(self, wanted: List[str], arrays: Dict[str, np.ndarray]) -> List[np.ndarray]:
        import torch
        with torch.inference_mode():
            result = self._module(*[torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in self._input_order])
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(results) != len(self._output_names):
            raise ValueError(f"the TorchScript model returned {len(results)} output(s), config.pbtxt lists "
                             f"{self._output_names}")
        by_name = {n: r.detach().cpu().numpy() for n, r in zip(self._output_names, results)}
        return [by_name[n] for n in wanted]
