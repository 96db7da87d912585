"""Exact AUC against scikit-learn, with and without ties."""
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score as sk_auc

from dlrm.utils.metrics import roc_auc_score


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_matches_sklearn_with_heavy_ties(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 5000)
    scores = np.round(rng.normal(labels * 0.7, 1.0), 1)  # ~60 distinct values: many ties
    assert len(np.unique(scores)) < 100
    ours = roc_auc_score(torch.tensor(labels), torch.tensor(scores, dtype=torch.float32))
    assert ours == pytest.approx(sk_auc(labels, scores.astype(np.float32)), abs=1e-12)


def test_auc_matches_sklearn_continuous_and_all_tied():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, 20000)
    scores = rng.random(20000) + 0.3 * labels
    assert roc_auc_score(torch.tensor(labels), torch.tensor(scores)) == pytest.approx(sk_auc(labels, scores), abs=1e-12)
    assert roc_auc_score(torch.tensor([0, 1, 0, 1]), torch.tensor([0.3, 0.3, 0.3, 0.3])) == 0.5
    assert roc_auc_score(torch.tensor([0, 0, 1]), torch.tensor([0.1, 0.2, 0.9])) == 1.0


def test_auc_single_class_is_nan():
    assert math.isnan(roc_auc_score(torch.ones(5), torch.rand(5)))


def test_auc_is_the_shared_framework_free_implementation(monkeypatch):
    """One implementation for every recipe: this module only converts tensors for recsys_common.metrics."""
    from recsys_common import metrics as shared
    calls = []
    monkeypatch.setattr(shared, "roc_auc_score", lambda labels, scores: calls.append((labels, scores)) or 0.25)
    assert roc_auc_score(torch.tensor([0, 1]), torch.tensor([0.5, 0.1], dtype=torch.float16)) == 0.25
    assert [c[1].dtype for c in calls] == [np.float32]   # float16 logits compared exactly in float32
