"""Exact evaluation metrics: BCE, ROC AUC, MAP@12 per display, normalized entropy and calibration, over all ranks'
rows.

Each rank collects its ``(display_id, score, label)`` rows; :func:`gather_rows` allgathers them (Horovod), and every
rank computes the metrics once on the full set, so a display whose ads fall in different batches or on different
ranks is ranked whole.

MAP@12 (Kaggle Outbrain): for each display, its ads sorted by score (descending; ties keep the earlier row first);
AP = 1 / rank of the clicked ad if the rank is at most 12, else 0; MAP = mean AP over displays. Each display must
have exactly one click.

Normalized entropy and calibration (issue 33; ``recsys_common.metrics.ctr_metrics`` of the probabilities): NE = log
loss / entropy of the observed CTR (< 1: better than predicting the base rate; NaN when the CTR is 0 or 1),
calibration = sum of predicted probabilities / clicks (1: as many clicks predicted as observed).

The run of a model over a validation set (every rank's rows gathered, the reliability buckets for the log) is
``wide_deep.train.evaluate``.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np

from recsys_common.cli import InputError
from recsys_common.metrics import ctr_metrics, log_loss, roc_auc_score


class MissingClickError(InputError):
    """A display with no click (or several): MAP@12 is undefined for it."""


def map_at_k(display_ids, scores, labels, k: int = 12) -> float:
    """Mean over displays of 1/rank of the clicked ad (0 when the rank is beyond ``k``); see the module docstring."""
    display_ids = np.asarray(display_ids).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    if not (display_ids.size == scores.size == labels.size):
        raise ValueError(f"{display_ids.size} display ids, {scores.size} scores, {labels.size} labels")
    if display_ids.size == 0:
        raise ValueError("MAP@12 of an empty set is undefined")
    # Sort by display, then score descending; a stable sort keeps row order among equal scores.
    order = np.lexsort((np.arange(scores.size), -scores, display_ids))
    d, y = display_ids[order], labels[order] != 0
    starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
    clicks = np.add.reduceat(y.astype(np.int64), starts)
    bad = np.flatnonzero(clicks != 1)
    if bad.size:
        i = bad[0]
        raise MissingClickError(f"display_id {int(d[starts[i]])} has {int(clicks[i])} clicked ads (MAP@12 needs "
                                f"exactly one); {bad.size} display(s) like it")
    position = np.arange(d.size) - np.repeat(starts, np.diff(np.r_[starts, d.size]))
    rank = position[y] + 1
    ap = np.where(rank <= k, 1.0 / rank, 0.0)
    return float(ap.mean())


def compute_metrics(display_ids, probabilities, labels, with_map: bool = True) -> Dict[str, float]:
    """``{"loss": BCE, "auc": exact ROC AUC, "map12": MAP@12, "normalized_entropy", "calibration"}`` of the given
    rows (see the module docstring)."""
    metrics = {"loss": log_loss(labels, probabilities), "auc": roc_auc_score(labels, probabilities)}
    if with_map:
        metrics["map12"] = map_at_k(display_ids, probabilities, labels)
    clicks = ctr_metrics(labels, probabilities=probabilities)
    metrics.update(normalized_entropy=clicks["normalized_entropy"], calibration=clicks["calibration"])
    return metrics


def gather_rows(display_ids: np.ndarray, probabilities: np.ndarray, labels: np.ndarray,
                allgather: Optional[Callable[[np.ndarray], np.ndarray]] = None):
    """Every rank's rows, concatenated in rank order (``allgather``: Horovod's, or None for one process)."""
    if allgather is None:
        return display_ids, probabilities, labels
    return (allgather(np.asarray(display_ids, np.int64)), allgather(np.asarray(probabilities, np.float64)),
            allgather(np.asarray(labels, np.float64)))
