"""Framework-free evaluation metrics: exact ROC AUC (tie-aware) and log loss, numpy only.

Any recipe (PyTorch, TensorFlow, a baseline) converts its predictions to numpy and calls these, so every recipe
reports the same number for the same predictions.

ROC AUC is computed exactly, without binning: it is the probability that a random positive scores above a random
negative, ties counting one half (the Mann-Whitney U statistic). Sort the scores, give each group of tied scores
the average of the ranks it occupies, then

    AUC = (sum of the positives' ranks - P (P + 1) / 2) / (P N)

for ``P`` positives and ``N`` negatives; ``O(n log n)``, float64 throughout. This is what scikit-learn's
``roc_auc_score`` computes (trapezoids under the ROC curve, tied scores on one segment); tests check both agree.

    >>> roc_auc_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def _as_float64_vector(values: Any) -> np.ndarray:
    """Anything array-like (list, numpy array, a framework tensor with ``__array__``) -> 1-D float64."""
    return np.asarray(values, dtype=np.float64).reshape(-1)


def roc_auc_score(labels: Any, scores: Any) -> float:
    """Exact ROC AUC of ``scores`` for binary ``labels`` (0/1 or bool), any shape (flattened).

    Returns a Python float; ``nan`` when the labels hold only one class (AUC is undefined there). Raises
    ``ValueError`` when the two have different numbers of elements, a label is not 0/1, or a score is NaN.
    """
    labels = _as_float64_vector(labels)
    scores = _as_float64_vector(scores)
    if labels.size != scores.size:
        raise ValueError(f"{labels.size} labels but {scores.size} scores")
    if np.any((labels != 0.0) & (labels != 1.0)):
        bad = labels[(labels != 0.0) & (labels != 1.0)][0]
        raise ValueError(f"labels must be 0 or 1, found {bad!r}")
    if np.isnan(scores).any():
        raise ValueError(f"{int(np.isnan(scores).sum())} of {scores.size} scores are NaN; AUC is undefined")
    positives = float(labels.sum())
    negatives = float(labels.size) - positives
    if positives == 0.0 or negatives == 0.0:
        return math.nan
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    # Start index of each group of equal scores; each group's members share the average of their 1-based ranks.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    counts = np.diff(np.r_[starts, scores.size])
    average_rank = starts + (counts + 1) / 2.0
    ranks = np.repeat(average_rank, counts)
    positive_rank_sum = float(np.dot(ranks, labels[order]))
    return (positive_rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)


def log_loss(labels: Any, probabilities: Any, eps: float = 1e-15) -> float:
    """Mean binary cross-entropy of predicted probabilities (clipped to ``[eps, 1 - eps]``, as scikit-learn did).

    Use :func:`log_loss_from_logits` when you hold logits: it is exact for large logits where the probability
    rounds to 0 or 1.
    """
    labels = _as_float64_vector(labels)
    p = np.clip(_as_float64_vector(probabilities), eps, 1.0 - eps)
    if labels.size != p.size:
        raise ValueError(f"{labels.size} labels but {p.size} probabilities")
    if labels.size == 0:
        raise ValueError("log loss of an empty set is undefined")
    return float(-np.mean(labels * np.log(p) + (1.0 - labels) * np.log1p(-p)))


def log_loss_from_logits(labels: Any, logits: Any) -> float:
    """Mean binary cross-entropy from logits, numerically stable: ``max(x, 0) - x y + log(1 + exp(-|x|))``."""
    labels = _as_float64_vector(labels)
    x = _as_float64_vector(logits)
    if labels.size != x.size:
        raise ValueError(f"{labels.size} labels but {x.size} logits")
    if labels.size == 0:
        raise ValueError("log loss of an empty set is undefined")
    return float(np.mean(np.maximum(x, 0.0) - x * labels + np.log1p(np.exp(-np.abs(x)))))
