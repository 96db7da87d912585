"""A user's raw click log end to end: Avazu rows as they come -> ``dlrm_dcnv2.dataloading.prepare_clicks`` -> DLRM ->
test AUC, against the one-hot logistic regression on the same prepared data.

Data: the 999-row Avazu sample (24 columns, hex ids, ``click`` label; skipped when absent, an error under
RECSYS_REQUIRE_DATA=1), 18 categorical columns (ids by frequency, values seen once -> the rare id), C15/C16 (banner
width/height) as numericals (log(x + 3)); three random 70/30 splits (``--seed 0, 1, 2``: ~708 train / ~291 test
rows each), since one 291-row test set is too noisy (single-split AUC differences spread over +-0.1).
Baseline: ``recsys_common.logistic_baseline`` (scikit-learn, C=1), deterministic up to float order (see
BASELINE_TOLERANCE). The same data and study as
``PyTorch/DLRM/tests/test_prepare_clicks_avazu.py``.
"""
import statistics

import pytest

from recsys_testing import prepare_avazu_splits, seed_study_margin

from dlrm_dcnv2.train import main

FLAGS = ["--optimizer", "adam", "--learning_rate", "0.005", "--warmup_steps", "0", "--epochs", "2",
         "--embedding_dim", "4", "--bottom_mlp_dims", "8,4", "--top_mlp_dims", "16,1", "--batch_size", "32",
         "--valid_batch_size", "1024", "--print_freq", "1000", "--log_path", "", "--seed", "1"]
BASELINE = [0.6832, 0.6381, 0.7071]      # LR test AUC of splits 0, 1, 2 (mean 0.6761)
# The LR fit is deterministic on one machine, not across CPUs: lbfgs stops at its tolerance (1e-4), and where it
# stops depends on the float summation order, which the BLAS kernels pick per CPU. The same problem with its
# training rows or one-hot columns permuted (10 + 10 orders and float64 per split, measured 2026-11-28, AMD EPYC)
# moved the test AUC by up to 0.0010; an Intel Xeon without AVX512-BF16 gave 0.6389 on split 1 (+0.0008).
# BASELINE_TOLERANCE is 3x the measured spread, still far below what a change of the data moves (another split or
# row set: +-0.05 and more).
BASELINE_TOLERANCE = 3e-3
# DLRM's mean exact test AUC over the three splits with FLAGS and --seed 1..N, measured 2026-11-25 (TF 2.21 CPU,
# AMD EPYC, 2 shared cores):
MEASURED = [0.6469, 0.6701, 0.6997, 0.6811, 0.6520]
# mean 0.6700, sd 0.0216: DLRM is not ahead of LR on 999 rows (lead -0.006 on average). What is asserted is robust
# to the seed: the mean AUC stays above the study's mean - 3 sd, i.e. at most MARGIN below LR's; a model that
# learned nothing is at 0.5.
MARGIN = seed_study_margin(MEASURED, BASELINE)   # -0.071


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return prepare_avazu_splits(tmp_path_factory)   # the recipe's prepare_clicks is this same tool


def test_dlrm_on_a_prepared_raw_click_log(datasets):
    from recsys_common import logistic_baseline
    baseline = [logistic_baseline.main(["--dataset", d]) for d in datasets]
    assert baseline == pytest.approx(BASELINE, abs=BASELINE_TOLERANCE)   # beyond float order: the data changed
    aucs = [main(FLAGS + ["--dataset_path", d], model="dlrm")["auc_exact"] for d in datasets]
    print(f"Avazu 999 rows, 3 splits: DLRM {aucs} (mean {statistics.mean(aucs):.4f}), "
          f"LR {baseline} (mean {statistics.mean(baseline):.4f})")
    assert statistics.mean(aucs) > statistics.mean(baseline) + MARGIN, (aucs, baseline)
