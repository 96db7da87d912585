"""A PyTorch serving module -> Triton model repository (ONNX and/or TorchScript), for every PyTorch recipe.

PyTorch DLRM (``dlrm.serving``) and NCF (``neumf.serving``) each build their served module (inputs and
output named for what they hold, the id range check inside the graph) and its sidecar; everything from there on is
here, once: the format flags and their rule, the model names, the export calls, the repository, and the
exported-vs-eager check.

    <repo>/<name>-onnx/config.pbtxt         platform onnxruntime_onnx
    <repo>/<name>-onnx/1/model.onnx         torch.onnx.export, dynamic batch dimension
    <repo>/<name>-ts/config.pbtxt           platform pytorch_libtorch
    <repo>/<name>-ts/1/model.pt             torch.jit.script (--ts-script) or torch.jit.trace (--ts-trace)
    <repo>/<name>-*/recsys_serving.json     the sidecar: inputs with their id ranges, the model configuration

The inputs of every model are the sidecar's ``inputs`` in order (the module's ``forward`` arguments; Triton's
pytorch_libtorch backend matches config inputs to those argument names), each ``[B] + dims``; the outputs are the
sidecar's ``outputs``, float32 ``[B] + output_dims``. The Triton settings come in one
``triton_options.TritonOptions``.

    options = TritonOptions("ncf", max_batch_size=65536, dynamic_batching_delay_us=500, instance_kind="KIND_CPU",
                            repository="/tmp/repo")
    dirs = write_repository(module, sidecar, ["onnx", "ts-script"], options, tool="PyTorch/NCF/deployment/deployer.py")
    diffs = check_exported(module, dirs, options.version, random_rows(sidecar["inputs"], 4096, seed=1))

Imports torch (and onnxruntime inside :func:`run_exported`), never TensorFlow.
"""
from __future__ import annotations

import os
import warnings
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn

from recsys_common.cli import InputError
from .rows import random_rows
from .triton_options import TritonOptions
from .model_config import TensorSpec, model_config_text
from .repository import model_repository

FORMATS = ("onnx", "ts-script", "ts-trace")
PLATFORMS = {"onnx": "onnxruntime_onnx", "ts-script": "pytorch_libtorch", "ts-trace": "pytorch_libtorch"}
MODEL_FILES = {"onnx": "model.onnx", "ts-script": "model.pt", "ts-trace": "model.pt"}
ONNX_OPSET = 17
SAMPLE_ROWS = 4   # rows of the example batch that torch.onnx.export and torch.jit.trace run


class ExportError(InputError):
    """Export flags that cannot produce a repository; the message names the flag."""


# ------------------------------------------------------------------------------------------------------ formats
def add_format_arguments(parser):
    """NVIDIA's format flags ``--ts-script``, ``--ts-trace``, ``--onnx`` (they combine here; none means ``--onnx
    --ts-script``). Returns the group."""
    fmt = parser.add_argument_group("formats (--onnx with at most one TorchScript method; none: --onnx --ts-script)")
    fmt.add_argument("--ts-script", action="store_true", help="TorchScript model via torch.jit.script")
    fmt.add_argument("--ts-trace", action="store_true", help="TorchScript model via torch.jit.trace")
    fmt.add_argument("--onnx", action="store_true", help="ONNX model via torch.onnx.export")
    return fmt


def selected_formats(onnx: bool, ts_script: bool, ts_trace: bool) -> List[str]:
    """The formats to write, in a fixed order; none selected means ONNX and torch.jit.script."""
    if ts_script and ts_trace:
        raise ExportError("--ts-script and --ts-trace both write the TorchScript model (<name>-ts): choose one")
    formats = [f for f, on in (("onnx", onnx), ("ts-script", ts_script), ("ts-trace", ts_trace)) if on]
    return formats or ["onnx", "ts-script"]


def model_names(base: str, formats: Sequence[str]) -> Dict[str, str]:
    """Triton model name per format: ``<base>-onnx`` and ``<base>-ts`` (script and trace are one model)."""
    return {fmt: f"{base}-onnx" if fmt == "onnx" else f"{base}-ts" for fmt in formats}


# ------------------------------------------------------------------------------------------------------- export
def _tensors(sample: Mapping[str, np.ndarray]) -> tuple:
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in sample.values())


def export_onnx(module: nn.Module, path: str, sample: Mapping[str, np.ndarray], output_names: Sequence[str],
                opset: int = ONNX_OPSET) -> None:
    """Write ``module`` as ONNX to ``path``: inputs named and ordered as ``sample`` (an example batch of valid rows),
    outputs ``output_names``, the batch dimension dynamic."""
    dynamic = {name: {0: "batch"} for name in (*sample, *output_names)}
    with warnings.catch_warnings():
        # The TorchScript-based exporter (dynamo=False): well under a second where dynamo=True takes several, and a
        # plain graph (Gather, Gemm, Relu, MatMul, Sigmoid) that onnxruntime runs as well.
        warnings.simplefilter("ignore")
        torch.onnx.export(module, _tensors(sample), path, input_names=list(sample), output_names=list(output_names),
                          dynamic_axes=dynamic, opset_version=opset, dynamo=False)


def export_torchscript(module: nn.Module, path: str, method: str, sample: Mapping[str, np.ndarray]) -> None:
    """Write ``module`` as TorchScript to ``path``: ``method`` ``"script"`` (torch.jit.script) or ``"trace"`` (run on
    ``sample``, the forward arguments in order)."""
    if method not in ("script", "trace"):
        raise ExportError(f"unknown TorchScript method {method!r}; expected 'script' or 'trace'")
    with warnings.catch_warnings():
        # torch.jit is deprecated in favour of torch.export, but TorchScript is what Triton's pytorch_libtorch
        # backend loads.
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(module) if method == "script" else torch.jit.trace(module, _tensors(sample))
    scripted.save(path)


def write_repository(module: nn.Module, sidecar: Mapping, formats: Sequence[str], options: TritonOptions, *,
                     tool: str, opset: int = ONNX_OPSET, output_dims: Sequence[int] = (1,),
                     sample: Optional[Mapping[str, np.ndarray]] = None) -> List[str]:
    """Export ``module`` (eval mode, CPU) in each of ``formats`` into the repository ``options.repository``; returns
    the model directories.

    ``sidecar``: the recipe's ``recsys_serving.json`` without ``format`` (added per model); its ``inputs`` give the
    config's inputs and the example batch (``sample`` overrides it), its ``outputs`` the output names. The repository
    is written atomically by ``repository.model_repository`` as ``tool``: a non-empty one is refused unless
    ``options.overwrite``, and then only files this tool wrote are replaced.
    """

    formats = list(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ExportError(f"formats {formats}: expected some of {', '.join(FORMATS)}")
    if "ts-script" in formats and "ts-trace" in formats:
        raise ExportError("--ts-script and --ts-trace both write the TorchScript model (<name>-ts): choose one")
    inputs = [TensorSpec(name, entry["dtype"], list(entry["dims"])) for name, entry in sidecar["inputs"].items()]
    outputs = [TensorSpec(name, "float32", list(output_dims)) for name in sidecar["outputs"]]
    sample = dict(sample) if sample is not None else random_rows(sidecar["inputs"], SAMPLE_ROWS)
    names = model_names(options.model_name, formats)
    written = []
    with model_repository(options.repository, overwrite=options.overwrite, tool=tool,
                          backend=options.backend) as repo:
        for fmt in formats:
            text = model_config_text(names[fmt], PLATFORMS[fmt], inputs, outputs, options.max_batch_size,
                                     dynamic_batching_delay_us=options.dynamic_batching_delay_us,
                                     preferred_batch_sizes=options.preferred_batch_sizes,
                                     instance_count=options.instance_count, instance_kind=options.instance_kind)
            version_dir = repo.add_model(names[fmt], text, version=options.version,
                                         sidecar=dict(sidecar, format=fmt))
            path = os.path.join(version_dir, MODEL_FILES[fmt])
            if fmt == "onnx":
                export_onnx(module, path, sample, sidecar["outputs"], opset)
            else:
                export_torchscript(module, path, fmt[len("ts-"):], sample)
            written.append(os.path.join(options.repository, names[fmt]))
    return written


# -------------------------------------------------------------------------------------------------------- check
def predict(module, inputs: Mapping[str, np.ndarray], batch_size: int = 65536) -> np.ndarray:
    """``module`` (eager or TorchScript) on numpy ``inputs`` (its forward arguments in order) in batches; the first
    output flattened to float32 ``[rows]``."""
    rows = len(next(iter(inputs.values())))
    out = []
    with torch.no_grad():
        for start in range(0, rows, batch_size):
            batch = {name: a[start:start + batch_size] for name, a in inputs.items()}
            out.append(module(*_tensors(batch)).reshape(-1).float().numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def run_exported(model_dir: str, version: int, inputs: Mapping[str, np.ndarray], output_name: str) -> np.ndarray:
    """The model file of ``<model_dir>/<version>`` (onnxruntime for ``model.onnx``, ``torch.jit.load`` for
    ``model.pt``) on ``inputs``; its output flattened to ``[rows]``."""
    version_dir = os.path.join(model_dir, str(version))
    onnx_path = os.path.join(version_dir, MODEL_FILES["onnx"])
    if os.path.isfile(onnx_path):
        import onnxruntime as ort
        session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        return session.run([output_name], dict(inputs))[0].reshape(-1)
    return predict(torch.jit.load(os.path.join(version_dir, MODEL_FILES["ts-script"]), map_location="cpu"), inputs)


def check_exported(module: nn.Module, model_dirs: Sequence[str], version: int, inputs: Mapping[str, np.ndarray],
                   output_name: str = "probability") -> Dict[str, float]:
    """Largest |exported - eager| output per written model on ``inputs`` (NVIDIA's "conversion correctness test");
    NaN rows (ids out of range) must be NaN in both and count as equal."""
    eager = predict(module, inputs)
    diffs = {}
    for model_dir in model_dirs:
        got = run_exported(model_dir, version, inputs, output_name)
        if not np.array_equal(np.isnan(got), np.isnan(eager)):
            diffs[os.path.basename(model_dir)] = float("inf")   # a row NaN (flagged) in one and scored in the other
        else:
            diffs[os.path.basename(model_dir)] = float(np.abs(np.nan_to_num(got) - np.nan_to_num(eager)).max(
                initial=0.0))
    return diffs
