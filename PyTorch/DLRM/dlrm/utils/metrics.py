"""Exact ROC AUC, BCE and the click-model metrics (log loss, NE, calibration) over a whole evaluation set, on one
process or many.

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
import torch.distributed as dist

from dlrm.utils.distributed import all_gather_1d, all_reduce_sum, group_active
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
    if stats is not None:
        stats["rows_gathered"] = 0
    if not group_active():
        return roc_auc_score(labels, scores)
    # gloo reduces and gathers CPU tensors, NCCL CUDA ones: the collectives run on the device the scores came from.
    device = scores.device

    def all_gather(array: np.ndarray) -> np.ndarray:
        gathered = all_gather_1d(torch.from_numpy(np.ascontiguousarray(array)).to(device)).cpu().numpy()
        if stats is not None:
            stats["rows_gathered"] += int(gathered.size)
        return gathered

    def all_reduce_int64(array: np.ndarray) -> np.ndarray:
        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device)
        dist.all_reduce(tensor)
        return tensor.cpu().numpy()

    return _metrics.distributed_roc_auc_score(labels.detach().to("cpu").reshape(-1).numpy(), _scores_numpy(scores),
                                              all_gather, all_reduce_int64)


def binary_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of BCE-with-logits, in float64, so partial sums from ranks add up exactly."""
    return torch.nn.functional.binary_cross_entropy_with_logits(
        logits.to(torch.float64), labels.to(torch.float64), reduction="sum")


class ClickMetrics:
    """Log loss, normalized entropy and calibration (``recsys_common.metrics``, next to AUC) of an evaluation, summed
    batch by batch and, across processes, by one all-reduce of a short float64 vector: no prediction is gathered.

    ``add`` takes one batch's labels and ``logits`` (preferred; float32 of bf16 logits is fine) or ``probabilities``
    (a served model's output), torch tensors or numpy arrays. Kept per process: ``ctr_sums`` (the four
    ``SUMS_FIELDS`` sums) and ``reliability_sums`` (``(buckets, 3)``, log-spaced buckets of the predicted
    probability, for :func:`recsys_common.metrics.plot_reliability`). With ``negative_downsampling_rate`` w < 1 (the
    training data kept negatives with probability w) it also sums the metrics of the corrected predictions
    (``correct_downsampled_logits``: logit + log w), reported as ``*_corrected``.

        >>> m = ClickMetrics()
        >>> m.add(torch.tensor([0., 1.]), logits=torch.tensor([0., 0.]))
        >>> round(m.metrics()["log_loss"], 4), m.metrics()["calibration"]
        (0.6931, 1.0)
    """

    def __init__(self, negative_downsampling_rate: float = 1.0):
        if not 0.0 < float(negative_downsampling_rate) <= 1.0:
            raise ValueError(f"a negative down-sampling rate must lie in (0, 1], got {negative_downsampling_rate!r}")
        self.negative_downsampling_rate = float(negative_downsampling_rate)
        buckets = len(_metrics.RELIABILITY_EDGES) - 1
        self.ctr_sums = np.zeros(len(_metrics.SUMS_FIELDS), dtype=np.float64)
        self.corrected_sums = np.zeros(len(_metrics.SUMS_FIELDS), dtype=np.float64)
        self.reliability_sums = np.zeros((buckets, 3), dtype=np.float64)

    @property
    def corrects(self) -> bool:
        return self.negative_downsampling_rate < 1.0

    def add(self, labels, logits=None, probabilities=None) -> None:
        """Add one batch (every row of it is counted)."""
        def host(values):
            if isinstance(values, torch.Tensor):
                return _scores_numpy(values)
            return None if values is None else np.asarray(values).reshape(-1)
        y, x, p = host(labels), host(logits), host(probabilities)
        self.ctr_sums += _metrics.ctr_sums(y, logits=x, probabilities=p)
        self.reliability_sums += _metrics.reliability_sums(y, logits=x, probabilities=p)
        if self.corrects:
            if x is None:   # a probability's logit; 0 and 1 clipped to float64's epsilon, as the log loss clips them
                eps = np.finfo(np.float64).eps
                q = np.clip(p.astype(np.float64), eps, 1.0 - eps)
                x = np.log(q) - np.log1p(-q)
            self.corrected_sums += _metrics.ctr_sums(
                y, logits=_metrics.correct_downsampled_logits(x, self.negative_downsampling_rate))

    def all_reduce(self, device: torch.device) -> None:
        """Sum every process's sums (collective: every rank calls it; nothing happens without a process group)."""
        flat = np.concatenate([self.ctr_sums, self.corrected_sums, self.reliability_sums.reshape(-1)])
        total = np.asarray(all_reduce_sum(flat.tolist(), device), dtype=np.float64)
        n = len(self.ctr_sums)
        self.ctr_sums, self.corrected_sums = total[:n], total[n:2 * n]
        self.reliability_sums = total[2 * n:].reshape(self.reliability_sums.shape)

    def metrics(self) -> Dict[str, float]:
        """``log_loss``, ``normalized_entropy``, ``calibration`` (NaN where undefined; see ``recsys_common.metrics``)
        and, with a down-sampling rate < 1, ``normalized_entropy_corrected`` and ``calibration_corrected``."""
        if self.ctr_sums[0] <= 0:
            nan = float("nan")
            out = {"log_loss": nan, "normalized_entropy": nan, "calibration": nan}
            if self.corrects:
                out.update(normalized_entropy_corrected=nan, calibration_corrected=nan)
            return out
        whole = _metrics.ctr_metrics_from_sums(self.ctr_sums)
        out = {k: whole[k] for k in ("log_loss", "normalized_entropy", "calibration")}
        if self.corrects:
            corrected = _metrics.ctr_metrics_from_sums(self.corrected_sums)
            out["normalized_entropy_corrected"] = corrected["normalized_entropy"]
            out["calibration_corrected"] = corrected["calibration"]
        return out
