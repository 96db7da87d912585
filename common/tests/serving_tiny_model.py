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
                          name: str = MODEL_NAME) -> str:
    """Write a repository with the tiny model; returns the model directory."""
    import onnx
    from recsys_common.serving.repository import model_repository
    with model_repository(repo_dir, overwrite=overwrite, tool=tool) as repo:
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
