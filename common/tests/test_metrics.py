"""recsys_common.metrics: exact tie-aware AUC and log loss against scikit-learn and a brute-force pair count."""
import math

import numpy as np
import pytest
from sklearn.metrics import log_loss as sk_log_loss
from sklearn.metrics import roc_auc_score as sk_auc

from recsys_common.metrics import log_loss, log_loss_from_logits, roc_auc_score


def _pairwise_auc(labels, scores):
    """P(score of a positive > score of a negative) + 0.5 P(equal), by counting every pair (O(P N))."""
    pos = scores[labels == 1][:, None]
    neg = scores[labels == 0][None, :]
    return float(((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_matches_sklearn_and_pair_count_with_heavy_ties(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 3000)
    scores = np.round(rng.normal(labels * 0.7, 1.0), 1).astype(np.float32)  # ~60 distinct values: many ties
    assert len(np.unique(scores)) < 100
    ours = roc_auc_score(labels, scores)
    assert ours == pytest.approx(sk_auc(labels, scores), abs=1e-12)
    assert ours == pytest.approx(_pairwise_auc(labels, scores), abs=1e-12)
    # Ties must count one half: breaking them in either direction moves the AUC away from ours.
    assert abs(ours - _pairwise_auc(labels, scores + 1e-3 * labels)) > 1e-3


def test_auc_continuous_all_tied_perfect_and_inverted():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, 20000)
    scores = rng.random(20000) + 0.3 * labels
    assert roc_auc_score(labels, scores) == pytest.approx(sk_auc(labels, scores), abs=1e-12)
    assert roc_auc_score([0, 1, 0, 1], [0.3, 0.3, 0.3, 0.3]) == 0.5
    assert roc_auc_score([0, 0, 1], [0.1, 0.2, 0.9]) == 1.0
    assert roc_auc_score([1, 1, 0], [0.1, 0.2, 0.9]) == 0.0
    assert roc_auc_score(np.array([[True], [False]]), np.array([[2.0], [1.0]])) == 1.0  # bool labels, [n, 1] shapes


def test_auc_single_class_is_nan_and_bad_input_raises():
    assert math.isnan(roc_auc_score(np.ones(5), np.arange(5.0)))
    assert math.isnan(roc_auc_score(np.zeros(5), np.arange(5.0)))
    with pytest.raises(ValueError, match="3 labels but 2 scores"):
        roc_auc_score([0, 1, 1], [0.1, 0.2])
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        roc_auc_score([0, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="1 of 2 scores are NaN"):
        roc_auc_score([0, 1], [0.1, float("nan")])


def test_auc_is_fast_on_a_million_rows():
    import time
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 1_000_000)
    scores = np.round(rng.random(1_000_000), 3)
    start = time.perf_counter()
    ours = roc_auc_score(labels, scores)
    assert time.perf_counter() - start < 5.0   # O(n log n): ~0.2 s; an O(P N) pair count would take hours
    assert ours == pytest.approx(sk_auc(labels, scores), abs=1e-9)


def test_log_loss_matches_sklearn_and_logits_form():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 1000)
    logits = rng.normal(0, 3, 1000)
    p = 1.0 / (1.0 + np.exp(-logits))
    assert log_loss(labels, p) == pytest.approx(sk_log_loss(labels, p), rel=1e-12)
    assert log_loss_from_logits(labels, logits) == pytest.approx(sk_log_loss(labels, p), rel=1e-9)
    # Large logits: exact from logits, clipped from probabilities.
    assert log_loss_from_logits([0], [100.0]) == pytest.approx(100.0, rel=1e-12)
    assert log_loss([0], [1.0]) == pytest.approx(-math.log(1e-15), rel=1e-4)  # finite, not inf
    with pytest.raises(ValueError, match="2 labels but 1 probabilities"):
        log_loss([0, 1], [0.5])
    with pytest.raises(ValueError, match="empty"):
        log_loss_from_logits([], [])
