"""The DLRM network: bottom MLP + embeddings -> interaction -> top MLP -> one logit.

    x      = BottomMLP(numerical)                         [B, d]
    e_t    = Embedding_t(categorical[:, t])   t = 1..T    [B, T, d]
    z      = Interaction(x, e)                            [B, w]   (dot: [x, <z_i, z_j>_{i>j}]; cat: [x, e];
                                                                    dcn: L low-rank cross layers over [x, e])
    logit  = TopMLP(z)                                    [B]
    loss   = BCEWithLogits(logit, label)

With ``hash_indices`` every id is first reduced modulo its table size (``id % rows``), which lets tables be capped
with ``--max_table_size``.

Multi-hot features (``hotness[t] > 1``): ``categorical`` is ``[B, sum(hotness)]``, table ``t`` owning ``hotness[t]``
columns of ids padded with -1, and ``e_t`` is the sum of the rows of its ids (sum pooling,
:mod:`dlrm.model.embeddings`); the rest of the network is unchanged.

    >>> import torch
    >>> from dlrm.model.embeddings import MultiTableEmbeddings
    >>> model = DLRM(13, [100, 50], 16, [32, 16], [32, 1], embeddings=MultiTableEmbeddings([100, 50], 16))
    >>> model(torch.zeros(4, 13), torch.zeros(4, 2, dtype=torch.long)).shape
    torch.Size([4])
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from .interaction import make_interaction
from .mlp import BottomMLP, TopMLP


class DLRM(nn.Module):
    """Args:
        num_numerical_features: width of the dense input (13 for Criteo).
        table_sizes: rows of each embedding table, in categorical channel order.
        embedding_dim: embedding width ``d``.
        bottom_mlp_sizes / top_mlp_sizes: layer widths (the top MLP ends with 1).
        embeddings: a module mapping ``[B, T]`` ids to ``[B, T, d]`` (see :mod:`dlrm.model.embeddings`).
        interaction_op: ``"dot"``, ``"cat"`` or ``"dcn"``; ``self_interaction`` keeps ``<z_i, z_i>`` in the dot
            products; ``dcn_num_layers`` / ``dcn_low_rank_dim``: the cross layers and their rank (``"dcn"``).
        hash_indices: apply ``id % table_size`` before the lookup (padding -1 of multi-hot columns is kept).
        hotness: ids per row of each table (default 1 each: single-hot).
    """

    def __init__(self, num_numerical_features: int, table_sizes: Sequence[int], embedding_dim: int,
                 bottom_mlp_sizes: Sequence[int], top_mlp_sizes: Sequence[int], embeddings: nn.Module,
                 interaction_op: str = "dot", self_interaction: bool = False, hash_indices: bool = False,
                 hotness: Optional[Sequence[int]] = None, dcn_num_layers: int = 3, dcn_low_rank_dim: int = 512):
        super().__init__()
        if num_numerical_features < 1:
            raise ValueError("DLRM needs at least one numerical feature for its bottom MLP")
        self.table_sizes = [int(n) for n in table_sizes]
        self.hash_indices = hash_indices
        self.bottom_mlp = BottomMLP(num_numerical_features, bottom_mlp_sizes)
        self.embeddings = embeddings
        self.interaction = make_interaction(interaction_op, len(self.table_sizes), embedding_dim,
                                            self.bottom_mlp.out_features, self_interaction, dcn_num_layers,
                                            dcn_low_rank_dim)
        self.top_mlp = TopMLP(self.interaction.output_width, top_mlp_sizes)
        self.hotness = [1] * len(self.table_sizes) if hotness is None else [int(h) for h in hotness]
        self.multi_hot = any(h > 1 for h in self.hotness)
        # one entry per id column: the size of the column's table
        self.register_buffer("_sizes", torch.tensor([n for n, h in zip(self.table_sizes, self.hotness)
                                                     for _ in range(h)], dtype=torch.int64), persistent=False)

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        if self.hash_indices:
            hashed = torch.remainder(categorical, self._sizes.to(categorical.device))
            categorical = torch.where(categorical >= 0, hashed, categorical) if self.multi_hot else hashed
        bottom = self.bottom_mlp(numerical)
        embedded = self.embeddings(categorical)
        return self.top_mlp(self.interaction(bottom, embedded)).squeeze(1)
