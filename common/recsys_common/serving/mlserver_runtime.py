"""``OnnxModel``: the MLServer runtime that serves a Triton repository's ONNX model with onnxruntime.

Imported ONLY inside the MLServer process (``mlserver_launcher`` writes ``"implementation":
"recsys_common.serving.mlserver_runtime.OnnxModel"`` into each ``model-settings.json``). Never import this module
next to ``tritonclient.grpc``: the two define the same protobuf symbols.

Model settings it reads (``parameters``): ``uri`` = the Triton model directory (``<repo>/<model>``), ``version`` =
the version directory to load (default: the highest), ``extra.intra_op_threads`` = onnxruntime's intra-op threads
(0: onnxruntime's default).

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


def check_request_arrays(arrays: Dict[str, np.ndarray], datatypes: Dict[str, str], expected: Dict[str, dict],
                         max_ids: Dict[str, Optional[int]]) -> None:
    """Check decoded request inputs against the model; raise ``ValueError`` with a message naming the input.

    Args:
        arrays: {input name: array} as decoded from the request.
        datatypes: {input name: the request's KServe datatype}.
        expected: {input name: {"datatype": KServe datatype, "shape": ONNX shape (ints, or None/str for free dims)}}.
        max_ids: {input name: max_id or None}; ids must be in [0, max_id).
    """
    missing = [n for n in expected if n not in arrays]
    if missing:
        raise ValueError(f"missing input(s) {missing}; the model takes {sorted(expected)}")
    unknown = [n for n in arrays if n not in expected]
    if unknown:
        raise ValueError(f"unknown input(s) {unknown}; the model takes {sorted(expected)}")
    batch = None
    for name, spec in expected.items():
        array = arrays[name]
        if datatypes[name] != spec["datatype"]:
            raise ValueError(f"input {name!r}: expected datatype {spec['datatype']}, got {datatypes[name]}")
        shape = spec["shape"]
        if array.ndim != len(shape):
            raise ValueError(f"input {name!r}: expected shape {_show_shape(shape)} (rank {len(shape)}), got "
                             f"{list(array.shape)}")
        for axis, (want, got) in enumerate(zip(shape, array.shape)):
            if isinstance(want, int) and want > 0 and want != got:
                raise ValueError(f"input {name!r}: expected shape {_show_shape(shape)}, got {list(array.shape)} "
                                 f"(dimension {axis})")
        if array.ndim and batch is not None and array.shape[0] != batch[1]:
            raise ValueError(f"input {name!r}: batch size {array.shape[0]} differs from input {batch[0]!r}'s "
                             f"{batch[1]}")
        if array.ndim and batch is None:
            batch = (name, array.shape[0])
        max_id = max_ids.get(name)
        if max_id is not None and array.size:
            low, high = int(array.min()), int(array.max())
            if low < 0 or high >= max_id:
                bad = low if low < 0 else high
                row = int(np.argwhere(array == bad)[0][0])
                raise ValueError(f"input {name!r}: id {bad} (row {row}) is out of range; ids must be in "
                                 f"[0, {max_id})")


def _show_shape(shape) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) and d > 0 else "B" if i == 0 else "?"
                           for i, d in enumerate(shape)) + "]"


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
        if os.path.exists(os.path.join(model_dir, SIDECAR_NAME)):
            sidecar = read_sidecar(model_dir)
            self._max_ids = {name: entry.get("max_id") for name, entry in sidecar["inputs"].items()}
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
            check_request_arrays(arrays, datatypes, self._expected, self._max_ids)
        except ValueError as e:
            raise InferenceError(f"model {self.name}: {e}") from None
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
