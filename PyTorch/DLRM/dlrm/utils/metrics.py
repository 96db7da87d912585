"""Exact ROC AUC and BCE over a whole evaluation set, on one process or many.

ROC AUC is ``recsys_common.metrics`` (one framework-free implementation shared by every recipe): exact, without
binning, ties counting one half (the Mann-Whitney U statistic), equal to scikit-learn's ``roc_auc_score``, compared in
float32 (the logits' own precision, so no tie is created or lost). This module only moves torch tensors to numpy for
it and, for :func:`distributed_roc_auc_score`, hands it ``torch.distributed`` collectives: each process keeps its own
rows, only the smaller class (the clicks) is all-gathered, and the integer pair counts are all-reduced.

    >>> import torch
    >>> roc_auc_score(torch.tensor([0., 0., 1., 1.]), torch.tensor([0.1, 0.4, 0.35, 0.8]))
    0.75
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from recsys_common import metrics as _metrics


def _scores_numpy(scores: torch.Tensor) -> np.ndarray:
    """float32 for float32/float16/bfloat16 scores (exact), float64 otherwise."""
    scores = scores.detach().to("cpu").reshape(-1)
    if scores.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return scores.to(torch.float32).numpy()
    return scores.to(torch.float64).numpy()


def roc_auc_score(labels: torch.Tensor, scores: torch.Tensor) -> float:
    """Exact ROC AUC; ``nan`` when the labels hold only one class (AUC is undefined there)."""
    return _metrics.roc_auc_score(labels.detach().to("cpu").reshape(-1).numpy(), _scores_numpy(scores))


def distributed_roc_auc_score(labels: torch.Tensor, scores: torch.Tensor,
                              stats: Optional[Dict[str, int]] = None) -> float:
    """Exact ROC AUC of every process's rows (collective: every rank calls it and gets the same value).

    Without an initialised process group of more than one process it is :func:`roc_auc_score`. ``stats`` (a dict),
    when given, receives ``rows_gathered``: the scores this process received from all processes (the smaller class).
    """
    from dlrm.utils.distributed import all_gather_1d, group_active
    if stats is not None:
        stats["rows_gathered"] = 0
    if not group_active():
        return roc_auc_score(labels, scores)
    import torch.distributed as dist
    # gloo reduces and gathers CPU tensors, NCCL CUDA ones: the collectives run on the device the scores came from.
    device = scores.device

    def all_gather(array: np.ndarray) -> np.ndarray:
        gathered = all_gather_1d(torch.from_numpy(np.ascontiguousarray(array)).to(device)).cpu().numpy()
        if stats is not None:
            stats["rows_gathered"] += int(gathered.size)
        return gathered

    def all_reduce_sum(array: np.ndarray) -> np.ndarray:
        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device)
        dist.all_reduce(tensor)
        return tensor.cpu().numpy()

    return _metrics.distributed_roc_auc_score(labels.detach().to("cpu").reshape(-1).numpy(), _scores_numpy(scores),
                                              all_gather, all_reduce_sum)


def binary_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of BCE-with-logits, in float64, so partial sums from ranks add up exactly."""
    return torch.nn.functional.binary_cross_entropy_with_logits(
        logits.to(torch.float64), labels.to(torch.float64), reduction="sum")
