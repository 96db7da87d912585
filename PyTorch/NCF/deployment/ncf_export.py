"""NCF for inference servers: the served module, its ONNX / TorchScript export, and the Triton model repository.

The served model takes two INT64 inputs ``user`` and ``item`` of shape ``[B, 1]`` (dataset ids, ``0 <= id <
num_users`` / ``num_items``) and returns ``probability`` FP32 ``[B, 1]`` = ``sigmoid(logit)`` of the trained
model (:class:`ServingNCF`), NaN for a row whose id is out of range (the check is in the exported graph, so every
server flags it; see ``recsys_common.serving.id_range_torch``). The ``[B, 1]`` shapes are Triton's convention for one value per row: with
``max_batch_size > 0`` the config lists ``dims: [1]`` (the batch dimension is implicit), and no ``reshape`` is
needed, so the same config serves the ONNX and the TorchScript file.

Triton repository written by :func:`write_repository` (``recsys_common.serving`` builds and validates the config)::

    <repo>/<name>-onnx/config.pbtxt     platform onnxruntime_onnx
    <repo>/<name>-onnx/1/model.onnx
    <repo>/<name>-ts/config.pbtxt       platform pytorch_libtorch
    <repo>/<name>-ts/1/model.pt         torch.jit.script (or trace) of the same module
    <repo>/<name>-*/recsys_serving.json inputs with their id ranges (max_id), the training configuration

No argparse here: the deployer passes explicit values.
"""
from __future__ import annotations

import os
import warnings
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from recsys_common.serving.id_range_torch import checked_ids, flag_rows

INPUT_NAMES = ("user", "item")
OUTPUT_NAME = "probability"
FORMATS = ("onnx", "ts-script", "ts-trace")
PLATFORMS = {"onnx": "onnxruntime_onnx", "ts-script": "pytorch_libtorch", "ts-trace": "pytorch_libtorch"}
MODEL_FILES = {"onnx": "model.onnx", "ts-script": "model.pt", "ts-trace": "model.pt"}
# Triton's pytorch_libtorch backend matches config inputs to the forward() argument names (``user``, ``item``);
# older releases wanted INPUT__0-style names (see the README's Deployment section).
ONNX_OPSET = 17


class ServingNCF(nn.Module):
    """``(user [B, 1] int64, item [B, 1] int64) -> probability [B, 1] float32`` around a trained NCF model.

    >>> from neumf import NeuMF
    >>> m = ServingNCF(NeuMF(4, 5, factors=2, layers=[4, 2], dropout=0.0))
    >>> m(torch.tensor([[0], [3]]), torch.tensor([[1], [4]])).shape
    torch.Size([2, 1])
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        # the table sizes, for the id range check inside the exported graph (``id_range_torch``): a row with an id
        # outside [0, num_users) / [0, num_items) scores NaN on any server instead of a wrapped or zero lookup
        self.register_buffer("num_users", torch.tensor(_table_rows(model, "user_embedding")), persistent=False)
        self.register_buffer("num_items", torch.tensor(_table_rows(model, "item_embedding")), persistent=False)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        user, user_ok = checked_ids(user.reshape(-1), self.num_users)
        item, item_ok = checked_ids(item.reshape(-1), self.num_items)
        logits = self.model(user, item)
        return flag_rows(torch.sigmoid(logits.float()).unsqueeze(1), user_ok & item_ok)


def _table_rows(model: nn.Module, suffix: str) -> int:
    """Rows of the model's ``*<suffix>`` embedding tables (NeuMF has two per side, GMF and MLP, of one size)."""
    rows = {m.num_embeddings for n, m in model.named_modules() if n.endswith(suffix) and isinstance(m, nn.Embedding)}
    if len(rows) != 1:
        raise ValueError(f"expected {suffix} tables of one size in the model, found sizes {sorted(rows)}")
    return rows.pop()


def serving_module(model: nn.Module) -> ServingNCF:
    """The eval-mode, CPU, gradient-free serving wrapper of ``model`` (export never sees dropout)."""
    module = ServingNCF(model).cpu().eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def example_inputs(num_users: int, num_items: int, rows: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """``rows`` random valid ``(user, item)`` pairs as the served inputs (int64 ``[rows, 1]``)."""
    rng = np.random.default_rng(seed)
    return {"user": rng.integers(0, num_users, size=(rows, 1), dtype=np.int64),
            "item": rng.integers(0, num_items, size=(rows, 1), dtype=np.int64)}


def export_onnx(module: ServingNCF, path: str, num_users: int, num_items: int, opset: int = ONNX_OPSET) -> None:
    """Write ``module`` as ONNX to ``path`` with a dynamic batch dimension (inputs ``user``, ``item``)."""
    sample = example_inputs(num_users, num_items, 4)
    args = (torch.from_numpy(sample["user"]), torch.from_numpy(sample["item"]))
    dynamic = {name: {0: "batch"} for name in (*INPUT_NAMES, OUTPUT_NAME)}
    with warnings.catch_warnings():
        # The TorchScript-based exporter: fast (well under a second here against ~4 s for dynamo=True) and it
        # gives the same graph (Gather, Mul, Concat, Gemm, Relu, Sigmoid) for these models.
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, path, input_names=list(INPUT_NAMES), output_names=[OUTPUT_NAME],
                          dynamic_axes=dynamic, opset_version=opset, dynamo=False)


def export_torchscript(module: ServingNCF, path: str, method: str, num_users: int, num_items: int) -> None:
    """Write ``module`` as TorchScript to ``path``: ``method`` ``"script"`` (torch.jit.script) or ``"trace"``."""
    if method not in ("script", "trace"):
        raise ValueError(f"unknown TorchScript method {method!r}; expected 'script' or 'trace'")
    with warnings.catch_warnings():
        # torch 2.13 marks torch.jit as deprecated in favour of torch.export, but TorchScript is what Triton's
        # pytorch_libtorch backend loads.
        warnings.simplefilter("ignore", DeprecationWarning)
        if method == "script":
            scripted = torch.jit.script(module)
        else:
            sample = example_inputs(num_users, num_items, 4)
            scripted = torch.jit.trace(module, (torch.from_numpy(sample["user"]), torch.from_numpy(sample["item"])))
    scripted.save(path)


def model_names(base: str, formats: Sequence[str]) -> Dict[str, str]:
    """Triton model name per format: ``<base>-onnx`` and ``<base>-ts`` (script and trace are one model)."""
    return {fmt: f"{base}-onnx" if fmt == "onnx" else f"{base}-ts" for fmt in formats}


def sidecar(config: Dict, fmt: str, checkpoint: Optional[str]) -> Dict:
    """``recsys_serving.json``: inputs with their id ranges (ids must be ``< max_id``), outputs, and the training
    configuration of the checkpoint."""
    return {"recipe": "PyTorch/NCF", "format": fmt,
            "inputs": {"user": {"dtype": "int64", "dims": [1], "max_id": int(config["num_users"])},
                       "item": {"dtype": "int64", "dims": [1], "max_id": int(config["num_items"])}},
            "outputs": [OUTPUT_NAME],
            "feature_spec": None, "created_by": "PyTorch/NCF/deployment/deployer.py",
            "model_config": dict(config), "checkpoint": os.path.abspath(checkpoint) if checkpoint else None}


def write_repository(model: nn.Module, config: Dict, repo_dir: str, formats: Sequence[str], *, base_name: str = "ncf",
                     version: int = 1, max_batch_size: int = 65536, dynamic_batching_delay_ms: float = 0.0,
                     instance_count: int = 1, instance_kind: str = "KIND_CPU", overwrite: bool = False,
                     checkpoint: Optional[str] = None, opset: int = ONNX_OPSET) -> List[str]:
    """Export ``model`` (configuration ``config``: num_users, num_items, ...) in each of ``formats`` into the Triton
    model repository ``repo_dir``; returns the final model directories.

    ``dynamic_batching_delay_ms > 0`` turns on Triton's dynamic batcher with that queue delay; ``0`` leaves each
    request a batch of its own. ``repo_dir`` is written atomically by ``recsys_common.serving.model_repository``:
    a non-empty one is refused unless ``overwrite`` (and then only files this tool wrote are replaced).
    """
    from recsys_common.serving.model_config import TensorSpec, model_config_text
    from recsys_common.serving.repository import model_repository

    if "ts-script" in formats and "ts-trace" in formats:
        raise ValueError("--ts-script and --ts-trace both write the TorchScript model: choose one")
    if max_batch_size <= 0:
        raise ValueError(f"--triton-max-batch-size must be > 0, got {max_batch_size}")
    if instance_count <= 0:
        raise ValueError(f"--triton-engine-count must be > 0, got {instance_count}")
    if dynamic_batching_delay_ms < 0:
        raise ValueError(f"--triton-dyn-batching-delay must be >= 0 ms, got {dynamic_batching_delay_ms}")
    module = serving_module(model)
    inputs = [TensorSpec(name, "int64", [1]) for name in INPUT_NAMES]
    outputs = [TensorSpec(OUTPUT_NAME, "float32", [1])]
    delay_us = int(round(dynamic_batching_delay_ms * 1000)) if dynamic_batching_delay_ms > 0 else None
    names = model_names(base_name, formats)
    written = []
    with model_repository(repo_dir, overwrite=overwrite, tool="PyTorch/NCF/deployment/deployer.py") as repo:
        for fmt in formats:
            text = model_config_text(names[fmt], PLATFORMS[fmt], inputs, outputs, max_batch_size,
                                     dynamic_batching_delay_us=delay_us, instance_count=instance_count,
                                     instance_kind=instance_kind)
            version_dir = repo.add_model(names[fmt], text, version=version, sidecar=sidecar(config, fmt, checkpoint))
            path = os.path.join(version_dir, MODEL_FILES[fmt])
            if fmt == "onnx":
                export_onnx(module, path, config["num_users"], config["num_items"], opset)
            else:
                export_torchscript(module, path, fmt[len("ts-"):], config["num_users"], config["num_items"])
            written.append(os.path.join(repo_dir, names[fmt]))
    return written
