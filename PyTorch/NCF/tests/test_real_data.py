"""Accuracy on real MovieLens data (../shared/data): the NCF paper's ML-1M split and ML-100K.

The training runs are marked slow; CI runs them (RECSYS_REQUIRE_DATA=1 turns a missing dataset into a failure).
Configurations and measured numbers are in the README ("Results measured here").
"""
import os
from contextlib import nullcontext

import pytest
import torch

from neumf.data import convert
from neumf import evaluation as ncf_evaluation, train as ncf_train
from neumf.data import EvalSet, load_dataset
from neumf import Popularity
from recsys_testing import shared_data_path

# Tuned for 2 CPU cores: small embeddings, paper-style Adam, no dropout.
# --select_on test: these reproduce published best-of-test figures (NVIDIA's and the paper's code's protocol).
ML1M_NEUMF = ["-b", "8192", "-l", "0.003", "-b1", "0.9", "-b2", "0.999", "--dropout", "0", "--seed", "1",
              "-f", "32", "--layers", "64", "32", "16", "--select_on", "test"]


@pytest.fixture(scope="module")
def paper_ml1m(tmp_path_factory):
    """The NCF paper's ML-1M split for users 0..2997 (train rows rebuilt from the partial ratings.dat)."""
    test_dir = shared_data_path("ncf-ml-1m")
    ratings = os.path.join(shared_data_path("movielens", "ml-1m"), "ratings.users-1-2999.dat.gz")
    split = convert.convert_paper_split(os.path.join(test_dir, "ml-1m"), ratings, max_user=2997)
    out = str(tmp_path_factory.mktemp("paper") / "ml-1m-paper")
    convert.write_split(split, out)
    return out


@pytest.fixture(scope="module")
def ml100k(tmp_path_factory):
    raw = os.path.join(shared_data_path("movielens", "ml-100k"), "u.data")
    out = str(tmp_path_factory.mktemp("ml100k") / "ml-100k")
    convert.write_split(convert.convert_ratings(raw, valid_negative=100, seed=1), out)
    return out


def test_paper_split_rebuilt_exactly(paper_ml1m):
    data = load_dataset(paper_ml1m)
    assert (data.num_users, data.samples_per_series) == (2998, 100)
    assert data.num_items == 3706            # all of ML-1M's rated movies appear in the test negatives
    assert len(data.train_users) == 484_517  # every rating of users 1..2998 except their test rating


def test_popularity_baseline_reproduces_the_published_figure(paper_ml1m):
    data = load_dataset(paper_ml1m)
    model = Popularity(torch.as_tensor(data.train_items), data.num_items)
    metrics = ncf_evaluation.evaluate(model, EvalSet(data, 0, 1, torch.device("cpu")), 10, 2 ** 20, nullcontext)
    assert metrics["hr"] == pytest.approx(0.469, abs=0.001)
    assert metrics["ndcg"] == pytest.approx(0.266, abs=0.001)


@pytest.mark.slow
def test_neumf_reaches_hr_0_67_on_the_paper_split(paper_ml1m, tmp_path):
    summary = ncf_train.main(["--data", paper_ml1m, "-e", "6", "-t", "0.67", *ML1M_NEUMF,
                        "--log_path", str(tmp_path / "log.json")])
    assert summary["best_hr@10"] >= 0.67, summary
    assert summary["best_ndcg@10"] >= 0.39, summary
    assert summary["time_to_target"] is not None and summary["time_to_target"] < 600


@pytest.mark.slow
def test_neumf_on_ml100k_with_the_recipe_protocol(ml100k, tmp_path):
    summary = ncf_train.main(["--data", ml100k, "-e", "5", *ML1M_NEUMF, "--log_path", str(tmp_path / "l.json")])
    assert summary["best_hr@10"] >= 0.58, summary  # measured 0.614 (epoch 4)
    assert summary["best_ndcg@10"] >= 0.32, summary  # measured 0.343


# The NCF paper's protocol, shortened to fit CI (the full configuration, its commands and per-seed figures are in the
# README, "Pretraining: GMF + MLP -> NeuMF"): negatives that exclude training positives, L2 on the embedding rows and
# a decaying rate for GMF, GMF and MLP pretrained with Adam, NeuMF initialised from both (alpha 0.7, the README's
# choice) and trained one epoch with a small Adam rate. Floors: see PAPER_SHORT_FLOOR's comment. The configuration
# that reaches HR@10 0.73 (README, "Configuration reaching 0.73") differs in its GMF stage: 80 SGD epochs of a
# dot-product MF (--gmf_dot_product --embedding_init_std 0.1), 4-5 minutes per seed even on a quiet machine (epochs
# of 3-4 s at load ~2) on top of this test, so CI keeps this shortened Adam protocol; the two new flags are tested
# in test_pretraining.py.
PAPER_COMMON = ["-b", "2048", "--dropout", "0", "--exclude_positives", "-b1", "0.9", "-b2", "0.999",
                "--select_on", "test"]
PAPER_GMF = ["--model", "gmf", "-f", "64", "-l", "0.002", "--l2_embedding", "0.01", "--learning_rate_decay", "0.92",
             "-e", "4"]
PAPER_MLP = ["--model", "mlp", "--layers", "64", "32", "16", "-l", "0.002", "-e", "3"]
PAPER_NEUMF = ["-f", "64", "--layers", "64", "32", "16", "--alpha", "0.7", "-l", "0.0002", "--l2_embedding", "0.005",
               "-e", "1"]
# Measured (2026-11-25, AMD EPYC, loaded): fused HR@10 / NDCG@10 0.6481 / 0.3738 (seed 1), 0.6498 / 0.3759 (seed 2),
# 0.6601 / 0.3818 (seed 3); HR@10 of GMF alone 0.6378 / 0.6468 / 0.6531, MLP alone 0.5871 / 0.5977 / 0.6027. The floors are about 2 standard errors of one seed (~0.009)
# under the lowest (popularity scores 0.469 / 0.266): a regression of the model, sampling or fusion costing more than
# about 0.02 fails.
PAPER_SHORT_FLOOR = (0.63, 0.36)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_pretrained_neumf_on_the_paper_split_over_seeds(paper_ml1m, tmp_path, seed):
    runs = {}
    for name, flags in (("gmf", PAPER_GMF), ("mlp", PAPER_MLP)):
        runs[name] = ncf_train.main(["--data", paper_ml1m, *PAPER_COMMON, *flags, "--seed", str(seed),
                               "--checkpoint_dir", str(tmp_path / name), "--log_path", str(tmp_path / f"{name}.json")])
    fused = ncf_train.main(["--data", paper_ml1m, *PAPER_COMMON, *PAPER_NEUMF, "--seed", str(seed),
                      "--pretrained_gmf", str(tmp_path / "gmf" / "model.pth"),
                      "--pretrained_mlp", str(tmp_path / "mlp" / "model.pth"), "--log_path", str(tmp_path / "n.json")])
    print(seed, {k: (v["best_hr@10"], v["best_ndcg@10"]) for k, v in runs.items()},
          (fused["best_hr@10"], fused["best_ndcg@10"]))
    assert fused["best_hr@10"] >= PAPER_SHORT_FLOOR[0], (runs, fused)
    assert fused["best_ndcg@10"] >= PAPER_SHORT_FLOOR[1], (runs, fused)
    # the fused model is an ensemble of its two branches trained one epoch more: not below the better one (measured
    # +0.010, +0.003 and +0.007 above it for seeds 1 to 3; 0.005 of slack for the seed spread)
    assert fused["best_hr@10"] >= max(r["best_hr@10"] for r in runs.values()) - 0.005, (runs, fused)


# The README's configuration reaching HR@10 0.73 ("Configuration reaching 0.73"), its exact commands, over three
# seeds: 15-20 minutes on 2 idle cores, so it runs on request only (RECSYS_FULL_PROTOCOL=1), not in CI.
# Measured (2026-11-25, AMD EPYC): HR@10 / NDCG@10 0.7302 / 0.4491, 0.7305 / 0.4538, 0.7348 / 0.4511 for seeds 1-3.
FULL_COMMON = ["--dropout", "0", "--exclude_positives", "-n", "8", "--select_on", "test"]
FULL_MF = ["--model", "gmf", "-f", "64", "-b", "8192", "--optimizer", "sgd", "-l", "32.768", "--l2_embedding",
           "0.0025", "--embedding_init_std", "0.1", "--gmf_dot_product", "-e", "80"]
FULL_MLP = ["-b", "2048", "-b1", "0.9", "-b2", "0.999", "--model", "mlp", "--layers", "256", "128", "64",
            "-l", "0.002", "-e", "7"]
FULL_NEUMF = ["-b", "2048", "-b1", "0.9", "-b2", "0.999", "-f", "64", "--layers", "256", "128", "64", "--alpha", "0.7",
              "-l", "0.00002", "-e", "1"]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RECSYS_FULL_PROTOCOL") != "1",
                    reason="the full 0.73 protocol takes 15-20 minutes: set RECSYS_FULL_PROTOCOL=1")
def test_the_readme_configuration_reaches_hr_0_73_over_seeds(paper_ml1m, tmp_path):
    """Mean HR@10 over seeds 1-3 at least 0.73 (the goal), each seed at least 0.72 (one seed's standard error on the
    split's 2,998 test users is ~0.008), NDCG@10 at least 0.44 each."""
    fused = []
    for seed in (1, 2, 3):
        common = ["--data", paper_ml1m, *FULL_COMMON, "--seed", str(seed)]
        directory = tmp_path / f"seed{seed}"
        for name, flags in (("mf", FULL_MF), ("mlp", FULL_MLP)):
            ncf_train.main([*common, *flags, "--checkpoint_dir", str(directory / name),
                      "--log_path", str(directory / f"{name}.json")])
        fused.append(ncf_train.main([*common, *FULL_NEUMF, "--pretrained_gmf", str(directory / "mf" / "model.pth"),
                               "--pretrained_mlp", str(directory / "mlp" / "model.pth"),
                               "--log_path", str(directory / "neumf.json")]))
        print(seed, fused[-1]["best_hr@10"], fused[-1]["best_ndcg@10"], flush=True)
    hr = [r["best_hr@10"] for r in fused]
    assert sum(hr) / len(hr) >= 0.73, hr
    assert min(hr) >= 0.72, hr
    assert min(r["best_ndcg@10"] for r in fused) >= 0.44, fused
