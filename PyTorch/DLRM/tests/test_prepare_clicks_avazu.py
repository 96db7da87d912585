"""A user's raw click log end to end: Avazu rows as they come -> ``preproc/prepare_clicks.py`` -> DLRM -> test AUC,
against the one-hot logistic regression on the same prepared data.

Data: the 999-row Avazu sample (24 columns, hex ids, ``click`` label; skipped when absent, an error under
RECSYS_REQUIRE_DATA=1), 18 categorical columns (ids by frequency, values seen once -> the rare id), C15/C16 (banner
width/height) as numericals (log(x + 3)); three random 70/30 splits (``--seed 0, 1, 2``: ~708 train / ~291 test
rows each), since one 291-row test set is too noisy (single-split AUC differences spread over +-0.1).
Baseline: ``recsys_common.logistic_baseline`` (scikit-learn, C=1), deterministic up to float order (see
BASELINE_TOLERANCE).
"""
import statistics

import pytest

from dlrm.train import main
from recsys_testing import prepare_avazu_splits, seed_study_margin

DLRM_ARGS = ["--base_device", "cpu", "--nofp16", "--embedding_type", "multi_table", "--Adam_embedding_optimizer",
             "--Adam_MLP_optimizer", "--lr", "0.005", "--warmup_steps", "0", "--decay_steps", "0", "--epochs", "2",
             "--embedding_dim", "4", "--bottom_mlp_sizes", "8,4", "--top_mlp_sizes", "16,1", "--batch_size", "32",
             "--test_batch_size", "1024", "--shuffle", "--print_freq", "0", "--seed", "1"]
BASELINE = [0.6832, 0.6381, 0.7071]      # LR test AUC of splits 0, 1, 2 (mean 0.6761)
# The LR fit is deterministic on one machine, not across CPUs: lbfgs stops at its tolerance (1e-4), and where it
# stops depends on the float summation order, which the BLAS kernels pick per CPU. The same problem with its
# training rows or one-hot columns permuted (10 + 10 orders and float64 per split, measured 2026-11-28, AMD EPYC)
# moved the test AUC by up to 0.0010; an Intel Xeon without AVX512-BF16 gave 0.6389 on split 1 (+0.0008).
# BASELINE_TOLERANCE is 3x the measured spread, still far below what a change of the data moves (another split or
# row set: +-0.05 and more).
BASELINE_TOLERANCE = 3e-3
# DLRM's mean test AUC over the three splits with DLRM_ARGS and --seed 1..N, measured 2026-11-25 (torch 2.13 CPU,
# AMD EPYC, 2 shared cores):
MEASURED = [0.6766, 0.6892, 0.6370, 0.6712, 0.6634, 0.6690, 0.6680, 0.6779]
# mean 0.6690, sd 0.0151: DLRM is not ahead of LR on 999 rows (lead -0.007 on average; on MovieLens-1M it is,
# tests/test_movielens_accuracy.py). What is asserted is robust to the seed: the mean AUC stays above the study's
# mean - 3 sd, i.e. at most MARGIN below LR's; a model that learned nothing is at 0.5, one that sees only the two
# numericals near 0.55.
MARGIN = seed_study_margin(MEASURED, BASELINE)   # -0.053


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return prepare_avazu_splits(tmp_path_factory)   # the recipe's prepare_clicks is this same tool


def test_dlrm_on_a_prepared_raw_click_log(datasets, tmp_path):
    from preproc import logistic_baseline
    baseline = [logistic_baseline.main(["--dataset", d]) for d in datasets]
    assert baseline == pytest.approx(BASELINE, abs=BASELINE_TOLERANCE)   # beyond float order: the data changed
    aucs = []
    for i, dataset in enumerate(datasets):
        result = main(["--dataset", dataset, "--log_path", str(tmp_path / f"log{i}.json"), *DLRM_ARGS])
        assert 280 <= result["test_samples"] <= 310
        aucs.append(result["auc"])
    print(f"Avazu 999 rows, 3 splits: DLRM {aucs} (mean {statistics.mean(aucs):.4f}), "
          f"LR {baseline} (mean {statistics.mean(baseline):.4f})")
    assert statistics.mean(aucs) > statistics.mean(baseline) + MARGIN, (aucs, baseline)
