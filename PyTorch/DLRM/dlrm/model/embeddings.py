"""Embedding tables: one per categorical feature, looked up for a batch of single-hot ids.

Two implementations with one interface, ``forward(categorical [B, T] int64) -> [B, T, D] float32``:

* :class:`TorchRecEmbeddings`: a TorchRec ``EmbeddingBagCollection``. Wrapped by ``DistributedModelParallel``
  (:mod:`dlrm.model.parallel`) its tables become FBGEMM table-batched embeddings (one fused kernel for all tables)
  with the optimizer fused into the backward pass, sharded table-wise or row-wise over the processes. TorchRec is
  imported only when this class is built.
* :class:`MultiTableEmbeddings`: one plain ``torch.nn.EmbeddingBag`` per table, optionally with sparse gradients;
  needs nothing but PyTorch (any 2.x), kept for comparison and for machines without TorchRec/FBGEMM.

Both initialise table ``t`` uniformly in ``[-sqrt(1/n_t), sqrt(1/n_t)]`` (``n_t`` rows), as the DLRM paper's code and
TorchRec do.

    >>> import torch
    >>> emb = MultiTableEmbeddings([10, 20], embedding_dim=4)
    >>> emb(torch.tensor([[1, 2], [9, 19]])).shape
    torch.Size([2, 2, 4])
"""
from __future__ import annotations

import math
from typing import List, Sequence

import torch
from torch import nn


class ScaleGradient(torch.autograd.Function):
    """Identity in the forward pass; multiplies the gradient by ``factor`` in the backward pass.

    Used on the pooled embeddings of the TorchRec path, whose optimizer runs inside the backward pass and so never
    sees the loss scaler's unscaling: ``factor = 1 / loss_scale`` makes the embedding update the unscaled one.
    Non-finite gradients (an fp16 overflow, which the loss scaler would skip for the MLPs) are zeroed so they never
    reach the tables.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad * ctx.factor
        return torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0), None


def uniform_table_init_(weight: torch.Tensor) -> None:
    bound = math.sqrt(1.0 / weight.shape[0])
    with torch.no_grad():
        weight.uniform_(-bound, bound)


class MultiTableEmbeddings(nn.Module):
    """One ``nn.EmbeddingBag(mode="sum")`` per categorical feature (bags of one id = a plain lookup).

    Args:
        table_sizes: rows of each table.
        embedding_dim: columns of every table.
        sparse: produce sparse gradients (for ``torch.optim.SGD``/``SparseAdam``; cheaper for big tables on one
            process). Data-parallel training over NCCL needs dense gradients.
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dim: int, sparse: bool = True,
                 device: torch.device = torch.device("cpu")):
        super().__init__()
        self.table_sizes = [int(n) for n in table_sizes]
        self.embedding_dim = embedding_dim
        self.tables = nn.ModuleList()
        for n in self.table_sizes:
            table = nn.EmbeddingBag(n, embedding_dim, mode="sum", sparse=sparse, device=device)
            uniform_table_init_(table.weight)
            self.tables.append(table)

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        columns = [table(categorical[:, i:i + 1]) for i, table in enumerate(self.tables)]
        return torch.stack(columns, dim=1)

    def table_weights(self) -> List[torch.Tensor]:
        return [t.weight for t in self.tables]


class TorchRecEmbeddings(nn.Module):
    """A TorchRec ``EmbeddingBagCollection`` with one table per feature, fed from a dense ``[B, T]`` id matrix.

    The collection is created on the ``meta`` device: ``DistributedModelParallel`` allocates each shard on the
    process that owns it and initialises it with the tables' ``init_fn``, so no process ever holds every table.

    ``grad_multiplier`` scales the gradient reaching the tables (see :class:`ScaleGradient`).
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dim: int, feature_names: Sequence[str]):
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig  # lazy: TorchRec is optional
        self.table_sizes = [int(n) for n in table_sizes]
        self.embedding_dim = embedding_dim
        self.feature_names = [table_key(f) for f in feature_names]
        tables = [
            EmbeddingBagConfig(name=f"t_{name}", embedding_dim=embedding_dim, num_embeddings=n,
                               feature_names=[name])  # TorchRec's default init: U(-sqrt(1/n), sqrt(1/n))
            for name, n in zip(self.feature_names, self.table_sizes)
        ]
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.grad_multiplier = 1.0

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        from torchrec import KeyedJaggedTensor
        batch, num_features = categorical.shape
        kjt = KeyedJaggedTensor(
            keys=self.feature_names,
            values=categorical.t().reshape(-1),  # feature-major: all ids of feature 0, then feature 1, ...
            lengths=torch.ones(batch * num_features, dtype=torch.int32, device=categorical.device),
        )
        keyed = self.ebc(kjt)
        if list(keyed.keys()) == self.feature_names:
            pooled = keyed.values()  # [B, T * D]
        else:  # a sharded collection returns features grouped by shard: restore the model's feature order
            by_name = keyed.to_dict()
            pooled = torch.cat([by_name[name] for name in self.feature_names], dim=1)
        if not (isinstance(self.grad_multiplier, float) and self.grad_multiplier == 1.0):
            pooled = ScaleGradient.apply(pooled, self.grad_multiplier)
        return pooled.view(batch, num_features, self.embedding_dim)


def table_key(feature_name: str) -> str:
    """A TorchRec-safe key for a feature name (NVIDIA's names contain dots: ``cat_0.bin`` -> ``cat_0_bin``)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in feature_name)


def torchrec_available() -> bool:
    """True when TorchRec and FBGEMM import (they are optional: the plain path needs only PyTorch)."""
    try:
        import fbgemm_gpu  # noqa: F401
        import torchrec  # noqa: F401
    except Exception:  # ImportError, or an FBGEMM build that does not match this torch (undefined symbol)
        return False
    return True
