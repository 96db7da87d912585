"""Triton ``config.pbtxt`` files built and checked with Triton's own protobuf definitions.

The text is produced by ``tritonclient.grpc.model_config_pb2.ModelConfig`` and ``google.protobuf.text_format``, so
every file we write parses in Triton by construction; ``parse_model_config`` and ``check_model_directory`` read them
back the same way.

    >>> text = model_config_text("tiny-onnx", "onnxruntime_onnx", [TensorSpec("x", "float32", [3])],
    ...                          [TensorSpec("probability", "float32", [1])], max_batch_size=64)
    >>> print(text.splitlines()[0])
    name: "tiny-onnx"

``tritonclient.grpc`` is imported lazily (inside the functions): a deployer that only parses configs stays light.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Mapping, Optional, Sequence

from recsys_common.cli import InputError

# numpy dtype name -> Triton config data type (model_config.proto) and KServe-v2 wire datatype.
_NUMPY_TO_TRITON = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64", "object": "TYPE_STRING",
    "bytes": "TYPE_STRING",
}
_TRITON_TO_NUMPY = {v: k for k, v in _NUMPY_TO_TRITON.items() if k not in ("bytes",)}

#: The file (or directory) inside a version directory that each platform loads (Triton's default names).
PLATFORM_MODEL_FILES = {
    "onnxruntime_onnx": "model.onnx",
    "pytorch_libtorch": "model.pt",
    "tensorflow_savedmodel": "model.savedmodel",
    "ensemble": None,   # an ensemble's version directory exists but holds no model file
}
#: The file a version directory holds for a model with ``backend`` set (and no platform).
BACKEND_MODEL_FILES = {"python": "model.py"}

CONFIG_NAME = "config.pbtxt"


class ModelConfigError(InputError):
    """A ``config.pbtxt`` or model directory that Triton would refuse; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One model input or output: ``name``, numpy ``dtype`` name ("float32", "int64", ...), ``dims`` WITHOUT the batch
    dimension (Triton's convention when ``max_batch_size > 0``; -1 for a variable size)."""
    name: str
    dtype: str
    dims: Sequence[int]


@dataclasses.dataclass(frozen=True)
class EnsembleStep:
    """One step of an ``ensemble`` model: run ``model_name`` with ``input_map`` {its input: ensemble tensor} and
    ``output_map`` {its output: ensemble tensor}; ``model_version`` -1 means the latest."""
    model_name: str
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]
    model_version: int = -1


def triton_dtype(numpy_dtype: str) -> str:
    """numpy dtype name -> Triton config type name ("float32" -> "TYPE_FP32")."""
    import numpy as np
    name = "object" if numpy_dtype in ("object", "bytes", "str") else np.dtype(numpy_dtype).name
    try:
        return _NUMPY_TO_TRITON[name]
    except KeyError:
        raise ModelConfigError(f"dtype {numpy_dtype!r} has no Triton type (supported: "
                               f"{', '.join(sorted(_NUMPY_TO_TRITON))})") from None


def numpy_dtype(triton_type: str) -> str:
    """Triton config type name -> numpy dtype name ("TYPE_INT64" -> "int64")."""
    try:
        return _TRITON_TO_NUMPY[triton_type]
    except KeyError:
        raise ModelConfigError(f"Triton type {triton_type!r} has no numpy dtype here") from None


def _pb2():
    from tritonclient.grpc import model_config_pb2
    return model_config_pb2


def _tensor(message, spec: TensorSpec, pb2) -> None:
    message.name = spec.name
    message.data_type = pb2.DataType.Value(triton_dtype(spec.dtype))
    dims = [int(d) for d in spec.dims]
    if not dims or any(d < -1 or d == 0 for d in dims):
        raise ModelConfigError(f"tensor {spec.name!r}: dims {list(spec.dims)} must be a non-empty list of sizes > 0 "
                               f"or -1 (without the batch dimension)")
    message.dims.extend(dims)


def model_config_text(name: str, platform: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                      max_batch_size: int, *, dynamic_batching_delay_us: Optional[int] = None,
                      preferred_batch_sizes: Optional[Sequence[int]] = None, instance_count: int = 1,
                      instance_kind: str = "KIND_CPU", ensemble_steps: Optional[Sequence[EnsembleStep]] = None,
                      parameters: Optional[Mapping[str, str]] = None, backend: Optional[str] = None) -> str:
    """The text of a ``config.pbtxt`` (a ``inference.ModelConfig`` in protobuf text format).

    Args:
        name: the model name (must equal its directory name in the repository).
        platform: "onnxruntime_onnx", "pytorch_libtorch", "tensorflow_savedmodel" or "ensemble"; "" with ``backend``.
        backend: "python" (Triton's Python backend: ``<version>/model.py``) instead of a platform.
        inputs, outputs: ``TensorSpec``s, dims without the batch dimension.
        max_batch_size: > 0 (the batch dimension is implicit), or 0 for a model without batching.
        dynamic_batching_delay_us: ``None``: no dynamic batching; otherwise Triton's ``max_queue_delay_microseconds``.
        preferred_batch_sizes: optional preferred batch sizes of the dynamic batcher.
        instance_count, instance_kind: one ``instance_group`` (ignored for an ensemble, which Triton schedules itself).
        ensemble_steps: the steps of an "ensemble" model (required for it, refused for the others).
        parameters: string key/values (``parameters { key: ... value { string_value: ... } }``).
    Returns: the text, ending with a newline.
    """
    pb2 = _pb2()
    if backend is not None and (platform or backend not in BACKEND_MODEL_FILES):
        raise ModelConfigError(f"model {name!r}: backend {backend!r} with platform {platform!r}: give a backend of "
                               f"{sorted(BACKEND_MODEL_FILES)} and no platform")
    if backend is None and platform not in PLATFORM_MODEL_FILES:
        raise ModelConfigError(f"model {name!r}: platform {platform!r} is not one of {sorted(PLATFORM_MODEL_FILES)}")
    if max_batch_size < 0:
        raise ModelConfigError(f"model {name!r}: max_batch_size must be >= 0, got {max_batch_size}")
    if not inputs or not outputs:
        raise ModelConfigError(f"model {name!r}: a model needs at least one input and one output")
    config = pb2.ModelConfig(name=name, platform=platform, backend=backend or "", max_batch_size=int(max_batch_size))
    for spec in inputs:
        _tensor(config.input.add(), spec, pb2)
    for spec in outputs:
        _tensor(config.output.add(), spec, pb2)
    if platform == "ensemble":
        if not ensemble_steps:
            raise ModelConfigError(f"model {name!r}: platform 'ensemble' needs ensemble_steps")
        for step in ensemble_steps:
            message = config.ensemble_scheduling.step.add(model_name=step.model_name,
                                                          model_version=int(step.model_version))
            message.input_map.update(dict(step.input_map))
            message.output_map.update(dict(step.output_map))
    else:
        if ensemble_steps:
            raise ModelConfigError(f"model {name!r}: ensemble_steps given for platform {platform!r}")
        if instance_count < 1:
            raise ModelConfigError(f"model {name!r}: instance_count must be >= 1, got {instance_count}")
        config.instance_group.add(count=int(instance_count), kind=pb2.ModelInstanceGroup.Kind.Value(instance_kind))
        if dynamic_batching_delay_us is not None:
            if dynamic_batching_delay_us < 0:
                raise ModelConfigError(f"model {name!r}: dynamic batching delay must be >= 0 us, got "
                                       f"{dynamic_batching_delay_us}")
            if max_batch_size == 0:
                raise ModelConfigError(f"model {name!r}: dynamic batching needs max_batch_size > 0")
            config.dynamic_batching.max_queue_delay_microseconds = int(dynamic_batching_delay_us)
            for size in preferred_batch_sizes or ():
                if not 0 < int(size) <= max_batch_size:
                    raise ModelConfigError(f"model {name!r}: preferred batch size {size} is not in 1..{max_batch_size}")
                config.dynamic_batching.preferred_batch_size.append(int(size))
    for key, value in (parameters or {}).items():
        config.parameters[str(key)].string_value = str(value)
    from google.protobuf import text_format
    return text_format.MessageToString(config)


def parse_model_config_text(text: str, source: str = "<text>"):
    """Parse ``config.pbtxt`` text into a ``ModelConfig``; ``ModelConfigError`` names ``source`` and the parse error."""
    from google.protobuf import text_format
    pb2 = _pb2()
    try:
        return text_format.Parse(text, pb2.ModelConfig())
    except text_format.ParseError as e:
        raise ModelConfigError(f"{source}: not a valid Triton model configuration: {e}") from None


def parse_model_config(path: str):
    """Read and parse a ``config.pbtxt`` (returns ``tritonclient.grpc.model_config_pb2.ModelConfig``)."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ModelConfigError(f"{path}: no such model configuration file") from None
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{path}: not a text file ({e})") from None
    return parse_model_config_text(text, source=path)


def version_directories(model_dir: str) -> List[int]:
    """The numeric version directories of a model directory, ascending (Triton ignores other names)."""
    return sorted(int(n) for n in os.listdir(model_dir)
                  if n.isdigit() and os.path.isdir(os.path.join(model_dir, n)))


def model_file_name(config) -> Optional[str]:
    """The file the version directories of ``config``'s model must hold (``default_model_filename`` or Triton's
    default for the platform or backend; None for an ensemble)."""
    if config.backend and not config.platform:
        if config.backend not in BACKEND_MODEL_FILES:
            raise ModelConfigError(f"model {config.name!r}: backend {config.backend!r} is not one of "
                                   f"{sorted(BACKEND_MODEL_FILES)}")
        return config.default_model_filename or BACKEND_MODEL_FILES[config.backend]
    if config.platform not in PLATFORM_MODEL_FILES:
        raise ModelConfigError(f"model {config.name!r}: platform {config.platform!r} is not one of "
                               f"{sorted(PLATFORM_MODEL_FILES)}")
    return config.default_model_filename or PLATFORM_MODEL_FILES[config.platform]


def check_model_directory(model_dir: str):
    """Check one model directory of a Triton repository the way Triton loads it; return its ``ModelConfig``.

    Checks: ``config.pbtxt`` parses; its name equals the directory name; a known platform; at least one input and one
    output, each with dims; at least one numeric version directory; each version directory holds the file its
    platform loads (``model.onnx``, ``model.pt``, ``model.savedmodel/saved_model.pb``); an ensemble names at least
    one step, and its steps read only ensemble inputs or outputs of earlier steps and produce every ensemble output.
    Raises ``ModelConfigError`` naming the file and what is wrong.
    """
    model_dir = os.path.abspath(model_dir)
    if not os.path.isdir(model_dir):
        raise ModelConfigError(f"{model_dir}: not a model directory")
    config_path = os.path.join(model_dir, CONFIG_NAME)
    config = parse_model_config(config_path)
    where = f"{config_path}:"
    directory_name = os.path.basename(model_dir)
    if config.name != directory_name:
        raise ModelConfigError(f"{where} name {config.name!r} differs from the directory name {directory_name!r} "
                               f"(Triton requires them equal)")
    file_name = model_file_name(config)
    for kind, tensors in (("input", config.input), ("output", config.output)):
        if not tensors:
            raise ModelConfigError(f"{where} the model declares no {kind}")
        for t in tensors:
            if not t.dims:
                raise ModelConfigError(f"{where} {kind} {t.name!r} has no dims")
            if t.data_type == 0:
                raise ModelConfigError(f"{where} {kind} {t.name!r} has no data_type")
    versions = version_directories(model_dir)
    if not versions:
        raise ModelConfigError(f"{model_dir}: no numeric version directory (e.g. {model_dir}/1/)")
    for version in versions:
        if file_name is None:
            continue
        path = os.path.join(model_dir, str(version), file_name)
        if config.platform == "tensorflow_savedmodel":
            if not os.path.isfile(os.path.join(path, "saved_model.pb")):
                raise ModelConfigError(f"{path}: missing SavedModel (no saved_model.pb) for platform "
                                       f"'tensorflow_savedmodel'")
        elif not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise ModelConfigError(f"{path}: missing or empty model file for {config.platform or config.backend!r}")
        artifact = config.parameters["artifact"].string_value if "artifact" in config.parameters else ""
        if config.backend == "python" and artifact and not os.path.exists(os.path.join(model_dir, str(version),
                                                                                       artifact)):
            raise ModelConfigError(f"{os.path.join(model_dir, str(version), artifact)}: missing; config.pbtxt's "
                                   f"parameter 'artifact' names it for the Python backend's model.py")
    if config.platform == "ensemble":
        _check_ensemble(config, where)
    return config


def _check_ensemble(config, where: str) -> None:
    steps = config.ensemble_scheduling.step
    if not steps:
        raise ModelConfigError(f"{where} platform 'ensemble' without ensemble_scheduling steps")
    available = {t.name for t in config.input}
    for i, step in enumerate(steps):
        if not step.model_name:
            raise ModelConfigError(f"{where} ensemble step {i} names no model")
        for model_input, tensor in step.input_map.items():
            if tensor not in available:
                raise ModelConfigError(f"{where} ensemble step {i} ({step.model_name}) reads {tensor!r} for its input "
                                       f"{model_input!r}, which is neither an ensemble input nor an earlier step's "
                                       f"output")
        available.update(step.output_map.values())
    missing = [t.name for t in config.output if t.name not in available]
    if missing:
        raise ModelConfigError(f"{where} ensemble outputs {missing} are produced by no step")


def config_tensors(config) -> Dict[str, List[TensorSpec]]:
    """``{"inputs": [TensorSpec...], "outputs": [...]}`` of a parsed ``ModelConfig``."""
    pb2 = _pb2()

    def specs(tensors):
        return [TensorSpec(t.name, numpy_dtype(pb2.DataType.Name(t.data_type)), list(t.dims)) for t in tensors]
    return {"inputs": specs(config.input), "outputs": specs(config.output)}
