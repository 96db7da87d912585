"""Log loss, normalized entropy and calibration next to AUC: the training loop's evaluations, --mode test, the summary
and its reliability sums, --reliability_plot, recsys_common.plot_log's reliability diagram, dlrm.scripts.predict, and
the per-batch accumulator (``dlrm.utils.metrics.ClickMetrics``) with the negative down-sampling correction. The
figures are checked against ``recsys_common.metrics.ctr_metrics`` over the same predictions, recomputed from the
final checkpoint. 2 processes: ``test_distributed.py``; served vs framework: ``test_serving.py``."""
import numpy as np
import pytest
import torch

from conftest import train_args
from recsys_common import metrics as common_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _log_records(path):
    from recsys_common.logger import read_log
    return read_log(str(path))


def _checkpoint_metrics(checkpoint, dataset, tmp_path):
    """ctr_metrics of the checkpoint's float32 predictions (dlrm.scripts.predict) on the test mapping."""
    from dlrm.scripts import predict
    from recsys_common.datasets import read_columns
    from recsys_common.feature_spec import FeatureSpec
    import os
    out = tmp_path / "p.npy"
    summary = predict.main(["--load_checkpoint_path", checkpoint, "--dataset", dataset, "--output", str(out)])
    spec = FeatureSpec.from_yaml(os.path.join(dataset, "feature_spec.yaml"))
    label_name = spec.channel_spec["label"][0]
    labels = np.asarray(read_columns(spec, "test", [label_name])[label_name], np.float64).reshape(-1)
    probabilities = np.load(out).astype(np.float64)
    return summary, common_metrics.ctr_metrics(labels, probabilities=probabilities)


def test_training_log_and_test_mode_report_ctr_metrics_of_the_predictions(small_dataset, tmp_path):
    from dlrm.train import main
    from recsys_common import plot_log
    result = main(train_args(small_dataset, tmp_path / "train.json", "--embedding_type", "multi_table",
                             "--max_steps", "24", "--test_freq", "12", "--save_checkpoint_path",
                             str(tmp_path / "ck"), "--reliability_plot", str(tmp_path / "plots" / "train.png")))
    checkpoint = str(tmp_path / "ck")
    predict_summary, expected = _checkpoint_metrics(checkpoint, small_dataset, tmp_path)
    assert 0 < expected["normalized_entropy"] < 1 and 0.5 < expected["calibration"] < 2   # a model that learned

    records = _log_records(tmp_path / "train.json")
    evaluations = [r["data"] for r in records if "test_auc" in r["data"] and r["step"] != []]
    assert len(evaluations) == 2
    for data in evaluations:   # every periodic evaluation line has the new keys beside the existing ones
        assert {"test_auc", "test_loss", "test_log_loss", "test_normalized_entropy", "test_calibration"} <= set(data)
        assert "test_calibration_corrected" not in data       # no down-sampling rate given: nothing extra
    summary = [r["data"] for r in records if r["step"] == []][-1]
    for logged in (evaluations[-1], summary, result):
        # logits here (float32 model, float64 sums) vs predict's float32 probabilities: equal to float32 rounding
        assert logged["test_log_loss"] == pytest.approx(expected["log_loss"], rel=1e-5)
        assert logged["test_normalized_entropy"] == pytest.approx(expected["normalized_entropy"], rel=1e-5)
        assert logged["test_calibration"] == pytest.approx(expected["calibration"], rel=1e-5)
    assert summary["test_log_loss"] == pytest.approx(summary["test_loss"], rel=1e-9)   # the same mean BCE
    assert predict_summary["normalized_entropy"] == pytest.approx(expected["normalized_entropy"], rel=1e-12)
    # the summary's sums reproduce its figures, and the reliability buckets hold every row
    assert common_metrics.ctr_metrics_from_sums(summary["test_ctr_sums"])["calibration"] == summary["test_calibration"]
    buckets = np.asarray(summary["test_reliability_sums"])
    assert buckets.shape == (len(common_metrics.RELIABILITY_EDGES) - 1, 3)
    assert buckets[:, 0].sum() == result["test_samples"] == 2048
    assert buckets[:, 1].sum() == summary["test_ctr_sums"][1]
    assert (tmp_path / "plots" / "train.png").read_bytes()[:8] == PNG_MAGIC

    # --mode test on the final checkpoint: the same figures, and its own reliability diagram
    tested = main(train_args(small_dataset, tmp_path / "test.json", "--mode", "test", "--embedding_type",
                             "multi_table", "--load_checkpoint_path", checkpoint,
                             "--reliability_plot", str(tmp_path / "test.png")))
    for key in ("test_log_loss", "test_normalized_entropy", "test_calibration"):
        assert tested[key] == pytest.approx(result[key], rel=1e-9), key
    np.testing.assert_allclose(tested["test_reliability_sums"], result["test_reliability_sums"], rtol=1e-9)
    assert (tmp_path / "test.png").read_bytes()[:8] == PNG_MAGIC

    # plot_log draws the reliability diagram from a log whose summary has the buckets
    written = plot_log.main([str(tmp_path / "test.json"), "--output", str(tmp_path / "from_log")])
    reliability = [w for w in written if w.endswith("reliability.png")]
    assert len(reliability) == 1 and open(reliability[0], "rb").read(8) == PNG_MAGIC


def test_click_metrics_sum_batches_and_correct_downsampled_predictions():
    from dlrm.utils.metrics import ClickMetrics
    rng = np.random.default_rng(3)
    logits = rng.normal(-2.0, 1.5, 3000).astype(np.float32)
    labels = (rng.random(3000) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    whole = ClickMetrics(negative_downsampling_rate=0.25)
    for start in range(0, 3000, 700):    # uneven batches, torch tensors as the evaluation hands them
        whole.add(torch.from_numpy(labels[start:start + 700]), logits=torch.from_numpy(logits[start:start + 700]))
    figures = whole.metrics()
    expected = common_metrics.ctr_metrics(labels, logits=logits)
    corrected = common_metrics.ctr_metrics(labels, logits=common_metrics.correct_downsampled_logits(logits, 0.25))
    for key in ("log_loss", "normalized_entropy", "calibration"):
        assert figures[key] == pytest.approx(expected[key], rel=1e-12)
    assert figures["normalized_entropy_corrected"] == pytest.approx(corrected["normalized_entropy"], rel=1e-12)
    assert figures["calibration_corrected"] == pytest.approx(corrected["calibration"], rel=1e-12)
    assert figures["calibration_corrected"] < 0.5 * figures["calibration"]   # the correction lowers every p
    # probabilities (a served model's output) give the same figures, corrected ones included
    from_probabilities = ClickMetrics(negative_downsampling_rate=0.25)
    from_probabilities.add(labels, probabilities=1 / (1 + np.exp(-logits.astype(np.float64))))
    for key, value in from_probabilities.metrics().items():
        assert value == pytest.approx(figures[key], rel=1e-9), key
    assert set(ClickMetrics().metrics()) == {"log_loss", "normalized_entropy", "calibration"}
    with pytest.raises(ValueError, match="down-sampling rate"):
        ClickMetrics(negative_downsampling_rate=0.0)
