"""Framework-free evaluation metrics: exact ROC AUC (tie-aware, one process or many) and log loss, numpy only.

Any recipe (PyTorch, TensorFlow, a baseline) converts its predictions to numpy and calls these, so every recipe
reports the same number for the same predictions.

ROC AUC is computed exactly, without binning: it is the probability that a random positive scores above a random
negative, ties counting one half (the Mann-Whitney U statistic). With ``P`` positives and ``N`` negatives,

    AUC = U / (P N),    2 U = sum over positives p of (#negatives < p) + (#negatives <= p)

which is what scikit-learn's ``roc_auc_score`` computes (trapezoids under the ROC curve, tied scores on one segment);
tests check both agree. ``2 U`` is an integer, summed exactly (Python ints), so the only rounding is the final
division. How it is computed, and why:

* The *larger class* is sorted (``np.sort``: vectorised, no argsort, no rank array, no float64 copy of everything),
  and every score of the *smaller class* (for click logs, the positives: 3 % of Criteo 1TB's test day, 26 % of
  Kaggle's) is located in it by binary search (``np.searchsorted``: the rows below, and the rows equal, which count
  one half), in blocks of ``BLOCK_ROWS`` so the temporaries stay small.
* Scores are compared in **float32** when that is exact: float32 (or float16) input, or float64 input whose every
  value is a float32 (the float32 logits of both DLRM recipes). Comparisons of the same values in float32 and
  float64 give the same answers, so ties stay exactly the ties of the input. Other float64 scores stay float64 (a
  cast could create ties that are not there).
* Several processes (:func:`distributed_roc_auc_score`): each holds its own rows and sorts its own rows of the larger
  class. Only the smaller class is all-gathered; every rank locates it in its own sorted rows, and the integer pair
  counts are all-reduced. No rank holds another rank's rows of the larger class, and every rank gets the same AUC.
  The collectives are callables the recipe passes in (``torch.distributed``, Horovod), so this stays numpy only.

    >>> roc_auc_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
"""
from __future__ import annotations

import math
from typing import Any, Callable, Tuple

import numpy as np
from .io import atomic_write_bytes

# Scores of the smaller class searched at a time (the int64 positions of a block: 8 MiB).
BLOCK_ROWS = 1 << 20


def _as_float64_vector(values: Any) -> np.ndarray:
    """Anything array-like (list, numpy array, a framework tensor with ``__array__``) -> 1-D float64."""
    return np.asarray(values, dtype=np.float64).reshape(-1)


def _label_mask(labels: Any) -> np.ndarray:
    """0/1 or bool labels, any shape -> 1-D bool (True = positive); raises ``ValueError`` on anything else."""
    labels = np.asarray(labels).reshape(-1)
    if labels.dtype == np.bool_:
        return labels
    positive = labels == 1
    bad = ~positive & (labels != 0)
    if bad.any():
        raise ValueError(f"labels must be 0 or 1, found {labels[bad][0]!r}")
    return positive


def _score_vector(scores: Any) -> Tuple[np.ndarray, bool]:
    """Scores, any shape -> (1-D float32 or float64 array, whether float32 holds every value exactly)."""
    scores = np.asarray(scores).reshape(-1)
    if scores.dtype in (np.float32, np.float16):
        return scores.astype(np.float32, copy=False), True
    scores = scores.astype(np.float64, copy=False)
    as32 = scores.astype(np.float32)
    # NaN never compares equal, so NaN scores keep float64 here; they are rejected before any counting.
    if np.array_equal(as32, scores):
        return as32, True
    return scores, False


def _twice_u(majority_sorted: np.ndarray, minority: np.ndarray, minority_is_positive: bool) -> int:
    """``2 U`` of the pairs (one of ``majority_sorted``, one of ``minority``): exact, as a Python int.

    For a minority score ``x``: ``lo`` majority scores are below it and ``hi - lo`` equal to it. If the minority are
    the positives, the negatives below ``x`` count 2 each and the equal ones 1: ``lo + hi``; if the minority are the
    negatives, ``x`` is a negative and the positives above it count 2, the equal ones 1: ``2 M - hi - lo``. ``lo``
    is searched only for the scores that have an equal one (``majority_sorted[hi - 1] == x``): few, unless the
    scores are heavily tied.
    """
    size = majority_sorted.size
    if size == 0:   # a rank of a distributed evaluation may hold none of the larger class
        return 0
    total = 0
    for start in range(0, minority.size, BLOCK_ROWS):
        block = minority[start:start + BLOCK_ROWS]
        hi = np.searchsorted(majority_sorted, block, side="right")
        tied = np.flatnonzero(majority_sorted[np.maximum(hi - 1, 0)] == block)   # hi == 0: element 0 is above x
        equal = hi[tied] - np.searchsorted(majority_sorted, block[tied], side="left")
        sum_hi = int(hi.sum(dtype=np.int64))
        s = 2 * sum_hi - int(equal.sum(dtype=np.int64))   # sum of lo + hi
        total += s if minority_is_positive else 2 * size * block.size - s
    return total


def _check_sizes(positive: np.ndarray, scores: np.ndarray) -> None:
    if positive.size != scores.size:
        raise ValueError(f"{positive.size} labels but {scores.size} scores")


def roc_auc_score(labels: Any, scores: Any) -> float:
    """Exact ROC AUC of ``scores`` for binary ``labels`` (0/1 or bool), any shape (flattened).

    Returns a Python float; ``nan`` when the labels hold only one class (AUC is undefined there). Raises
    ``ValueError`` when the two have different numbers of elements, a label is not 0/1, or a score is NaN.
    """
    positive = _label_mask(labels)
    scores, _ = _score_vector(scores)
    _check_sizes(positive, scores)
    nans = int(np.isnan(scores).sum())
    if nans:
        raise ValueError(f"{nans} of {scores.size} scores are NaN; AUC is undefined")
    positives = int(np.count_nonzero(positive))
    negatives = scores.size - positives
    if positives == 0 or negatives == 0:
        return math.nan
    minority_is_positive = positives <= negatives
    majority = scores[~positive] if minority_is_positive else scores[positive]
    majority.sort()
    minority = scores[positive] if minority_is_positive else scores[~positive]
    minority.sort()   # sorted keys: each binary search starts near the last one's answer
    return _twice_u(majority, minority, minority_is_positive) / (2 * positives * negatives)


def distributed_roc_auc_score(labels: Any, scores: Any, all_gather: Callable[[np.ndarray], np.ndarray],
                              all_reduce_sum: Callable[[np.ndarray], np.ndarray]) -> float:
    """Exact ROC AUC of the rows of every process, each passing its own ``labels`` and ``scores``.

    ``all_gather(x)``: the concatenation of every rank's 1-D array ``x`` (lengths may differ; same dtype on every
    rank), in rank order. ``all_reduce_sum(x)``: the element-wise sum over ranks of an int64 array. Every rank
    calls this collectively and gets the same result, equal to :func:`roc_auc_score` of all rows together. Each
    rank receives only the other ranks' rows of the smaller class (see the module docstring). Errors (a bad label, a NaN
    score) are raised on every rank, after the first collective, so no rank is left waiting.
    """
    positive = _label_mask(labels)
    scores, exact32 = _score_vector(scores)
    _check_sizes(positive, scores)
    local_positives = int(np.count_nonzero(positive))
    local_nans = int(np.isnan(scores).sum())
    totals = np.asarray(all_reduce_sum(np.array([local_positives, scores.size - local_positives, local_nans,
                                                 0 if exact32 else 1], dtype=np.int64))).astype(np.int64)
    positives, negatives, nans, not_exact32 = (int(v) for v in totals)
    if nans:
        raise ValueError(f"{nans} of {positives + negatives} scores are NaN; AUC is undefined")
    if positives == 0 or negatives == 0:
        return math.nan
    # One dtype on every rank: float32 only when it is exact everywhere.
    dtype = np.float64 if not_exact32 else np.float32
    scores = scores.astype(dtype, copy=False)
    minority_is_positive = positives <= negatives
    majority = scores[~positive] if minority_is_positive else scores[positive]
    majority.sort()
    minority = np.sort(np.asarray(all_gather(scores[positive] if minority_is_positive else scores[~positive]))
                       .astype(dtype, copy=False))
    local = _twice_u(majority, minority, minority_is_positive)
    twice_u = int(np.asarray(all_reduce_sum(np.array([local], dtype=np.int64)))[0])
    return twice_u / (2 * positives * negatives)
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


# ------------------------------------------------------------------------------------------------------------------
# Calibration metrics of a click model: log loss, normalized entropy, calibration, reliability.
#
# With y the labels, p the predicted probabilities over n rows and c = sum(y) / n the background (observed) CTR:
#
#     log loss     LL = -(1/n) sum[ y log p + (1 - y) log(1 - p) ]
#     entropy      H(c) = -[ c log c + (1 - c) log(1 - c) ]       (the log loss of always predicting c)
#     NE           LL / H(c)     (He et al. 2014; < 1 beats the background rate; undefined if c is 0 or 1)
#     calibration  sum(p) / sum(y)   (1 = as many clicks predicted as observed; undefined without positives)
#
# Every one of them is a function of four sums over the rows, SUMS = [n, sum y, sum p, sum of the row losses], so
# several ranks add their sums (one all-reduce of four float64s) and get the exact whole-set figures: nothing is
# gathered. The row loss is computed from logits when there are logits (stable at any magnitude: a logit of 40 in
# bf16 gives a probability that rounds to 1, not an infinite loss), else from probabilities clipped to
# [eps, 1 - eps] (float64's epsilon, as scikit-learn's log_loss clips). Undefined figures are NaN, as documented above; input that
# cannot be a prediction (NaN, a probability outside [0, 1], labels other than 0/1) raises ValueError.
#
# Negative down-sampling: a model trained on data whose negatives were kept with probability w predicts
# p = P(click) on that data; the probability on the full data is q = p / (p + (1 - p) / w), i.e.
# logit(q) = logit(p) + log(w). :func:`correct_downsampled_logits` applies it.
# ------------------------------------------------------------------------------------------------------------------
SUMS_FIELDS = ("rows", "positives", "sum_probability", "sum_log_loss")
# Reliability diagram buckets: log-spaced edges of the predicted probability, fixed so that ranks' counts add up.
RELIABILITY_EDGES = np.concatenate([[0.0], np.logspace(-4, 0, 17)[:-1], [1.0]])


def _labels_01(labels: Any) -> np.ndarray:
    y = _as_float64_vector(labels)
    if y.size and not np.isin(y, (0.0, 1.0)).all():
        bad = y[~np.isin(y, (0.0, 1.0))][0]
        raise ValueError(f"labels must be 0 or 1, found {bad!r}")
    return y


def _probabilities_and_losses(y: np.ndarray, logits: Any = None, probabilities: Any = None
                              ) -> Tuple[np.ndarray, np.ndarray]:
    if (logits is None) == (probabilities is None):
        raise ValueError("give either logits or probabilities")
    if logits is not None:
        x = _as_float64_vector(logits)
        if x.size != y.size:
            raise ValueError(f"{y.size} labels but {x.size} logits")
        if np.isnan(x).any():
            raise ValueError(f"{int(np.isnan(x).sum())} NaN logit(s)")
        p = 0.5 * (1.0 + np.tanh(0.5 * x))          # the logistic function, without overflow
        return p, np.maximum(x, 0.0) - x * y + np.log1p(np.exp(-np.abs(x)))
    p = _as_float64_vector(probabilities)
    if p.size != y.size:
        raise ValueError(f"{y.size} labels but {p.size} probabilities")
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        bad = p[np.isnan(p) | (p < 0) | (p > 1)][0]
        raise ValueError(f"probabilities must lie in [0, 1], found {bad!r}")
    eps = np.finfo(np.float64).eps   # scikit-learn's log_loss clips at its input dtype's epsilon
    clipped = np.clip(p, eps, 1.0 - eps)
    return p, -(y * np.log(clipped) + (1.0 - y) * np.log1p(-clipped))


def ctr_sums(labels: Any, logits: Any = None, probabilities: Any = None) -> np.ndarray:
    """The four float64 sums ``SUMS_FIELDS`` of one rank's (or one batch's) rows: add them across batches and ranks,
    then :func:`ctr_metrics_from_sums`. Give ``logits`` (preferred) or ``probabilities``."""
    y = _labels_01(labels)
    p, losses = _probabilities_and_losses(y, logits, probabilities)
    return np.array([y.size, y.sum(), p.sum(), losses.sum()], dtype=np.float64)


def binary_entropy(rate: float) -> float:
    """H(rate) in nats; NaN outside (0, 1), where normalized entropy is undefined."""
    if not 0.0 < rate < 1.0:
        return float("nan")
    return float(-(rate * math.log(rate) + (1.0 - rate) * math.log1p(-rate)))


def ctr_metrics_from_sums(sums: Any) -> dict:
    """``{"log_loss", "normalized_entropy", "calibration", "ctr", "predicted_ctr"}`` from :func:`ctr_sums`'s sums.

    NaN where a figure is undefined: NE when the observed CTR is 0 or 1, calibration when there is no positive.
    An empty set raises ValueError."""
    rows, positives, sum_probability, sum_log_loss = (float(v) for v in np.asarray(sums, dtype=np.float64))
    if rows <= 0:
        raise ValueError("metrics of an empty set are undefined")
    ctr = positives / rows
    log_loss_value = sum_log_loss / rows
    return {"log_loss": log_loss_value, "normalized_entropy": log_loss_value / binary_entropy(ctr)
            if 0.0 < ctr < 1.0 else float("nan"),
            "calibration": sum_probability / positives if positives > 0 else float("nan"),
            "ctr": ctr, "predicted_ctr": sum_probability / rows}


def ctr_metrics(labels: Any, logits: Any = None, probabilities: Any = None) -> dict:
    """:func:`ctr_metrics_from_sums` of one set of rows (``logits`` preferred, or ``probabilities``)."""
    return ctr_metrics_from_sums(ctr_sums(labels, logits=logits, probabilities=probabilities))


def reliability_sums(labels: Any, logits: Any = None, probabilities: Any = None,
                     edges: np.ndarray = RELIABILITY_EDGES) -> np.ndarray:
    """Per bucket of predicted probability (``edges``, log-spaced by default), ``[rows, positives, sum p]``: a
    ``(buckets, 3)`` float64 array that ranks and batches add up. :func:`plot_reliability` draws it."""
    y = _labels_01(labels)
    p, _ = _probabilities_and_losses(y, logits, probabilities)
    bucket = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, len(edges) - 2)
    out = np.zeros((len(edges) - 1, 3), dtype=np.float64)
    np.add.at(out, (bucket, 0), 1.0)
    np.add.at(out, (bucket, 1), y)
    np.add.at(out, (bucket, 2), p)
    return out


def plot_reliability(bucket_sums: Any, path: str, title: str = "", sums: Any = None) -> str:
    """A PNG reliability diagram at ``path``: mean predicted vs observed CTR per non-empty bucket (log-log, the
    diagonal is perfect calibration; marker area ~ rows), with the whole-set calibration in the title when
    ``sums`` (:func:`ctr_sums`) are given. Written atomically; returns ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import io
    b = np.asarray(bucket_sums, dtype=np.float64)
    kept = b[:, 0] > 0
    predicted, observed, rows = b[kept, 2] / b[kept, 0], b[kept, 1] / b[kept, 0], b[kept, 0]
    fig, ax = plt.subplots(figsize=(5, 5))
    low = max(min(predicted.min(initial=1.0), observed[observed > 0].min(initial=1.0)) / 2, 1e-5)
    ax.plot([low, 1], [low, 1], color="grey", linewidth=1, label="perfect calibration")
    ax.scatter(predicted, np.maximum(observed, low), s=20 + 180 * rows / rows.max(initial=1.0), alpha=0.7,
               label="buckets (area ~ rows)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean predicted CTR")
    ax.set_ylabel("observed CTR")
    heading = title
    if sums is not None:
        m = ctr_metrics_from_sums(sums)
        heading += (" " if heading else "") + (f"calibration {m['calibration']:.3f}, NE {m['normalized_entropy']:.4f}")
    ax.set_title(heading, fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def correct_downsampled_logits(logits: Any, negative_rate: float) -> np.ndarray:
    """Logits of a model trained on negatives kept with probability ``negative_rate`` (w), corrected to the full
    data: ``logit(q) = logit(p) + log(w)``, i.e. ``q = p / (p + (1 - p) / w)``. ``w`` must lie in (0, 1]."""
    if not 0.0 < float(negative_rate) <= 1.0:
        raise ValueError(f"a negative down-sampling rate must lie in (0, 1], got {negative_rate!r}")
    return _as_float64_vector(logits) + math.log(float(negative_rate))
