"""Exact ROC AUC and BCE over a whole evaluation set.

ROC AUC is ``recsys_common.metrics.roc_auc_score`` (one framework-free implementation shared by every recipe): exact,
without binning, ties counting one half (the Mann-Whitney U statistic), ``O(n log n)`` in float64, equal to
scikit-learn's ``roc_auc_score``. This module only moves torch tensors to numpy for it.

    >>> import torch
    >>> roc_auc_score(torch.tensor([0., 0., 1., 1.]), torch.tensor([0.1, 0.4, 0.35, 0.8]))
    0.75
"""
from __future__ import annotations

import torch

from recsys_common import metrics as _metrics


def roc_auc_score(labels: torch.Tensor, scores: torch.Tensor) -> float:
    """Exact ROC AUC; ``nan`` when the labels hold only one class (AUC is undefined there)."""
    return _metrics.roc_auc_score(labels.detach().to("cpu", torch.float64).numpy(),
                                  scores.detach().to("cpu", torch.float64).numpy())


def binary_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of BCE-with-logits, in float64, so partial sums from ranks add up exactly."""
    return torch.nn.functional.binary_cross_entropy_with_logits(
        logits.to(torch.float64), labels.to(torch.float64), reduction="sum")
