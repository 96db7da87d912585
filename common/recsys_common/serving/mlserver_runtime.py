"""``OnnxModel``: the MLServer runtime that serves a Triton repository's ONNX model with onnxruntime.

Imported ONLY inside the MLServer process (``mlserver_launcher`` writes ``"implementation":
"recsys_common.serving.mlserver_runtime.OnnxModel"`` into each ``model-settings.json``). Never import this module
next to ``tritonclient.grpc``: the two define the same protobuf symbols.

Model settings it reads (``parameters``): ``uri`` = the Triton model directory (``<repo>/<model>``), ``version`` =
the version directory to load (default: the highest), ``extra.intra_op_threads`` = onnxruntime's intra-op threads
(0: onnxruntime's default), ``extra.max_batch_size`` = config.pbtxt's ``max_batch_size`` (requests with more rows are
refused, as Triton refuses them; 0 or absent: no limit). The launcher fills these in.

Every request is checked before it reaches onnxruntime: input names (missing / unknown), KServe datatypes, shapes
(rank, the non-batch dims of the ONNX graph, one batch size across inputs) and ids against the sidecar's ``max_id``
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


def _latest_version(model_dir: str) -> str:
    versions = sorted(int(n) for n in os.listdir(model_dir)
                      if n.isdigit() and os.path.isfile(os.path.join(model_dir, n, "model.onnx")))
    if not versions:
        raise FileNotFoundError(f"{model_dir}: no version directory with a model.onnx")
    return str(versions[-1])


class OnnxModel(MLModel):
    """Serves ``<uri>/<version>/model.onnx`` with onnxruntime (CPUExecutionProvider)."""

    async def load(self) -> bool:
        import onnxruntime as ort
        params = self.settings.parameters
        model_dir = params.uri
        version = params.version or _latest_version(model_dir)
        path = os.path.join(model_dir, version, "model.onnx")
        extra = getattr(params, "extra", None) or {}
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
        self._max_ids: Dict[str, Optional[int]] = {}
        self._min_ids: Dict[str, int] = {}
        if os.path.exists(os.path.join(model_dir, SIDECAR_NAME)):
            sidecar = read_sidecar(model_dir)
            self._max_ids = {name: entry.get("max_id") for name, entry in sidecar["inputs"].items()}
            self._min_ids = {name: entry.get("min_id", 0) for name, entry in sidecar["inputs"].items()}
        self._max_batch_size = int(extra.get("max_batch_size", 0))
        self._path = path
        return True

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
            results = self._session.run(wanted, arrays)
        except Exception as e:  # onnxruntime's own checks (e.g. an id its Gather rejects)
            raise InferenceError(f"model {self.name}: onnxruntime failed on this request: {e}") from None
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id,
                                 outputs=[NumpyCodec.encode_output(name, np.asarray(value))
                                          for name, value in zip(wanted, results)])
