"""The click-model figures of a set of predictions, in NumPy (no TensorFlow: the training loop's reporting and the
served side of ``deployment/evaluate_accuracy.py`` use them without building a model).

* :func:`bce_from_logits_np` / :func:`bce_sum_from_logits_np`: binary cross-entropy of float logits, in float64.
* :func:`click_sums` -> :func:`click_metrics_from_sums`: ``log_loss``, ``normalized_entropy``, ``calibration``
  (``recsys_common.metrics.ctr_metrics_from_sums``; sums that add up over batches and ranks), plus their
  ``*_corrected`` forms for a model trained on negatively down-sampled data; :func:`click_metrics` of one set of
  rows; :func:`click_metrics_text` the printed form.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from recsys_common.metrics import correct_downsampled_logits, ctr_metrics_from_sums, ctr_sums


def bce_from_logits_np(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean BCE of float logits (stable form ``max(x, 0) - x y + log(1 + exp(-|x|))``), in float64."""
    x = np.asarray(logits, np.float64).reshape(-1)
    y = np.asarray(labels, np.float64).reshape(-1)
    if x.size == 0:
        return float("nan")
    return float(np.mean(np.maximum(x, 0.0) - x * y + np.log1p(np.exp(-np.abs(x)))))


def bce_sum_from_logits_np(labels: np.ndarray, logits: np.ndarray) -> float:
    """Sum (not mean) of BCE of float logits, in float64, so the ranks' partial sums add up."""
    x = np.asarray(logits, np.float64).reshape(-1)
    y = np.asarray(labels, np.float64).reshape(-1)
    return float(np.sum(np.maximum(x, 0.0) - x * y + np.log1p(np.exp(-np.abs(x)))))


CLICK_METRICS = ("log_loss", "normalized_entropy", "calibration")
CORRECTED_CLICK_METRICS = ("calibration_corrected", "normalized_entropy_corrected")


def _logits_of_probabilities(probabilities: np.ndarray) -> np.ndarray:
    """log(p / (1 - p)) in float64, p clipped to [eps, 1 - eps] so that a saturated probability stays finite."""
    eps = np.finfo(np.float64).eps
    p = np.clip(np.asarray(probabilities, np.float64).reshape(-1), eps, 1.0 - eps)
    return np.log(p) - np.log1p(-p)


def click_sums(labels: np.ndarray, logits: Optional[np.ndarray] = None, probabilities: Optional[np.ndarray] = None,
               negative_downsampling_rate: float = 1.0) -> np.ndarray:
    """The float64 sums behind :func:`click_metrics_from_sums` of one rank's (or batch's) rows: ``ctr_sums`` (4),
    then, when ``negative_downsampling_rate`` < 1, ``ctr_sums`` of the corrected logits (4 more). They add up over
    batches and ranks. Give ``logits`` (preferred) or ``probabilities`` (a served model's output)."""
    sums = ctr_sums(labels, logits=logits, probabilities=probabilities)
    if float(negative_downsampling_rate) < 1.0:
        scores = logits if logits is not None else _logits_of_probabilities(probabilities)
        corrected = correct_downsampled_logits(scores, negative_downsampling_rate)
        sums = np.concatenate([sums, ctr_sums(labels, logits=corrected)])
    return sums


def click_metrics_from_sums(sums: np.ndarray) -> Dict[str, float]:
    """``{"log_loss", "normalized_entropy", "calibration"}`` (NaN where undefined) of :func:`click_sums`' sums
    (added over ranks), plus ``calibration_corrected`` / ``normalized_entropy_corrected`` when they hold the
    corrected sums too."""
    sums = np.asarray(sums, np.float64).reshape(-1)
    metrics = ctr_metrics_from_sums(sums[:4])
    out = {k: float(metrics[k]) for k in CLICK_METRICS}
    if sums.size == 8:
        corrected = ctr_metrics_from_sums(sums[4:])
        out.update(calibration_corrected=float(corrected["calibration"]),
                   normalized_entropy_corrected=float(corrected["normalized_entropy"]))
    return out


def click_metrics(labels: np.ndarray, logits: Optional[np.ndarray] = None,
                  probabilities: Optional[np.ndarray] = None, negative_downsampling_rate: float = 1.0
                  ) -> Dict[str, float]:
    """:func:`click_metrics_from_sums` of one set of rows (the whole split in one process: the served side of
    ``deployment/evaluate_accuracy.py``), e.g. ``click_metrics([0, 1], logits=[-2.0, 1.0])["log_loss"]``."""
    return click_metrics_from_sums(click_sums(labels, logits, probabilities, negative_downsampling_rate))


def click_metrics_text(metrics: Dict[str, Any]) -> str:
    """`` | log loss 0.45 | NE 0.91 | calibration 1.02`` (and the corrected pair when present): the printed form."""
    text = (f" | log loss {metrics['log_loss']:.5f} | NE {metrics['normalized_entropy']:.5f} | calibration "
            f"{metrics['calibration']:.4f}")
    if "calibration_corrected" in metrics:
        text += (f" | corrected NE {metrics['normalized_entropy_corrected']:.5f} calibration "
                 f"{metrics['calibration_corrected']:.4f}")
    return text
