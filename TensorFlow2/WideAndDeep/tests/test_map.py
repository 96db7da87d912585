"""MAP@12 against a brute-force pandas computation, whole and with displays split across batches and ranks."""
import numpy as np
import pandas as pd
import pytest

from recsys_common.metrics import ctr_metrics
from wide_deep.evaluation import MissingClickError, compute_metrics, gather_rows, map_at_k


def random_displays(num_displays=300, seed=0):
    """Displays of 1 to 20 ads (some beyond the top 12), exactly one click each, distinct random scores."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 21, num_displays)
    display = np.repeat(rng.permutation(10**6)[:num_displays], sizes)
    clicked_index = np.concatenate([np.eye(n, dtype=int)[rng.integers(n)] for n in sizes])
    scores = rng.random(display.size)
    return display, scores, clicked_index


def brute_force_map(display, scores, labels, k=12):
    frame = pd.DataFrame({"display": display, "score": scores, "label": labels})
    total = 0.0
    groups = frame.groupby("display")
    for _, ads in groups:
        ranked = ads.sort_values("score", ascending=False).reset_index(drop=True)
        rank = int(ranked.index[ranked["label"] == 1][0]) + 1
        total += 1.0 / rank if rank <= k else 0.0
    return total / groups.ngroups


def test_map_equals_brute_force():
    display, scores, labels = random_displays()
    expected = brute_force_map(display, scores, labels)
    assert map_at_k(display, scores, labels) == pytest.approx(expected, abs=1e-12)
    assert 0.1 < expected < 0.9  # a non-trivial case: neither all first nor all missed


def test_rank_beyond_12_scores_zero():
    display = np.zeros(13, dtype=np.int64)
    scores = np.arange(13, 0, -1, dtype=float)  # row i has rank i + 1
    labels = np.zeros(13)
    labels[12] = 1
    assert map_at_k(display, scores, labels) == 0.0
    labels[:] = 0
    labels[11] = 1
    assert map_at_k(display, scores, labels) == pytest.approx(1 / 12)


def test_displays_split_across_batches_and_ranks():
    """Rows shuffled, cut into uneven batches dealt to 2 'ranks', then gathered: the same MAP as whole displays."""
    display, scores, labels = random_displays(seed=1)
    expected = brute_force_map(display, scores, labels)
    order = np.random.default_rng(2).permutation(display.size)
    cuts = np.sort(np.random.default_rng(3).choice(np.arange(1, display.size), 9, replace=False))
    batches = np.split(order, cuts)
    ranks = [np.concatenate(batches[r::2]) for r in range(2)]
    # Horovod's allgather concatenates the ranks' arrays in rank order; each rank's rows are its batches' rows.
    d, s, y = (np.concatenate([source[idx] for idx in ranks]) for source in (display, scores, labels))
    # every display has rows on both ranks in this split (the case a per-batch MAP gets wrong)
    assert len(set(display[ranks[0]]) & set(display[ranks[1]])) > 50
    assert map_at_k(d, s, y) == pytest.approx(expected, abs=1e-12)
    metrics = compute_metrics(d, 1 / (1 + np.exp(-s)), y)
    assert metrics["map12"] == pytest.approx(expected, abs=1e-12)
    clicks = ctr_metrics(y, probabilities=1 / (1 + np.exp(-s)))     # issue 33: NE and calibration next to AUC
    assert metrics["normalized_entropy"] == clicks["normalized_entropy"]
    assert metrics["calibration"] == clicks["calibration"]
    assert metrics["loss"] == pytest.approx(clicks["log_loss"], rel=1e-9)
    assert gather_rows(display, scores, labels, None)[0] is display


def test_display_without_click_is_named():
    display = np.array([5, 5, 7, 7, 7])
    labels = np.array([1, 0, 0, 0, 0])
    with pytest.raises(MissingClickError, match="display_id 7 has 0 clicked ads"):
        map_at_k(display, np.arange(5.0), labels)
