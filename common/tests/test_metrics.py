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


# ------------------------------------------------------------------ the float32 path, both class orders, many ranks
def _tied_case(seed, n, positive_rate):
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < positive_rate).astype(np.int64)
    scores = np.round(rng.normal(labels * 0.5, 1.0), 1).astype(np.float32)   # ~80 distinct values: heavy ties
    scores[:5] = [0.0, -0.0, 0.0, -0.0, 0.0]                                    # -0.0 == 0.0 is a tie too
    return labels, scores


@pytest.mark.parametrize("positive_rate", [0.03, 0.5, 0.9])   # positives the smaller class, about even, the larger
def test_auc_float32_ties_match_pair_count_whichever_class_is_smaller(positive_rate):
    labels, scores = _tied_case(11, 4000, positive_rate)
    expected = _pairwise_auc(labels, scores)
    assert roc_auc_score(labels, scores) == pytest.approx(expected, abs=1e-12)
    assert roc_auc_score(labels, scores.astype(np.float64)) == pytest.approx(expected, abs=1e-12)  # float32-exact
    assert roc_auc_score(labels.astype(bool), scores.astype(np.float16)) == pytest.approx(
        _pairwise_auc(labels, scores.astype(np.float16)), abs=1e-12)


def test_auc_keeps_float64_when_float32_would_create_ties():
    # 1 + 2**-40 and 1 are one float32; in float64 the positive is strictly above: AUC 1, not 0.5.
    labels = np.array([0, 1])
    scores = np.array([1.0, 1.0 + 2.0 ** -40])
    assert roc_auc_score(labels, scores) == 1.0
    assert roc_auc_score(labels, scores.astype(np.float32)) == 0.5


class _ThreadRanks:
    """``world`` ranks as threads with real collectives (a barrier and shared slots), to call a collective function
    as every rank would; records what each rank received from all_gather."""

    def __init__(self, world):
        import threading
        self.world, self.barrier, self.slots = world, threading.Barrier(world, timeout=60), [None] * world
        self.gathered = [[] for _ in range(world)]

    def _exchange(self, rank, value):
        self.barrier.wait()
        self.slots[rank] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()
        return values

    def run(self, fn, per_rank_args):
        from concurrent.futures import ThreadPoolExecutor

        def one(rank):
            def all_gather(x):
                out = np.concatenate(self._exchange(rank, np.asarray(x)))
                self.gathered[rank].append(out.size)
                return out
            return fn(*per_rank_args[rank], all_gather=all_gather,
                      all_reduce_sum=lambda x: np.sum(self._exchange(rank, np.asarray(x)), axis=0))
        with ThreadPoolExecutor(self.world) as pool:
            futures = [pool.submit(one, r) for r in range(self.world)]
            return [f.result(timeout=60) for f in futures]


@pytest.mark.parametrize("positive_rate", [0.03, 0.9])
def test_distributed_auc_equals_one_process_and_gathers_only_the_smaller_class(positive_rate):
    from recsys_common.metrics import distributed_roc_auc_score
    labels, scores = _tied_case(12, 6000, positive_rate)
    smaller_label = int(positive_rate < 0.5)
    one = 1000 + int(np.flatnonzero(labels[1000:] == smaller_label)[0])
    cuts = [0, one, one + 1, 6000]   # uneven ranks; rank 1 holds one row, of the smaller class (none of the larger)
    parts = [(labels[a:b], scores[a:b]) for a, b in zip(cuts, cuts[1:])]
    ranks = _ThreadRanks(3)
    results = ranks.run(distributed_roc_auc_score, parts)
    assert results == [roc_auc_score(labels, scores)] * 3
    assert results[0] == pytest.approx(_pairwise_auc(labels, scores), abs=1e-12)
    smaller = int(min(labels.sum(), (1 - labels).sum()))
    assert ranks.gathered == [[smaller]] * 3          # no rank received the other ranks' larger class
    # A rank whose scores are not float32-exact turns every rank to float64 (else its 1 + 2**-40 ties with 1).
    tie = [(np.array([0]), np.array([1.0], np.float32)), (np.array([1]), np.array([1.0 + 2.0 ** -40]))]
    assert _ThreadRanks(2).run(distributed_roc_auc_score, tie) == [1.0, 1.0]


def test_distributed_auc_errors_and_single_class_on_every_rank():
    from recsys_common.metrics import distributed_roc_auc_score
    one_class = [(np.ones(3), np.arange(3.0)), (np.ones(2), np.arange(2.0))]
    assert all(math.isnan(r) for r in _ThreadRanks(2).run(distributed_roc_auc_score, one_class))
    nan_on_one = [(np.array([0, 1]), np.array([0.1, 0.2])), (np.array([1]), np.array([float("nan")]))]
    with pytest.raises(ValueError, match="1 of 3 scores are NaN"):
        _ThreadRanks(2).run(distributed_roc_auc_score, nan_on_one)
