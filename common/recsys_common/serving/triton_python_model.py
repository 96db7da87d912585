"""The ``model.py`` of every model in a CPU repository: Triton's Python backend running the artifact beside it.

This one file is copied into each version directory (``python_backend.write_python_backend_model``; it is never
imported from ``recsys_common``: Triton's stub loads it by path, with ``numpy``, ``triton_python_backend_utils`` and
the artifact's framework only, so the repository runs on any Triton, NVIDIA's containers included)::

    <repo>/<model>/config.pbtxt          backend: "python", parameters { key: "artifact" value: "model.onnx" }
    <repo>/<model>/recsys_serving.json   the sidecar: id ranges and string lengths per input (optional)
    <repo>/<model>/1/model.py            this file
    <repo>/<model>/1/model.onnx          the artifact: model.onnx (onnxruntime), model.pt (torch.jit.load) or
                                         model.savedmodel/ (TensorFlow, its serving_default signature)

What Triton checks before ``execute`` (datatypes, shapes, missing or unknown inputs, ``max_batch_size``) it answers
itself. What only the model knows is checked here, per request, with an error naming the model, the input, the row
and the bound, while the other requests of the batch are served: ids outside ``[min_id, max_id)`` of the sidecar
(one bound, or one per column), and BYTES elements longer than the sidecar's ``max_length``.

The requests of one ``execute`` (Triton's dynamic batcher gathers them) run as ONE framework call on their
concatenated rows, and the outputs are split back per request: batching is what the dynamic batcher is for.

Other Python-backend models (e.g. a preprocessing step) reuse this file: copy it beside their own ``model.py`` as
``recsys_python_model.py`` and subclass ``RecsysPythonModel``, implementing ``setup`` and ``compute``.
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

SIDECAR_NAME = "recsys_serving.json"
#: Environment variable (set by ``recsys_common.serving.triton_server``): framework threads per model instance.
THREADS_ENV = "RECSYS_SERVING_THREADS"


class RequestError(ValueError):
    """A request the model refuses; the message names the input, row and bound."""


def input_limits(model_dir):
    """{input name: {"max_id", "min_id", "max_length"}} from the model's sidecar ({} without one)."""
    path = os.path.join(model_dir, SIDECAR_NAME)
    if not os.path.isfile(path):
        return {}
    with open(path, "r", encoding="utf-8") as f:
        inputs = json.load(f).get("inputs", {})
    return {name: {"max_id": entry.get("max_id"), "min_id": int(entry.get("min_id") or 0),
                   "max_length": entry.get("max_length")} for name, entry in inputs.items()}


def check_ids(name, array, max_id, min_id):
    """Raise ``RequestError`` for the first id of ``array`` outside ``[min_id, max_id)`` (``max_id`` an int, or one
    bound per column of the last dimension)."""
    bounds = np.asarray(max_id, dtype=np.int64)
    if array.size == 0:
        return
    bad = (array < min_id) | (array >= bounds)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        limit = int(bounds) if bounds.ndim == 0 else int(bounds[where[-1]])
        column = "" if bounds.ndim == 0 else f", column {where[-1]}"
        raise RequestError(f"input {name!r}: id {int(array[where])} (row {where[0]}{column}) is out of range; ids "
                           f"must be in [{min_id}, {limit})")


def check_lengths(name, array, max_length):
    """Raise ``RequestError`` for the first BYTES element of ``array`` longer than ``max_length`` bytes."""
    for index, value in np.ndenumerate(array):
        size = len(value) if isinstance(value, (bytes, str)) else 0
        if size > max_length:
            raise RequestError(f"input {name!r}: element {list(index)} has {size} bytes; at most {max_length} "
                               f"allowed")


class RecsysPythonModel:
    """What every Python-backend model here shares: the configuration read once, the sidecar's checks per request,
    the requests of a batch run as one ``compute`` call, and a clear error per refused request.

    Subclasses implement ``setup()`` (load what ``compute`` needs; ``self.version_dir``, ``self.parameters``,
    ``self.input_names``, ``self.output_dtypes`` are set) and ``compute(arrays) -> {output name: array}`` (arrays
    batch first when ``max_batch_size > 0``)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.model_dir = args["model_repository"]
        self.version_dir = os.path.join(self.model_dir, args["model_version"])
        self.batching = int(config.get("max_batch_size", 0)) > 0
        self.parameters = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
        self.input_names = [t["name"] for t in config["input"]]
        self.output_dtypes = {t["name"]: pb_utils.triton_string_to_numpy(t["data_type"]) for t in config["output"]}
        self.limits = input_limits(self.model_dir)
        self.setup()

    def setup(self):
        raise NotImplementedError

    def compute(self, arrays):
        raise NotImplementedError

    def check(self, arrays):
        """The sidecar's checks of one request's arrays (``RequestError``)."""
        for name, limit in self.limits.items():
            array = arrays.get(name)
            if array is None:
                continue
            if limit["max_id"] is not None and array.dtype.kind in "iu":
                check_ids(name, array, limit["max_id"], limit["min_id"])
            if limit["max_length"] is not None and array.dtype == np.object_:
                check_lengths(name, array, int(limit["max_length"]))

    def _error(self, message):
        # INVALID_ARG: HTTP 400 / gRPC INVALID_ARGUMENT, as Triton's own request checks (older stubs: INTERNAL)
        code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
        error = pb_utils.TritonError(f"model {self.name}: {message}", *([code] if code is not None else []))
        return pb_utils.InferenceResponse(output_tensors=[], error=error)

    def _response(self, results, lo=None, hi=None):
        tensors = []
        for name, dtype in self.output_dtypes.items():
            value = np.asarray(results[name])
            value = value[lo:hi] if lo is not None else value
            tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(value.astype(dtype, copy=False))))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def execute(self, requests):
        responses = [None] * len(requests)
        accepted, batches = [], []
        for i, request in enumerate(requests):
            try:
                arrays = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.input_names}
                self.check(arrays)
            except RequestError as e:
                responses[i] = self._error(str(e))
                continue
            accepted.append(i)
            batches.append(arrays)
        if not accepted:
            return responses
        if not self.batching:   # no batch dimension: nothing to concatenate
            for i, arrays in zip(accepted, batches):
                responses[i] = self._run_one(arrays)
            return responses
        rows = np.cumsum([0] + [len(b[self.input_names[0]]) for b in batches])
        merged = batches[0] if len(batches) == 1 else {
            n: np.concatenate([b[n] for b in batches]) for n in self.input_names}
        try:
            results = self.compute(merged)
        except Exception as e:  # the framework's own refusal: every request of this batch gets it
            return [r if r is not None else self._error(f"{type(self).__name__} failed: {e}") for r in responses]
        for k, i in enumerate(accepted):
            responses[i] = self._response(results, int(rows[k]), int(rows[k + 1]))
        return responses

    def _run_one(self, arrays):
        try:
            return self._response(self.compute(arrays))
        except Exception as e:
            return self._error(f"{type(self).__name__} failed: {e}")


# ------------------------------------------------------------------------------------------------ the artifacts
def _threads():
    return int(os.environ.get(THREADS_ENV, "0") or 0)


class OnnxArtifact:
    """``model.onnx`` through onnxruntime (CPU)."""

    def __init__(self, path, input_names, output_names):
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = _threads()
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.output_names = list(output_names)
        # onnxruntime takes string tensors as str objects; Triton hands BYTES as bytes (which it would silently miss)
        self.string_inputs = [i.name for i in self.session.get_inputs() if i.type == "tensor(string)"]

    def __call__(self, arrays):
        if self.string_inputs:
            arrays = dict(arrays)
            for name in self.string_inputs:
                arrays[name] = _as_text(name, arrays[name])
        return dict(zip(self.output_names, self.session.run(self.output_names, arrays)))


def _as_text(name, array):
    """An object array of bytes as one of str (UTF-8); ``RequestError`` naming the element that is not UTF-8."""
    out = np.empty(array.shape, dtype=object)
    for index, value in np.ndenumerate(array):
        try:
            out[index] = value.decode("utf-8") if isinstance(value, bytes) else value
        except UnicodeDecodeError:
            raise RequestError(f"input {name!r}: element {list(index)} is not UTF-8 text") from None
    return out


class TorchScriptArtifact:
    """``model.pt`` through ``torch.jit.load``: inputs passed to ``forward`` in the config's order, outputs mapped in
    order to the config's outputs (as Triton's libtorch backend does)."""

    def __init__(self, path, input_names, output_names):
        import torch
        if _threads() > 0:
            torch.set_num_threads(_threads())
        self.torch = torch
        self.module = torch.jit.load(path, map_location="cpu").eval()
        self.input_names, self.output_names = list(input_names), list(output_names)

    def __call__(self, arrays):
        torch = self.torch
        with torch.inference_mode():
            result = self.module(*[torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in self.input_names])
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(results) != len(self.output_names):
            raise ValueError(f"the TorchScript model returned {len(results)} output(s); config.pbtxt lists "
                             f"{self.output_names}")
        return {n: r.detach().cpu().numpy() for n, r in zip(self.output_names, results)}


class SavedModelArtifact:
    """``model.savedmodel/`` through TensorFlow: its ``serving_default`` signature, inputs and outputs by name."""

    def __init__(self, path, input_names, output_names):
        import tensorflow as tf
        if _threads() > 0:
            tf.config.threading.set_intra_op_parallelism_threads(_threads())
            tf.config.threading.set_inter_op_parallelism_threads(1)
        self.tf = tf
        self.signature = tf.saved_model.load(path).signatures["serving_default"]
        self.output_names = list(output_names)

    def __call__(self, arrays):
        result = self.signature(**{n: self.tf.constant(a) for n, a in arrays.items()})
        return {n: result[n].numpy() for n in self.output_names}


ARTIFACTS = {".onnx": OnnxArtifact, ".pt": TorchScriptArtifact, ".savedmodel": SavedModelArtifact}


class TritonPythonModel(RecsysPythonModel):
    """Runs ``<version>/<parameters.artifact>`` with the framework its suffix names (``ARTIFACTS``)."""

    def setup(self):
        artifact = self.parameters.get("artifact", "")
        suffix = os.path.splitext(artifact)[1]
        if suffix not in ARTIFACTS:
            raise ValueError(f"model {self.name}: config.pbtxt parameter 'artifact' is {artifact!r}; expected a file "
                             f"ending in one of {sorted(ARTIFACTS)}")
        path = os.path.join(self.version_dir, artifact)
        if not os.path.exists(path):
            raise FileNotFoundError(f"model {self.name}: {path} not found")
        self.run = ARTIFACTS[suffix](path, self.input_names, list(self.output_dtypes))

    def compute(self, arrays):
        return self.run(arrays)
