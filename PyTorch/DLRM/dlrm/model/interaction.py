"""Feature interactions: how the bottom MLP output and the embeddings meet before the top MLP.

Let ``x`` be the bottom MLP output ``[B, d]`` and ``e_1..e_T`` the embeddings ``[B, T, d]``.

* **dot** (DLRM paper, eq. 2): stack ``Z = [x, e_1, ..., e_T]`` (``[B, T+1, d]``), take all pairwise dot products
  ``Z Z^T`` (``[B, T+1, T+1]``), keep the strictly lower triangle (``i > j``, ``(T+1)T/2`` values; with
  self-interaction the diagonal too, ``(T+1)(T+2)/2``) and concatenate with ``x``:
  ``out = [x, <z_i, z_j> for i > j]``, width ``d + (T+1)T/2``.
* **cat**: ``out = [x, e_1, ..., e_T]`` flattened, width ``d (T+1)``; the bottom MLP output may then have any width.
* **dcn** (DCN V2, Wang et al. 2021, eq. 2, low-rank form; the MLPerf DLRM-DCNv2 interaction): ``x_0 = [x, e_1, ...,
  e_T]`` flattened (width ``w = d_x + T d``), then ``L`` cross layers, each crossing with the same ``x_0``:
  ``x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l`` (``*`` element-wise; ``V_l``: ``w -> r`` without bias, ``U_l``:
  ``r -> w``, ``b_l``: ``[w]``); ``out = x_L``, width ``w``. The same layer as the TF2 recipe's
  ``dlrm_dcnv2.model.dcn.CrossLayer`` (a test checks both on the same weights) and TorchRec's ``LowRankCrossNet``.

    >>> import torch
    >>> dot = DotInteraction(num_embeddings=26, embedding_dim=128)
    >>> dot(torch.zeros(2, 128), torch.zeros(2, 26, 128)).shape
    torch.Size([2, 479])
"""
from __future__ import annotations

import torch
from torch import nn


class DotInteraction(nn.Module):
    """Pairwise dot products of ``[bottom, emb_1..emb_T]`` concatenated with the bottom MLP output."""

    def __init__(self, num_embeddings: int, embedding_dim: int, self_interaction: bool = False):
        super().__init__()
        n = num_embeddings + 1
        offset = 0 if self_interaction else -1
        rows, cols = torch.tril_indices(n, n, offset=offset)
        # Index buffers are not parameters and not saved in checkpoints (persistent=False): they derive from the config.
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.embedding_dim = embedding_dim
        self.output_width = embedding_dim + rows.numel()
        # Pad the T+1 stacked vectors with zero rows to a multiple of this before the batched matmul: on GPUs, tensor
        # cores need matrix sides that are multiples of 8 (27 -> 32). The zero rows add only zero products that are
        # never gathered, so the output is the same. 1 = no padding (CPU); set to 8 on CUDA by the training code.
        self.pad_multiple = 1

    def forward(self, bottom: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        if bottom.shape[-1] != embeddings.shape[-1]:
            raise ValueError(f"dot interaction needs the bottom MLP output width ({bottom.shape[-1]}) to equal the "
                             f"embedding dimension ({embeddings.shape[-1]})")
        # Under autocast the bottom MLP output may be bf16/fp16 while embeddings stay fp32: compute in a common type.
        embeddings = embeddings.to(bottom.dtype)
        stacked = torch.cat([bottom.unsqueeze(1), embeddings], dim=1)      # [B, T+1, d]
        padding = (-stacked.shape[1]) % self.pad_multiple
        if padding:
            stacked = torch.nn.functional.pad(stacked, [0, 0, 0, padding])  # [B, T+1+padding, d], zero rows
        gram = torch.bmm(stacked, stacked.transpose(1, 2))                  # [B, T+1, T+1]
        pairs = gram[:, self.rows, self.cols]                               # [B, (T+1)T/2]
        return torch.cat([bottom, pairs], dim=1)


class CatInteraction(nn.Module):
    """Concatenation ``[bottom, emb_1, ..., emb_T]`` flattened to ``[B, d_bottom + T d]``."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bottom_width: int):
        super().__init__()
        self.output_width = bottom_width + num_embeddings * embedding_dim

    def forward(self, bottom: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        embeddings = embeddings.to(bottom.dtype)
        return torch.cat([bottom, embeddings.flatten(1)], dim=1)


class LowRankCrossInteraction(nn.Module):
    """DCN V2's low-rank cross network over ``x_0 = [bottom, emb_1, ..., emb_T]`` flattened.

    Args:
        num_embeddings: ``T``, the number of embedding tables.
        embedding_dim: ``d``, the width of each embedding.
        bottom_width: ``d_x``, the width of the bottom MLP output (any).
        num_layers: ``L``, the cross layers (MLPerf: 3).
        low_rank: ``r``, the rank of each layer's ``U V`` (MLPerf: 512).

    Shapes: ``bottom [B, d_x]``, ``embeddings [B, T, d]`` -> ``[B, d_x + T d]``.

    Initialisation as TorchRec's ``LowRankCrossNet`` (which MLPerf's reference trains): Xavier-normal ``U`` and
    ``V``, zero ``b``.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, bottom_width: int, num_layers: int = 3,
                 low_rank: int = 512):
        super().__init__()
        if num_layers < 1 or low_rank < 1:
            raise ValueError(f"--dcn_num_layers and --dcn_low_rank_dim must be positive, got {num_layers} and "
                             f"{low_rank}")
        width = bottom_width + num_embeddings * embedding_dim
        self.output_width = width
        self.down = nn.ModuleList(nn.Linear(width, low_rank, bias=False) for _ in range(num_layers))   # V_l
        self.up = nn.ModuleList(nn.Linear(low_rank, width) for _ in range(num_layers))                 # U_l, b_l
        for v, u in zip(self.down, self.up):
            nn.init.xavier_normal_(v.weight)
            nn.init.xavier_normal_(u.weight)
            nn.init.zeros_(u.bias)

    def forward(self, bottom: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        embeddings = embeddings.to(bottom.dtype)
        x0 = torch.cat([bottom, embeddings.flatten(1)], dim=1)             # [B, w]
        x = x0
        for v, u in zip(self.down, self.up):
            x = x0 * u(v(x)) + x                                            # x_{l+1} = x_0 * (U (V x_l) + b) + x_l
        return x


def make_interaction(op: str, num_embeddings: int, embedding_dim: int, bottom_width: int,
                     self_interaction: bool = False, dcn_num_layers: int = 3, dcn_low_rank_dim: int = 512
                     ) -> nn.Module:
    if op == "dot":
        if bottom_width != embedding_dim:
            raise ValueError(f"--interaction_op dot needs the last --bottom_mlp_sizes value ({bottom_width}) to equal "
                             f"--embedding_dim ({embedding_dim})")
        return DotInteraction(num_embeddings, embedding_dim, self_interaction)
    if op == "cat":
        return CatInteraction(num_embeddings, embedding_dim, bottom_width)
    if op == "dcn":
        return LowRankCrossInteraction(num_embeddings, embedding_dim, bottom_width, dcn_num_layers, dcn_low_rank_dim)
    raise ValueError(f"--interaction_op must be 'dot', 'cat' or 'dcn', got {op!r}")
