"""NCF for inference servers: the served module and its sidecar; ``recsys_common.serving.torch_export`` (shared with
PyTorch DLRM) exports them into the Triton model repository.

The served model takes two INT64 inputs ``user`` and ``item`` of shape ``[B, 1]`` (dataset ids, ``0 <= id <
num_users`` / ``num_items``) and returns ``probability`` FP32 ``[B, 1]`` = ``sigmoid(logit)`` of the trained
model (:class:`ServingNCF`), NaN for a row whose id is out of range (the check is in the exported graph, so every
server flags it; see ``recsys_common.serving.id_range_torch``). The ``[B, 1]`` shapes are Triton's convention for one value per row: with
``max_batch_size > 0`` the config lists ``dims: [1]`` (the batch dimension is implicit), and no ``reshape`` is
needed, so the same config serves the ONNX and the TorchScript file.

Triton repository written by ``deployer.py`` through ``torch_export.write_repository`` (which builds and validates the
config)::

    <repo>/<name>-onnx/config.pbtxt     platform onnxruntime_onnx
    <repo>/<name>-onnx/1/model.onnx
    <repo>/<name>-ts/config.pbtxt       platform pytorch_libtorch
    <repo>/<name>-ts/1/model.pt         torch.jit.script (or trace) of the same module
    <repo>/<name>-*/recsys_serving.json inputs with their id ranges (max_id), the training configuration

No argparse here: the deployer passes explicit values.
"""
from __future__ import annotations

import copy
import os
from typing import Dict, Optional

import numpy as np
import torch
from torch import nn

from recsys_common.serving.id_range_torch import checked_ids, flag_rows
from recsys_common.serving.rows import random_rows

# Triton's pytorch_libtorch backend matches config inputs to the forward() argument names (``user``, ``item``);
# older releases wanted INPUT__0-style names (see the README's Deployment section).
INPUT_NAMES = ("user", "item")
OUTPUT_NAME = "probability"


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


def _without_dropout(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every dropout layer (``nn.Dropout`` or a recipe's own ``*Dropout`` class) replaced by
    ``nn.Identity``: what dropout is in eval mode, and what ``torch.jit.script`` can always compile (a dropout's
    training path need not be TorchScript-compatible). The caller's model is left as it is."""
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Dropout) or type(child).__name__.endswith("Dropout"):
                setattr(parent, name, nn.Identity())
    return model


def serving_module(model: nn.Module) -> ServingNCF:
    """The eval-mode, CPU, gradient-free serving wrapper of ``model`` (export never sees dropout)."""
    module = ServingNCF(_without_dropout(model)).cpu().eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def sidecar(config: Dict, checkpoint: Optional[str]) -> Dict:
    """``recsys_serving.json`` (``torch_export.write_repository`` adds ``format``): inputs with their id ranges (ids
    must be ``< max_id``), outputs, and the training configuration of the checkpoint."""
    return {"recipe": "PyTorch/NCF",
            "inputs": {"user": {"dtype": "int64", "dims": [1], "max_id": int(config["num_users"])},
                       "item": {"dtype": "int64", "dims": [1], "max_id": int(config["num_items"])}},
            "outputs": [OUTPUT_NAME],
            "feature_spec": None,
            "model_config": dict(config), "checkpoint": os.path.abspath(checkpoint) if checkpoint else None}


def example_inputs(num_users: int, num_items: int, rows: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """``rows`` random valid ``(user, item)`` pairs as the served inputs (int64 ``[rows, 1]``; the sidecar's inputs
    through ``recsys_common.serving.rows.random_rows``)."""
    return random_rows(sidecar({"num_users": num_users, "num_items": num_items}, None)["inputs"], rows, seed)
