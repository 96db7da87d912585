"""The CPU variant of a Triton model repository: every model through Triton's Python backend.

The deployers describe each model once (name, inputs, outputs, ``max_batch_size``, dynamic batching, the artifact
in its platform's format) and write the GPU repository from it, as NVIDIA's Triton serves it (onnxruntime, libtorch,
TensorFlow platforms). With ``--triton-backend python`` the same repository is rewritten here before it is moved
into place, model by model:

    platform: "onnxruntime_onnx"              ->  backend: "python"
    (model.onnx / model.pt / model.savedmodel)    parameters { key: "artifact" value: "model.onnx" }
    instance_group kind KIND_GPU              ->  KIND_CPU (the artifact runs on the CPU inside model.py)
    1/model.onnx                              ->  1/model.onnx and 1/model.py (``triton_python_model.py``)

Names, inputs, outputs, ``max_batch_size``, dynamic batching and instance counts stay as written; an ensemble stays
an ensemble (Triton's own scheduler chains its steps, whatever their backend). Such a repository runs on any Triton
with the Python backend and the artifact's framework importable by its stub, with or without GPUs, and on the
tritonserver ``make setup`` installs (``triton_server``).
"""
from __future__ import annotations

import os
import shutil

from .model_config import CONFIG_NAME, ModelConfigError, model_file_name, parse_model_config, version_directories

#: The two ways to write a repository: each platform's own backend, or Triton's Python backend (the CPU variant).
BACKENDS = ("native", "python")
#: The file copied into every version directory as ``model.py``.
MODEL_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_python_model.py")
#: What ``model.py`` reuses under this name beside another Python-backend model (a preprocessing step).
BASE_MODULE_NAME = "recsys_python_model.py"


def write_python_backend_model(version_dir: str, name: str = "model.py") -> str:
    """Copy ``triton_python_model.py`` into ``version_dir`` as ``name``; returns the path written."""
    target = os.path.join(version_dir, name)
    shutil.copyfile(MODEL_SOURCE, target)
    return target


def convert_to_python_backend(model_dir: str) -> None:
    """Rewrite one model directory of a repository as its Python-backend variant (see the module docstring); an
    ensemble is left as it is. Raises ``ModelConfigError`` naming the file."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb2
    config_path = os.path.join(model_dir, CONFIG_NAME)
    config = parse_model_config(config_path)
    if config.platform == "ensemble" or config.backend == "python":
        return
    artifact = model_file_name(config)
    if not artifact:
        raise ModelConfigError(f"{config_path}: no model file to run in the Python backend")
    config.platform = ""
    config.backend = "python"
    config.default_model_filename = ""
    config.parameters["artifact"].string_value = artifact
    for group in config.instance_group:
        group.kind = pb2.ModelInstanceGroup.Kind.Value("KIND_CPU")
        del group.gpus[:]
    for version in version_directories(model_dir):
        write_python_backend_model(os.path.join(model_dir, str(version)))
    with open(config_path, "w", encoding="utf-8") as f:
        f.write(text_format.MessageToString(config))
