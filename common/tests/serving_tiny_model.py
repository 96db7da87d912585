"""A tiny ONNX model built with onnx.helper (no framework) and its Triton repository, for the serving tests.

``probability = sigmoid(numerical @ W + table[cat])``: inputs ``numerical`` FP32 [B, 3] and ``cat`` INT64 [B, 1]
(ids in [0, 10), recorded as the sidecar's ``max_id``), output ``probability`` FP32 [B, 1].
"""
import os

import numpy as np

MODEL_NAME = "tiny-onnx"
MAX_ID = 10
MAX_BATCH_SIZE = 1 << 18   # a full batch (20 bytes a row) is a 5 MiB gRPC message, above gRPC's 4 MiB default
WEIGHTS = np.array([[0.5], [-1.0], [0.25]], np.float32)
TABLE = np.linspace(-1, 1, MAX_ID, dtype=np.float32).reshape(MAX_ID, 1)


def expected_probability(numerical: np.ndarray, cat: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(numerical @ WEIGHTS + TABLE[cat[:, 0]])))


def tiny_onnx_model():
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["numerical", "weights"], ["linear"]),
         helper.make_node("Gather", ["table", "cat"], ["gathered"], axis=0),
         helper.make_node("Squeeze", ["gathered", "axis1"], ["embedded"]),
         helper.make_node("Add", ["linear", "embedded"], ["logit"]),
         helper.make_node("Sigmoid", ["logit"], ["probability"])],
        "tiny",
        [helper.make_tensor_value_info("numerical", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("cat", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("probability", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(WEIGHTS, "weights"), numpy_helper.from_array(TABLE, "table"),
         numpy_helper.from_array(np.array([1], np.int64), "axis1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tiny_config_text(name: str = MODEL_NAME, **kwargs) -> str:
    from recsys_common.serving.model_config import TensorSpec, model_config_text
    return model_config_text(name, "onnxruntime_onnx",
                             [TensorSpec("numerical", "float32", [3]), TensorSpec("cat", "int64", [1])],
                             [TensorSpec("probability", "float32", [1])], max_batch_size=MAX_BATCH_SIZE, **kwargs)


TINY_SIDECAR = {"recipe": "tests", "format": "onnx",
                "inputs": {"numerical": {"dtype": "float32", "dims": [3], "max_id": None},
                           "cat": {"dtype": "int64", "dims": [1], "max_id": MAX_ID}},
                "outputs": ["probability"], "feature_spec": None}


def write_tiny_repository(repo_dir: str, overwrite: bool = False, tool: str = "tests.tiny",
                          name: str = MODEL_NAME, backend: str = "native") -> str:
    """Write a repository with the tiny model (``backend`` "python": its CPU variant); returns the model directory."""
    import onnx
    from recsys_common.serving.repository import model_repository
    with model_repository(repo_dir, overwrite=overwrite, tool=tool, backend=backend) as repo:
        version_dir = repo.add_model(name, tiny_config_text(name), sidecar=TINY_SIDECAR)
        onnx.save(tiny_onnx_model(), os.path.join(version_dir, "model.onnx"))
    return os.path.join(repo_dir, name)


def tiny_inputs(batch_size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {"numerical": rng.random((batch_size, 3), dtype=np.float32),
            "cat": rng.integers(0, MAX_ID, (batch_size, 1), dtype=np.int64)}


TS_MODEL_NAME = "tiny-ts"


def write_tiny_torchscript(repo_dir: str, name: str = TS_MODEL_NAME) -> str:
    """Add the same tiny model as TorchScript (platform ``pytorch_libtorch``) to an existing repository directory
    (written directly: the test repository is ours). Returns the model directory."""
    import torch
    from recsys_common.serving.model_config import TensorSpec, model_config_text

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.Parameter(torch.from_numpy(WEIGHTS), requires_grad=False)
            self.table = torch.nn.Parameter(torch.from_numpy(TABLE), requires_grad=False)

        def forward(self, numerical: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(numerical @ self.weights + self.table[cat[:, 0]])

    model_dir = os.path.join(repo_dir, name)
    os.makedirs(os.path.join(model_dir, "1"))
    torch.jit.script(Tiny()).save(os.path.join(model_dir, "1", "model.pt"))
    with open(os.path.join(model_dir, "config.pbtxt"), "w") as f:
        f.write(model_config_text(name, "pytorch_libtorch",
                                  [TensorSpec("numerical", "float32", [3]), TensorSpec("cat", "int64", [1])],
                                  [TensorSpec("probability", "float32", [1])], max_batch_size=MAX_BATCH_SIZE))
    import json
    with open(os.path.join(model_dir, "recsys_serving.json"), "w") as f:
        json.dump(dict(TINY_SIDECAR, format="ts-script"), f)
    return model_dir


# ------------------------------------------------------------------------------------------------ raw strings
STRING_MODEL_NAME = "tiny-strings"
ENSEMBLE_NAME = "tiny-raw"
TOKENS = [f"t{i}" for i in range(MAX_ID)]   # token "t<i>" is id i; an unknown token is id 0
MAX_TOKEN_BYTES = 4


def token_ids(tokens: np.ndarray) -> np.ndarray:
    """The ids the string model gives (object array of bytes -> int64)."""
    lookup = {t.encode(): i for i, t in enumerate(TOKENS)}
    return np.vectorize(lambda b: lookup.get(b, 0), otypes=[np.int64])(tokens)


def write_tiny_string_model(repo_dir: str, name: str = STRING_MODEL_NAME) -> str:
    """Add a BYTES -> INT64 model (ONNX ``LabelEncoder``: token [1] -> cat [1]) in its Python-backend variant, with
    ``max_length`` in the sidecar. Returns the model directory."""
    import json
    import onnx
    from onnx import TensorProto, helper
    from recsys_common.serving.model_config import TensorSpec, model_config_text
    from recsys_common.serving.python_backend import convert_to_python_backend
    graph = helper.make_graph(
        [helper.make_node("LabelEncoder", ["token"], ["cat"], domain="ai.onnx.ml", keys_strings=TOKENS,
                          values_int64s=list(range(MAX_ID)), default_int64=0)], "tokens",
        [helper.make_tensor_value_info("token", TensorProto.STRING, ["batch", 1])],
        [helper.make_tensor_value_info("cat", TensorProto.INT64, ["batch", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    model_dir = os.path.join(repo_dir, name)
    os.makedirs(os.path.join(model_dir, "1"))
    onnx.save(model, os.path.join(model_dir, "1", "model.onnx"))
    with open(os.path.join(model_dir, "config.pbtxt"), "w") as f:
        f.write(model_config_text(name, "onnxruntime_onnx", [TensorSpec("token", "bytes", [1])],
                                  [TensorSpec("cat", "int64", [1])], max_batch_size=MAX_BATCH_SIZE,
                                  dynamic_batching_delay_us=20000))   # 20 ms: concurrent requests meet
    with open(os.path.join(model_dir, "recsys_serving.json"), "w") as f:
        json.dump({"recipe": "tests", "format": "onnx", "outputs": ["cat"],
                   "inputs": {"token": {"dtype": "bytes", "dims": [1], "max_id": None,
                                        "max_length": MAX_TOKEN_BYTES}}}, f)
    convert_to_python_backend(model_dir)
    return model_dir


def write_tiny_ensemble(repo_dir: str, name: str = ENSEMBLE_NAME) -> str:
    """Add Triton's ensemble of the string model then the ONNX model: numerical FP32 [3] and token BYTES [1] ->
    probability. Returns the model directory."""
    from recsys_common.serving.model_config import EnsembleStep, TensorSpec, model_config_text
    steps = [EnsembleStep(STRING_MODEL_NAME, {"token": "token"}, {"cat": "cat"}),
             EnsembleStep(MODEL_NAME, {"numerical": "numerical", "cat": "cat"}, {"probability": "probability"})]
    model_dir = os.path.join(repo_dir, name)
    os.makedirs(os.path.join(model_dir, "1"))
    with open(os.path.join(model_dir, "config.pbtxt"), "w") as f:
        f.write(model_config_text(name, "ensemble", [TensorSpec("numerical", "float32", [3]),
                                                     TensorSpec("token", "bytes", [1])],
                                  [TensorSpec("probability", "float32", [1])], max_batch_size=MAX_BATCH_SIZE,
                                  ensemble_steps=steps))
    return model_dir


def write_tiny_cpu_repository(repo_dir: str) -> None:
    """The CPU repository the Triton tests serve: the ONNX and TorchScript tiny models, the string model and the
    ensemble of the two, every model through the Python backend."""
    from recsys_common.serving.python_backend import convert_to_python_backend
    write_tiny_repository(repo_dir, backend="python")
    convert_to_python_backend(write_tiny_torchscript(repo_dir))
    write_tiny_string_model(repo_dir)
    write_tiny_ensemble(repo_dir)
