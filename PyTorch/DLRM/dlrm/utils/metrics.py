"""Exact ROC AUC and BCE over a whole evaluation set.

ROC AUC is computed exactly, without binning: it equals the probability that a random positive scores above a random
negative, ties counting one half (the Mann-Whitney U statistic). Sort the scores, give each tied group the average of
the ranks it occupies, then

    AUC = (sum of the positives' ranks - P (P + 1) / 2) / (P N)

for ``P`` positives and ``N`` negatives; ``O(n log n)``, float64 throughout. This is what scikit-learn's
``roc_auc_score`` computes (trapezoids under the ROC curve, with tied scores on one segment); a test checks both agree.

    >>> import torch
    >>> roc_auc_score(torch.tensor([0., 0., 1., 1.]), torch.tensor([0.1, 0.4, 0.35, 0.8]))
    0.75
"""
from __future__ import annotations

import math

import torch


def roc_auc_score(labels: torch.Tensor, scores: torch.Tensor) -> float:
    """Exact ROC AUC; ``nan`` when the labels hold only one class (AUC is undefined there)."""
    labels = labels.reshape(-1).to(torch.float64)
    scores = scores.reshape(-1).to(torch.float64)
    if labels.numel() != scores.numel():
        raise ValueError(f"{labels.numel()} labels but {scores.numel()} scores")
    positives = labels.sum().item()
    negatives = labels.numel() - positives
    if positives == 0 or negatives == 0:
        return math.nan
    sorted_scores, order = torch.sort(scores)
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    last_rank = torch.cumsum(counts, 0).to(torch.float64)            # 1-based rank of each group's last member
    average_rank = last_rank - (counts.to(torch.float64) - 1.0) / 2.0
    ranks = average_rank[inverse]
    positive_rank_sum = (ranks * labels[order]).sum().item()
    return (positive_rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


def binary_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of BCE-with-logits, in float64, so partial sums from ranks add up exactly."""
    return torch.nn.functional.binary_cross_entropy_with_logits(
        logits.to(torch.float64), labels.to(torch.float64), reduction="sum")
