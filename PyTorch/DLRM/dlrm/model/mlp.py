"""Multi-layer perceptrons: the bottom MLP (dense features) and the top MLP ("over arch", one logit).

DLRM's MLPs are stacks of ``Linear -> ReLU``. The top MLP's last layer has no activation: it outputs the click logit,
which ``BCEWithLogitsLoss`` turns into a loss and ``sigmoid`` into a probability.

Initialisation follows the DLRM paper's code: weights ``N(0, sqrt(2 / (fan_in + fan_out)))``, biases
``N(0, sqrt(1 / fan_out))``.

    >>> import torch
    >>> mlp = MLP(13, [512, 256, 128])
    >>> mlp(torch.zeros(4, 13)).shape
    torch.Size([4, 128])
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn


def _init_linear(layer: nn.Linear) -> None:
    fan_out, fan_in = layer.weight.shape
    with torch.no_grad():
        layer.weight.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)))
        layer.bias.normal_(0.0, math.sqrt(1.0 / fan_out))


class MLP(nn.Module):
    """``in_features -> sizes[0] -> ... -> sizes[-1]`` with ReLU after every layer except, optionally, the last.

    Args:
        in_features: width of the input.
        sizes: output width of each linear layer.
        last_activation: apply ReLU after the last layer too (bottom MLP: yes; top MLP: no, it emits a logit).

    Input ``[B, in_features]``, output ``[B, sizes[-1]]``.
    """

    def __init__(self, in_features: int, sizes: Sequence[int], last_activation: bool = True):
        super().__init__()
        if not sizes:
            raise ValueError("an MLP needs at least one layer size")
        layers = []
        width = in_features
        for i, size in enumerate(sizes):
            linear = nn.Linear(width, int(size))
            _init_linear(linear)
            layers.append(linear)
            if last_activation or i < len(sizes) - 1:
                layers.append(nn.ReLU(inplace=True))
            width = int(size)
        self.layers = nn.Sequential(*layers)
        self.in_features = in_features
        self.out_features = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class BottomMLP(MLP):
    """Dense ("numerical") features ``[B, num_numerical]`` -> ``[B, bottom_mlp_sizes[-1]]``, ReLU throughout.

    With dot interaction the last size must equal the embedding dimension, since the bottom MLP's output is one
    of the vectors whose pairwise dot products are taken.
    """

    def __init__(self, num_numerical_features: int, sizes: Sequence[int]):
        super().__init__(num_numerical_features, sizes, last_activation=True)


class TopMLP(MLP):
    """Interaction output ``[B, interaction_width]`` -> logits ``[B, 1]``; the last layer has no activation."""

    def __init__(self, in_features: int, sizes: Sequence[int]):
        if int(sizes[-1]) != 1:
            raise ValueError(f"--top_mlp_sizes must end with 1 (one click logit), got {list(sizes)}")
        super().__init__(in_features, sizes, last_activation=False)
