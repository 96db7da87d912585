"""NCF's evaluation: HR@K and NDCG@K of each user's positive among its candidates, as the NCF paper ranks them."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Dict

import torch
from torch import nn

from .cli import ConfigurationError
from .data import EvalSet, NCFData
from .distributed import all_reduce_sum
from .model import Popularity


@torch.no_grad()
def evaluate(model: nn.Module, test: EvalSet, topk: int, valid_batch_size: int, autocast) -> Dict[str, float]:
    """HR@K and NDCG@K over all ranks' users (all-reduced), and the validation BCE over all candidates.

    A user's positive ranks ``r`` = number of its (non-duplicate) negatives scoring at least as high (ties count
    against the positive, as the NCF paper's evaluation does); hit if ``r < K``, NDCG = ``1 / log2(r + 2)``.

    A NaN score compares false with everything, so a NaN positive would rank first (a hit with NDCG 1) and a NaN
    negative would never beat the positive: a user with a NaN score among its ranked candidates (the positive or any
    non-duplicate negative) is counted as a miss, so a diverged model scores HR 0, not 1. ``nan_users`` counts them.
    """
    model.eval()
    users, candidates = test.users, test.candidates
    n_users, samples = candidates.shape
    check_topk(topk, samples)
    flat_users = users.repeat_interleave(samples)
    flat_items = candidates.reshape(-1)
    scores = torch.empty(flat_items.shape[0], dtype=torch.float32, device=flat_items.device)
    for lo in range(0, flat_items.shape[0], valid_batch_size):
        with autocast():
            scores[lo: lo + valid_batch_size] = model(flat_users[lo: lo + valid_batch_size],
                                                      flat_items[lo: lo + valid_batch_size]).float()
    scores = scores.view(n_users, samples)
    labels = torch.zeros_like(scores)
    labels[:, 0] = 1.0
    bce = nn.functional.binary_cross_entropy_with_logits(scores, labels, reduction="sum") if n_users else \
        torch.zeros((), device=scores.device)
    hits, ndcg, unrankable = rank_positives(scores, test.mask, topk)
    total_hits, total_ndcg, total_bce, total_users, nan_users = all_reduce_sum(
        [float(hits.sum()), float(ndcg.sum()), float(bce), float(n_users), float(unrankable.sum())], scores.device)
    return {"hr": total_hits / total_users, "ndcg": total_ndcg / total_users,
            "val_loss": total_bce / (total_users * samples), "eval_rows": total_users * samples,
            "nan_users": int(nan_users)}


def rank_positives(scores: torch.Tensor, mask: torch.Tensor, topk: int):
    """The ranking rule of :func:`evaluate`, also applied to served scores by ``deployment/evaluate_accuracy.py``
    (one rule, so trained and served evaluation cannot disagree). ``scores [U, S]`` has the positive in column 0;
    ``mask [U, S]`` is True for candidates repeating an earlier one (``neumf.data.duplicate_mask``: not ranked).

    Returns per-user ``hits`` (bool), ``ndcg`` (float64, 0 for a miss) and ``unrankable`` (a NaN among the ranked
    candidates: counted as a miss).

    >>> hits, ndcg, nan = rank_positives(torch.tensor([[0.9, 0.1, 0.9], [0.2, 0.5, 0.1]]),
    ...                                  torch.zeros(2, 3, dtype=torch.bool), topk=2)
    >>> hits.tolist(), ndcg.tolist(), nan.tolist()
    ([True, True], [0.6309297535714575, 0.6309297535714575], [False, False])
    """
    ranked = scores.masked_fill(mask, float("-inf"))
    unrankable = torch.isnan(ranked).any(dim=1)
    rank = (ranked[:, 1:] >= ranked[:, :1]).sum(dim=1)
    hits = (rank < topk) & ~unrankable
    ndcg = torch.where(hits, 1.0 / torch.log2(rank.double() + 2.0), torch.zeros((), dtype=torch.float64,
                                                                                  device=rank.device))
    return hits, ndcg, unrankable


def check_topk(topk: int, samples_per_series: int, origin: str = "the test set") -> None:
    """``-k`` must be below the candidates per user: with K >= S every positive ranks below K, so HR@K = 1."""
    if topk >= samples_per_series:
        raise ConfigurationError(
            f"-k/--topk {topk} must be below the number of candidates per user in {origin} "
            f"({samples_per_series} = 1 positive + {samples_per_series - 1} negatives, "
            f"metadata.test_samples_per_series): with K >= {samples_per_series} every user counts as a hit")


def popularity_metrics(data: NCFData, topk: int) -> Dict[str, float]:
    """HR@K and NDCG@K of :class:`neumf.model.Popularity` (an item's score: its training rows) on ``data``'s test
    series, through :func:`evaluate` (same candidates, duplicate mask and tie rule as a trained model: an unseen test
    item tied with unseen negatives ranks below them). The floor a trained model must beat."""
    model = Popularity(torch.as_tensor(data.train_items), data.num_items)
    metrics = evaluate(model, EvalSet(data, 0, 1, torch.device("cpu")), topk, 2 ** 20, nullcontext)
    return {"hr": metrics["hr"], "ndcg": metrics["ndcg"]}
