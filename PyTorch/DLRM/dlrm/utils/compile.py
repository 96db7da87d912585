"""``torch.compile`` of DLRM's dense part for training (``--compile``), applied as a wrapper, never in the modules.

The bottom MLP, the interaction and the top MLP are compiled in place with ``nn.Module.compile``: their classes,
``state_dict`` keys and eager ``forward`` stay as they are (so TorchScript/ONNX export of a fresh model is unaffected),
only calls through these instances run the compiled graph. The embeddings stay eager: their lookup and fused update
are one gather and one ``index_add_`` already, and TorchRec's sharded collection is not traceable. Under bfloat16
autocast the compiled graph fuses the per-step weight casts, bias, ReLU and the interaction's gather into few kernels.

    >>> import torch
    >>> from dlrm.model import DLRM, MultiTableEmbeddings
    >>> model = DLRM(13, [10], 4, [8, 4], [8, 1], embeddings=MultiTableEmbeddings([10], 4))
    >>> compile_dense(model) is model
    True
"""
from __future__ import annotations

from torch import nn


def compile_dense(core: nn.Module, dynamic: bool = False) -> nn.Module:
    """Compile ``core.bottom_mlp``, ``core.interaction`` and ``core.top_mlp`` in place; returns ``core``.

    ``dynamic=False``: one graph per batch shape (the training batch, the last partial batch, the test batch), each
    compiled on its first call (tens of seconds on 2 cores with an empty cache; cached runs take a few seconds).
    """
    for part in (core.bottom_mlp, core.interaction, core.top_mlp):
        part.compile(dynamic=dynamic)
    return core
