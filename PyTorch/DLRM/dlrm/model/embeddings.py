"""Embedding tables: one per categorical feature, looked up for a batch of single-hot or multi-hot ids.

Three implementations with one interface, ``forward(categorical [B, H] int64) -> [B, T, D] float32``:

* :class:`TorchRecEmbeddings`: a TorchRec ``EmbeddingBagCollection``. Wrapped by ``DistributedModelParallel``
  (:mod:`dlrm.model.parallel`) its tables become FBGEMM table-batched embeddings (one fused kernel for all tables)
  with the optimizer fused into the backward pass, sharded table-wise or row-wise over the processes. TorchRec is
  imported only when this class is built.
* :class:`MultiTableEmbeddings`: one plain ``torch.nn.EmbeddingBag`` per table, optionally with sparse gradients;
  needs nothing but PyTorch (any 2.x), kept for comparison and for machines without TorchRec/FBGEMM.

All initialise table ``t`` uniformly in ``[-sqrt(1/n_t), sqrt(1/n_t)]`` (``n_t`` rows), as the DLRM paper's code and
TorchRec do.

Multi-hot features (``hotness``: ids per row of each table, default 1 each): the id matrix has ``H = sum(hotness)``
columns, table ``t`` owning ``hotness[t]`` consecutive ones, -1 padding after its ids; the table's vector of a row is
the **sum** of the rows of its ids (sum pooling, as the TF2 DLRM recipe and TorchRec's ``EmbeddingBagCollection``;
no id gives zeros). The ids go to the lookups as bags (values + offsets), never as padded gathers. With every
hotness 1 (Criteo) ``H = T`` and the single-hot code runs unchanged.

    >>> import torch
    >>> emb = MultiTableEmbeddings([10, 20], embedding_dim=4)
    >>> emb(torch.tensor([[1, 2], [9, 19]])).shape
    torch.Size([2, 2, 4])
    >>> bags = MultiTableEmbeddings([10, 20], embedding_dim=4, hotness=[1, 3])
    >>> bags(torch.tensor([[1, 2, 5, -1], [9, -1, -1, -1]])).shape     # table 1: bags {2, 5} and {}
    torch.Size([2, 2, 4])
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

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


class _Hotness:
    """Column layout of a multi-hot id matrix: which table each column belongs to."""

    def __init__(self, hotness: Optional[Sequence[int]], num_tables: int):
        self.hotness = [1] * num_tables if hotness is None else [int(h) for h in hotness]
        if len(self.hotness) != num_tables or min(self.hotness, default=1) < 1:
            raise ValueError(f"hotness must hold one positive count per table ({num_tables}), got {hotness}")
        self.multi_hot = any(h > 1 for h in self.hotness)
        self.width = sum(self.hotness)
        self.bounds = []
        col = 0
        for h in self.hotness:
            self.bounds.append((col, col + h))
            col += h
        self.column_table = torch.tensor([t for t, h in enumerate(self.hotness) for _ in range(h)], dtype=torch.int64)

    def check_width(self, categorical: torch.Tensor) -> None:
        if categorical.dim() != 2 or categorical.shape[1] != self.width:
            raise ValueError(f"multi-hot ids must be [batch, {self.width} id columns] (hotness {self.hotness}), "
                             f"got {list(categorical.shape)}")


def bag_offsets(ids: torch.Tensor):
    """Padded ids ``[B, h]`` (-1 = none) -> ``(values, offsets)`` for ``nn.EmbeddingBag``: the ids of every row in
    order and where each row's bag starts."""
    mask = ids >= 0
    lengths = mask.sum(1)
    offsets = torch.zeros_like(lengths)
    offsets[1:] = lengths.cumsum(0)[:-1]
    return ids[mask], offsets


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
        hotness: ids per row of each table (default 1 each); see the module docstring.
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dim: int, sparse: bool = True,
                 device: torch.device = torch.device("cpu"), hotness: Optional[Sequence[int]] = None):
        super().__init__()
        self.table_sizes = [int(n) for n in table_sizes]
        self.embedding_dim = embedding_dim
        self.layout = _Hotness(hotness, len(self.table_sizes))
        self.hotness = self.layout.hotness
        self.tables = nn.ModuleList()
        for n in self.table_sizes:
            table = nn.EmbeddingBag(n, embedding_dim, mode="sum", sparse=sparse, device=device)
            uniform_table_init_(table.weight)
            self.tables.append(table)

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        if not self.tables:   # numerical features only
            return torch.zeros(categorical.shape[0], 0, self.embedding_dim, device=categorical.device)
        if not self.layout.multi_hot:
            columns = [table(categorical[:, i:i + 1]) for i, table in enumerate(self.tables)]
            return torch.stack(columns, dim=1)
        self.layout.check_width(categorical)
        columns = []
        for (lo, hi), table in zip(self.layout.bounds, self.tables):
            ids = categorical[:, lo:hi]
            columns.append(table(ids) if hi - lo == 1 else table(*bag_offsets(ids)))
        return torch.stack(columns, dim=1)

    def table_weights(self) -> List[torch.Tensor]:
        return [t.weight for t in self.tables]


class _LookupWithFusedSGD(torch.autograd.Function):
    """Rows of ``flat`` at ``ids`` in the forward pass; in the backward pass ``flat[ids] -= lr * grad`` in place.

    The update happens inside the backward pass (as FBGEMM's fused optimizers do), so no gradient tensor, sparse or
    dense, is ever built for the tables and no optimizer walks them afterwards. ``anchor`` is a parameter that
    requires grad, passed only so that autograd calls this backward; it receives no gradient.
    """

    @staticmethod
    def forward(ctx, flat: torch.Tensor, ids: torch.Tensor, anchor: torch.Tensor, owner: "FusedSGDTableEmbeddings"):
        ctx.save_for_backward(ids)
        ctx.flat, ctx.owner = flat, owner
        return flat.index_select(0, ids)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        owner = ctx.owner
        grad = grad.to(ctx.flat.dtype)
        multiplier = owner.grad_multiplier
        if not (isinstance(multiplier, float) and multiplier == 1.0):  # float16 loss scale: unscale, drop overflows
            grad = torch.nan_to_num(grad * multiplier, nan=0.0, posinf=0.0, neginf=0.0)
        # Both sum the rows of repeated ids first, exactly as SGD on the summed sparse gradient would. On CPU,
        # index_add_ walks the ids one row at a time on one thread (36 % of a one-thread Kaggle-shape bf16 step);
        # scatter_add_ with the ids expanded over the columns takes PyTorch's sorted, multi-threaded path for exactly
        # this layout: 4-5x faster at dim 16, 2-3x at dim 128 (measured when the fused-SGD tables were written).
        if ctx.flat.is_cuda:
            ctx.flat.index_add_(0, ids, grad, alpha=-owner.lr)
        else:
            ctx.flat.scatter_add_(0, ids.unsqueeze(1).expand(-1, ctx.flat.shape[1]), grad * -owner.lr)
        return None, None, None, None


class FusedSGDTableEmbeddings(MultiTableEmbeddings):
    """:class:`MultiTableEmbeddings` whose tables live in one contiguous ``[sum(rows), d]`` buffer, looked up with
    one gather and updated by SGD inside the backward pass (one ``index_add_`` for all tables).

    Each ``tables.{i}.weight`` parameter is a view of its rows of the shared buffer, so ``state_dict`` keys, checkpoints
    and serving stay those of :class:`MultiTableEmbeddings` (and loading a state dict writes into the buffer). The
    learning rate used by the backward is ``self.lr``, set before each step by the training loop (the table optimizer
    then holds no gradient and does nothing); ``grad_multiplier`` scales the incoming gradient (see
    :class:`ScaleGradient`). For one process with SGD: data-parallel replicas would need their gradients all-reduced
    first, so they use the plain class. Not scriptable (a custom autograd function): export the plain class.

        >>> emb = FusedSGDTableEmbeddings([10, 20], embedding_dim=4)
        >>> emb.lr = 0.1
        >>> emb(torch.tensor([[1, 2], [9, 19]])).shape
        torch.Size([2, 2, 4])
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dim: int, device: torch.device = torch.device("cpu"),
                 hotness: Optional[Sequence[int]] = None):
        super().__init__(table_sizes, embedding_dim, sparse=True, device=device, hotness=hotness)
        if not self.table_sizes:
            raise ValueError("FusedSGDTableEmbeddings needs at least one table")
        flat = torch.empty(sum(self.table_sizes), embedding_dim, device=device)
        offset = 0
        for table in self.tables:
            rows = table.weight.shape[0]
            flat[offset:offset + rows].copy_(table.weight.detach())
            table.weight = nn.Parameter(flat[offset:offset + rows])  # a view: the buffer is the storage
            offset += rows
        self._flat = flat  # not a buffer: the per-table views are what the state dict holds
        self.register_buffer("_offsets", torch.tensor([0] + self.table_sizes[:-1], dtype=torch.int64,
                                                      device=device).cumsum(0), persistent=False)
        self.register_buffer("_sizes", torch.tensor(self.table_sizes, dtype=torch.int64, device=device),
                             persistent=False)
        # multi-hot: table of each id column, its size, and whether it may hold -1 padding (hotness > 1)
        table_of = self.layout.column_table.to(device)
        self.register_buffer("_column_table", table_of, persistent=False)
        self.register_buffer("_column_sizes", self._sizes[table_of], persistent=False)
        self.register_buffer("_column_offsets", self._offsets[table_of], persistent=False)
        self.register_buffer("_column_padded", torch.tensor([h > 1 for h in self.hotness for _ in range(h)],
                                                            dtype=torch.bool, device=device), persistent=False)
        self.lr = 0.0
        self.grad_multiplier = 1.0

    def _check_views(self) -> None:
        if self.tables[0].weight.data_ptr() != self._flat.data_ptr():
            raise RuntimeError("FusedSGDTableEmbeddings: its table parameters were replaced (e.g. by .to(device) or "
                               "load_state_dict(assign=True)); build the module on its device instead")

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        self._check_views()
        if self.layout.multi_hot:
            return self._forward_bags(categorical)
        batch, num_tables = categorical.shape
        if not categorical.is_cuda:  # an id past its table would silently read the next table's rows (no sync on CPU)
            low, high = torch.aminmax(categorical, dim=0)  # one pass over the ids
            if bool(((low < 0) | (high >= self._sizes)).any()):
                bad = (categorical < 0) | (categorical >= self._sizes)
                column = int(bad.any(0).nonzero()[0])
                raise IndexError(f"categorical feature {column}: id {int(categorical[:, column][bad[:, column]][0])} "
                                 f"outside its table of {self.table_sizes[column]} rows")
        ids = (categorical + self._offsets).reshape(-1)     # row of each id in the shared buffer, sample-major
        anchor = self.tables[0].weight
        if torch.is_grad_enabled() and anchor.requires_grad:
            rows = _LookupWithFusedSGD.apply(self._flat, ids, anchor, self)
        else:
            rows = self._flat.index_select(0, ids)
        return rows.view(batch, num_tables, self.embedding_dim)

    def _forward_bags(self, categorical: torch.Tensor) -> torch.Tensor:
        """Multi-hot: one gather of every present id (fused SGD in its backward), then a sum per (row, table) bag."""
        self.layout.check_width(categorical)
        batch = categorical.shape[0]
        num_tables = len(self.table_sizes)
        if not categorical.is_cuda:
            bad = (categorical >= self._column_sizes) | (categorical < torch.where(self._column_padded, -1, 0))
            if bool(bad.any()):
                column = int(bad.any(0).nonzero()[0])
                table = int(self._column_table[column])
                raise IndexError(f"categorical feature {table}: id {int(categorical[:, column][bad[:, column]][0])} "
                                 f"outside its table of {self.table_sizes[table]} rows")
        mask = categorical >= 0
        ids = (categorical + self._column_offsets)[mask]                     # rows in the shared buffer, row-major
        bags = (torch.arange(batch, device=categorical.device)[:, None] * num_tables + self._column_table)[mask]
        anchor = self.tables[0].weight
        if torch.is_grad_enabled() and anchor.requires_grad:
            rows = _LookupWithFusedSGD.apply(self._flat, ids, anchor, self)
        else:
            rows = self._flat.index_select(0, ids)
        pooled = rows.new_zeros(batch * num_tables, self.embedding_dim).index_add(0, bags, rows)   # sum pooling
        return pooled.view(batch, num_tables, self.embedding_dim)


class TorchRecEmbeddings(nn.Module):
    """A TorchRec ``EmbeddingBagCollection`` with one table per feature, fed from a dense ``[B, T]`` id matrix.

    The collection is created on the ``meta`` device: ``DistributedModelParallel`` allocates each shard on the
    process that owns it and initialises it with the tables' ``init_fn``, so no process ever holds every table.

    ``grad_multiplier`` scales the gradient reaching the tables (see :class:`ScaleGradient`).
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dim: int, feature_names: Sequence[str],
                 hotness: Optional[Sequence[int]] = None):
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig  # lazy: TorchRec is optional
        self.table_sizes = [int(n) for n in table_sizes]
        self.embedding_dim = embedding_dim
        self.layout = _Hotness(hotness, len(self.table_sizes))
        self.hotness = self.layout.hotness
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
        batch = categorical.shape[0]
        num_features = len(self.table_sizes)
        if not self.layout.multi_hot:
            kjt = KeyedJaggedTensor(
                keys=self.feature_names,
                values=categorical.t().reshape(-1),  # feature-major: all ids of feature 0, then feature 1, ...
                lengths=torch.ones(batch * num_features, dtype=torch.int32, device=categorical.device),
            )
        else:  # jagged bags: per feature, the present ids of every row and how many each row has
            self.layout.check_width(categorical)
            values, lengths = [], []
            for lo, hi in self.layout.bounds:
                ids = categorical[:, lo:hi]
                mask = ids >= 0
                values.append(ids[mask])
                lengths.append(mask.sum(1, dtype=torch.int32))
            kjt = KeyedJaggedTensor(keys=self.feature_names, values=torch.cat(values), lengths=torch.cat(lengths))
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
