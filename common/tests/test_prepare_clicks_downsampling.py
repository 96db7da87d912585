"""prepare_clicks --negative_downsampling_rate: train negatives kept with probability W, and the correction.

A generated click log with a known CTR (about 5 %) and features that carry signal is prepared with W = 0.2 and with
W = 1. The train split's positive rate rises as q = p / (p + (1 - p) W); validation and test are the same rows; the
kept rows do not depend on --block_rows. A logistic regression fitted on the down-sampled train split predicts the
down-sampled CTR on the test split (calibration about 4) until its logits get + log W
(``recsys_common.metrics.correct_downsampled_logits``), after which calibration is about 1.
"""
import json
import os

import numpy as np
import pytest

pytest.importorskip("polars")

from recsys_common import prepare_clicks as pc  # noqa: E402
from recsys_common.cli import exit_status  # noqa: E402
from recsys_common.datasets import read_columns  # noqa: E402
from recsys_common.feature_spec import FeatureSpec, FeatureSpecError, negative_downsampling_rate  # noqa: E402
from recsys_common.metrics import correct_downsampled_logits, ctr_metrics  # noqa: E402

RATE = 0.2
CATEGORICAL = ["site", "device", "hour"]
NUMERICAL = ["row_id", "score"]     # row_id identifies a row in the output (float32 is exact below 2**24)


def click_log(path, seed: int, rows: int = 30000) -> str:
    """A CSV click log: three categorical features with per-value logit effects, one numerical with a linear
    effect, base logit chosen for a CTR of about 5 %."""
    rng = np.random.default_rng(seed)
    effects = {"site": rng.normal(0, 0.8, 12), "device": rng.normal(0, 0.5, 6), "hour": rng.normal(0, 0.3, 24)}
    values = {name: rng.integers(0, len(e), rows) for name, e in effects.items()}
    score = rng.normal(0, 1, rows)
    logit = -3.3 + 0.6 * score + sum(effects[n][values[n]] for n in CATEGORICAL)
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    with open(path, "w") as f:
        f.write("clicked,site,device,hour,row_id,score\n")
        for i in range(rows):
            f.write(f"{label[i]},s{values['site'][i]},d{values['device'][i]},h{values['hour'][i]},{i},"
                    f"{score[i]:.5f}\n")
    return str(path)


def prepare(log, out, rate=1.0, *extra):
    return pc.main(["--input", log, "--output", str(out), "--label", "clicked", "--categorical", *CATEGORICAL,
                    "--numerical", *NUMERICAL, "--numerical_transform", "none", "--frequency_limit", "1",
                    "--split_fractions", "0.6", "0.2", "0.2", "--seed", "7",
                    "--negative_downsampling_rate", str(rate), *extra])


def split_columns(out, mapping):
    spec = FeatureSpec.from_yaml(os.path.join(str(out), "feature_spec.yaml"))
    return read_columns(spec, mapping)


def design(columns, cardinalities):
    """One-hot categorical ids and the ``score`` feature (not ``row_id``) for a logistic regression."""
    parts = [np.eye(card, dtype=np.float32)[columns[name].astype(np.int64)]
             for name, card in zip(CATEGORICAL, cardinalities)]
    return np.hstack(parts + [columns["score"].astype(np.float32)[:, None]])


def test_downsampling_train_only_recorded_and_independent_of_block_rows(tmp_path):
    log = click_log(tmp_path / "log.csv", seed=0)
    full = prepare(log, tmp_path / "full")
    down = prepare(log, tmp_path / "down", RATE)
    small_blocks = prepare(log, tmp_path / "down_blocks", RATE, "--block_rows", "777")

    # Recorded where the recipes read it, and in the report.
    spec = down["spec"]
    assert spec.metadata["negative_downsampling_rate"] == RATE and negative_downsampling_rate(spec) == RATE
    assert negative_downsampling_rate(full["spec"]) == 1.0
    with open(tmp_path / "down" / pc.REPORT_NAME) as f:
        report = json.load(f)["negative_downsampling"]
    full_train = split_columns(tmp_path / "full", "train")
    kept = split_columns(tmp_path / "down", "train")
    assert report["rate"] == RATE and report["train_rows_before"] == len(full_train["label"])
    assert report["train_rows_after"] == len(kept["label"]) == spec.metadata["num_samples"]["train"]

    # Positives all kept; negatives about W of them; the positive rate rises as p / (p + (1 - p) W).
    p = float(full_train["label"].mean())
    assert 0.03 < p < 0.08
    assert int(kept["label"].sum()) == int(full_train["label"].sum())
    negatives_kept = (~kept["label"].astype(bool)).sum() / (~full_train["label"].astype(bool)).sum()
    assert abs(negatives_kept - RATE) < 0.02
    expected = p / (p + (1 - p) * RATE)
    assert abs(float(kept["label"].mean()) - expected) < 0.02, (kept["label"].mean(), expected)
    assert set(kept["row_id"].astype(int)) <= set(full_train["row_id"].astype(int))

    # Validation and test measure the real distribution: the same rows as without down-sampling.
    for mapping in ("validation", "test"):
        a, b = split_columns(tmp_path / "full", mapping), split_columns(tmp_path / "down", mapping)
        assert np.array_equal(a["row_id"], b["row_id"]) and np.array_equal(a["label"], b["label"])

    # The same rows are kept whatever --block_rows (only the within-block shuffle order differs).
    other = split_columns(tmp_path / "down_blocks", "train")
    assert sorted(other["row_id"].astype(int)) == sorted(kept["row_id"].astype(int))

    # apply maps new rows without dropping any, and carries the rate of the rows the model trained on.
    applied = pc.main(["apply", "--dataset", str(tmp_path / "down"), "--input", log, "--output",
                       str(tmp_path / "applied")])["spec"]
    assert len(read_columns(applied, "test")["label"]) == 30000
    assert negative_downsampling_rate(applied) == RATE


def calibrations(tmp_path, seed: int):
    """(uncorrected, corrected) test-split calibration of a logistic regression fitted on the W-down-sampled train."""
    from sklearn.linear_model import LogisticRegression
    log = click_log(tmp_path / f"log{seed}.csv", seed=seed)
    result = prepare(log, tmp_path / f"down{seed}", RATE)
    spec = result["spec"]
    cards = [spec.cardinality(n) for n in CATEGORICAL]
    train, test = read_columns(spec, "train"), read_columns(spec, "test")
    model = LogisticRegression(C=10.0, max_iter=500).fit(design(train, cards), train["label"].astype(int))
    logits = model.decision_function(design(test, cards))
    labels = test["label"].astype(np.float64)
    uncorrected = ctr_metrics(labels, logits=logits)["calibration"]
    corrected = ctr_metrics(labels, logits=correct_downsampled_logits(logits, negative_downsampling_rate(spec)))
    return uncorrected, corrected["calibration"]


def test_calibration_is_restored_by_the_logit_correction(tmp_path):
    # Measured over click-log seeds 0-4 (2026-11-28; 30,000 rows, ~300 test positives): uncorrected 3.07-4.30
    # (the down-sampled train CTR is ~4x the real one), corrected 0.928-1.093 (sampling noise of ~300 positives is
    # ~0.06). The bounds leave about twice that room.
    uncorrected, corrected = calibrations(tmp_path, seed=1)
    assert uncorrected > 2.5, uncorrected
    assert abs(corrected - 1.0) < 0.2, corrected


@pytest.mark.parametrize("rate", ["0", "1.5", "-1"])
def test_a_rate_outside_0_1_is_refused_naming_the_flag(tmp_path, capsys, rate):
    log = click_log(tmp_path / "log.csv", seed=0, rows=200)
    out = tmp_path / "out"
    argv = ["--input", log, "--output", str(out), "--label", "clicked", "--categorical", "site",
            "--negative_downsampling_rate", rate]
    assert exit_status(pc.main, argv, input_errors=pc.INPUT_ERRORS) == 2
    assert "--negative_downsampling_rate" in capsys.readouterr().err
    assert not out.exists() and not os.path.exists(str(out) + ".prepare_clicks.work")


def test_a_bad_rate_in_a_spec_names_the_file(tmp_path):
    spec = FeatureSpec.get_default_feature_spec(1, [10])
    for bad in (0, 1.5, "half", True):
        spec.metadata["negative_downsampling_rate"] = bad
        spec.to_yaml(str(tmp_path / "feature_spec.yaml"))
        with pytest.raises(FeatureSpecError, match="feature_spec.yaml.*negative_downsampling_rate"):
            negative_downsampling_rate(FeatureSpec.from_yaml(str(tmp_path / "feature_spec.yaml")))
