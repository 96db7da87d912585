"""Log loss, normalized entropy, calibration and the reliability buckets of recsys_common.metrics: against
scikit-learn and the definitions, exact when summed over pieces (ranks), safe at the extremes, loud on bad input."""
import math

import numpy as np
import pytest
from sklearn.metrics import log_loss as sk_log_loss

from recsys_common import metrics as M


def _data(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(-1.0, 1.5, n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.int64)
    return labels, logits


def test_log_loss_matches_scikit_learn_from_logits_and_probabilities():
    labels, logits = _data()
    p = 1 / (1 + np.exp(-logits))
    want = sk_log_loss(labels, p)
    assert M.ctr_metrics(labels, logits=logits)["log_loss"] == pytest.approx(want, rel=1e-12)
    assert M.ctr_metrics(labels, probabilities=p)["log_loss"] == pytest.approx(want, rel=1e-12)


def test_normalized_entropy_and_calibration_by_their_definitions():
    labels, logits = _data()
    p = 1 / (1 + np.exp(-logits))
    ctr = labels.mean()
    m = M.ctr_metrics(labels, logits=logits)
    entropy = -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))
    assert m["normalized_entropy"] == pytest.approx(sk_log_loss(labels, p) / entropy, rel=1e-12)
    assert m["calibration"] == pytest.approx(p.sum() / labels.sum(), rel=1e-12)
    assert m["ctr"] == ctr and m["predicted_ctr"] == pytest.approx(p.mean(), rel=1e-12)
    # a model that predicts the background rate everywhere has NE 1 and calibration 1
    constant = M.ctr_metrics(labels, probabilities=np.full(labels.size, ctr))
    assert constant["normalized_entropy"] == pytest.approx(1.0, rel=1e-12)
    assert constant["calibration"] == pytest.approx(1.0, rel=1e-12)
    # doubling every prediction's odds is seen by calibration, not by AUC
    shifted = M.ctr_metrics(labels, logits=logits + math.log(2))
    assert shifted["calibration"] > 1.2 and M.roc_auc_score(labels, logits + math.log(2)) == M.roc_auc_score(
        labels, logits)


def test_sums_over_pieces_give_the_whole_set_figures():
    labels, logits = _data(n=10007)
    pieces = np.array_split(np.arange(labels.size), 7)
    summed = sum(M.ctr_sums(labels[i], logits=logits[i]) for i in pieces)
    whole = M.ctr_metrics(labels, logits=logits)
    for key, value in M.ctr_metrics_from_sums(summed).items():
        assert value == pytest.approx(whole[key], rel=1e-12), key
    buckets = sum(M.reliability_sums(labels[i], logits=logits[i]) for i in pieces)
    np.testing.assert_allclose(buckets, M.reliability_sums(labels, logits=logits), rtol=1e-12)
    assert buckets[:, 0].sum() == labels.size and buckets[:, 1].sum() == labels.sum()


def test_extreme_and_bf16_logits_stay_finite():
    import torch
    labels = np.array([1, 0, 1, 0])
    logits = torch.tensor([60.0, -60.0, -60.0, 60.0], dtype=torch.bfloat16).float().numpy()
    m = M.ctr_metrics(labels, logits=logits)
    assert m["log_loss"] == pytest.approx(30.0, rel=1e-2)   # two rows right, two wrong by 60 nats
    p = M.ctr_metrics(labels, probabilities=[1.0, 0.0, 0.0, 1.0])
    assert np.isfinite(p["log_loss"]) and p["log_loss"] == pytest.approx(sk_log_loss(labels, [1, 0, 0, 1]))


def test_undefined_figures_are_nan_and_bad_input_raises():
    none_clicked = M.ctr_metrics([0, 0, 0], probabilities=[0.1, 0.2, 0.3])
    assert math.isnan(none_clicked["normalized_entropy"]) and math.isnan(none_clicked["calibration"])
    all_clicked = M.ctr_metrics([1, 1], probabilities=[0.9, 0.8])
    assert math.isnan(all_clicked["normalized_entropy"]) and all_clicked["calibration"] == pytest.approx(0.85)
    for kwargs, message in (({"probabilities": [0.5, float("nan")]}, "in \\[0, 1\\]"),
                            ({"probabilities": [0.5, 1.5]}, "in \\[0, 1\\]"),
                            ({"logits": [0.0, float("nan")]}, "NaN"),
                            ({"logits": [0.0]}, "2 labels but 1")):
        with pytest.raises(ValueError, match=message):
            M.ctr_metrics([0, 1], **kwargs)
    with pytest.raises(ValueError, match="0 or 1"):
        M.ctr_metrics([0, 2], probabilities=[0.5, 0.5])
    with pytest.raises(ValueError, match="empty"):
        M.ctr_metrics([], probabilities=[])


def test_downsampling_correction_recovers_the_full_data_rate():
    """Keep negatives with probability w, learn the rate on the kept rows, correct: the full data's rate."""
    rng = np.random.default_rng(1)
    true_ctr, w = 0.03, 0.1
    labels = (rng.random(400_000) < true_ctr).astype(np.int64)
    kept = (labels == 1) | (rng.random(labels.size) < w)
    sampled_rate = labels[kept].mean()                    # what a model fitted on the kept rows predicts
    logit = math.log(sampled_rate / (1 - sampled_rate))
    corrected = M.correct_downsampled_logits(np.full(labels.size, logit), w)
    m = M.ctr_metrics(labels, logits=corrected)
    assert m["calibration"] == pytest.approx(1.0, abs=0.03)
    assert M.ctr_metrics(labels, logits=np.full(labels.size, logit))["calibration"] > 3   # uncorrected: far off
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="\\(0, 1\\]"):
            M.correct_downsampled_logits([0.0], bad)


def test_reliability_png(tmp_path):
    labels, logits = _data()
    path = M.plot_reliability(M.reliability_sums(labels, logits=logits), str(tmp_path / "reliability.png"),
                              title="test", sums=M.ctr_sums(labels, logits=logits))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
