"""Issue 33: the click-model metrics of the Evaluator (summed float64 sums) equal recsys_common.metrics.ctr_metrics
over the same predictions, with and without the negative down-sampling correction."""
import numpy as np
import pytest
import tensorflow as tf

from dlrm_dcnv2.model.evaluator import Evaluator
from dlrm_dcnv2.model.metrics import click_metrics, click_metrics_from_sums, click_sums
from recsys_common.metrics import correct_downsampled_logits, ctr_metrics, reliability_sums


class LinearModel:
    """A stand-in ``RecModel``: the logit is a fixed linear function of the numerical features."""

    def __init__(self, weights):
        self.weights = tf.constant(weights, tf.float32)

    def __call__(self, inputs, training=False):
        numerical, _ = inputs
        return tf.reduce_sum(numerical * self.weights, axis=1, keepdims=True)


def _batches(seed=0, rows=600, batch=128):
    rng = np.random.default_rng(seed)
    numerical = rng.normal(size=(rows, 3)).astype(np.float32)
    labels = (rng.random(rows) < 1 / (1 + np.exp(-(numerical @ [1.0, -0.5, 0.2] - 1.5)))).astype(np.float32)
    return [(numerical[i:i + batch], [np.zeros((min(batch, rows - i), 1), np.int64)], labels[i:i + batch])
            for i in range(0, rows, batch)]


def test_evaluator_click_metrics_equal_ctr_metrics_of_its_predictions():
    evaluator = Evaluator(LinearModel([1.0, -0.5, 0.2]), run_eagerly=True)
    stats = {}
    result = evaluator.evaluate(_batches(), stats)
    predicted = evaluator.predict(_batches())
    expected = ctr_metrics(predicted["labels"], logits=predicted["logits"])
    for key in ("log_loss", "normalized_entropy", "calibration"):
        assert result[key] == pytest.approx(expected[key], rel=1e-12)
    assert result["log_loss"] == pytest.approx(result["loss"], rel=1e-12)
    assert stats["ctr_sums"][0] == 600 and stats["reliability_sums"][:, 0].sum() == 600
    np.testing.assert_allclose(stats["reliability_sums"],
                               reliability_sums(predicted["labels"], logits=predicted["logits"]))
    assert "calibration_corrected" not in result


def test_downsampling_rate_adds_the_corrected_figures():
    evaluator = Evaluator(LinearModel([1.0, -0.5, 0.2]), run_eagerly=True, negative_downsampling_rate=0.25)
    result = evaluator.evaluate(_batches())
    predicted = evaluator.predict(_batches())
    corrected = ctr_metrics(predicted["labels"], logits=correct_downsampled_logits(predicted["logits"], 0.25))
    assert result["calibration_corrected"] == pytest.approx(corrected["calibration"], rel=1e-12)
    assert result["normalized_entropy_corrected"] == pytest.approx(corrected["normalized_entropy"], rel=1e-12)
    assert result["calibration_corrected"] < result["calibration"]   # log w < 0 lowers every probability
    with pytest.raises(ValueError, match="down-sampling rate"):
        Evaluator(LinearModel([1.0, 0, 0]), negative_downsampling_rate=0.0)


def test_sums_add_across_batches_and_probabilities_agree_with_logits():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=500) * 2
    labels = (rng.random(500) < 0.3).astype(np.float64)
    whole = click_sums(labels, logits, negative_downsampling_rate=0.5)
    parts = click_sums(labels[:200], logits[:200], negative_downsampling_rate=0.5) + \
        click_sums(labels[200:], logits[200:], negative_downsampling_rate=0.5)
    np.testing.assert_allclose(parts, whole, rtol=1e-12)
    from_logits = click_metrics_from_sums(whole)
    from_probabilities = click_metrics(labels, probabilities=1 / (1 + np.exp(-logits)),
                                       negative_downsampling_rate=0.5)   # the served side's path
    assert from_logits.keys() == from_probabilities.keys()
    for key, value in from_logits.items():
        assert from_probabilities[key] == pytest.approx(value, rel=1e-9)
    assert np.isnan(click_metrics(np.zeros(4), logits=np.zeros(4))["normalized_entropy"])   # CTR 0: undefined
