"""The NCF paper's training protocol: negatives that exclude the user's training positives, GMF and MLP pretraining
fused into NeuMF (alpha-weighted predictor), SGD for the fused model, L2 on the looked-up embedding rows."""
import os
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from neumf import checkpointing as ncf_checkpointing, cli as ncf_cli, train as ncf_train
from neumf.data import DatasetError, PositiveSet, TrainEpochs, load_dataset
from neumf import GMF, MLP, NeuMF, neumf_state_from_pretrained


def _negatives(train, seed=3, epoch=0):
    users, items = [], []
    for u, i, y in train.epoch(seed, epoch):
        users.append(u[y == 0]); items.append(i[y == 0])
    return torch.cat(users), torch.cat(items)


def test_excluding_negatives_never_hit_a_training_positive_and_resume_exactly(tiny_data):
    data = load_dataset(tiny_data)
    kwargs = dict(users=data.train_users, items=data.train_items, num_items=data.num_items, negative_samples=4,
                  global_batch_size=4096, rank=0, world_size=1, device=torch.device("cpu"))
    approximate = _negatives(TrainEpochs(**kwargs))
    positives = PositiveSet(data.train_users, data.train_items, data.num_items, torch.device("cpu"))
    assert positives.contains(*approximate).any()  # NVIDIA's sampling does collide: the check below can fail
    excluding = TrainEpochs(**kwargs, exclude_positives=True)
    users, items = _negatives(excluding)
    assert len(users) == 4 * len(data.train_users)
    assert not positives.contains(users, items).any()
    # still uniform over the allowed items: every item is drawn, none overwhelmingly
    counts = torch.bincount(items, minlength=data.num_items)
    assert (counts > 0).float().mean() > 0.95
    again = _negatives(TrainEpochs(**kwargs, exclude_positives=True))
    assert torch.equal(items, again[1])  # seeded by (seed, epoch, rank) only


def test_excluding_negatives_over_ranks_exclude_other_ranks_positives():
    users = np.array([0, 0, 1, 1]); items = np.array([0, 1, 0, 1])   # rank 1 holds user 1's positives only
    train = TrainEpochs(users, items, 3, 5, 20, 0, 2, torch.device("cpu"), exclude_positives=True)
    u, i = _negatives(train)
    assert (i == 2).all()  # items 0 and 1 are positives of both users, whichever rank holds them


def test_a_user_with_every_item_cannot_have_negatives():
    with pytest.raises(DatasetError, match="user 1 interacted with all 2 items"):
        TrainEpochs(np.array([0, 1, 1]), np.array([0, 0, 1]), 2, 1, 4, 0, 1, torch.device("cpu"),
                    exclude_positives=True)


def test_fused_neumf_starts_as_the_alpha_weighted_sum_of_its_pretrained_branches():
    torch.manual_seed(0)
    gmf, mlp = GMF(5, 7, factors=4), MLP(5, 7, layers=[8, 4], dropout=0.0)
    neumf = NeuMF(5, 7, factors=4, layers=[8, 4], dropout=0.0)
    neumf.load_state_dict(neumf_state_from_pretrained(gmf.state_dict(), mlp.state_dict(), alpha=0.3))
    u, i = torch.arange(5), torch.arange(5) + 1
    assert torch.allclose(neumf(u, i), 0.3 * gmf(u, i) + 0.7 * mlp(u, i), atol=1e-6)
    with pytest.raises(ValueError, match="GMF checkpoint does not hold a GMF"):
        neumf_state_from_pretrained(mlp.state_dict(), mlp.state_dict())


def test_l2_embedding_adds_the_looked_up_rows_squared_norms():
    torch.manual_seed(0)
    model = GMF(4, 6, factors=3)
    users, items, labels = torch.tensor([0, 0, 2]), torch.tensor([1, 5, 1]), torch.tensor([1.0, 0.0, 1.0])
    plain = ncf_train.batch_loss_fn(model, nullcontext)(users, items, labels)
    reg = ncf_train.batch_loss_fn(model, nullcontext, 0.5)(users, items, labels)
    expected = 0.5 * (model.gmf.user_embedding.weight[users].pow(2).sum()
                      + model.gmf.item_embedding.weight[items].pow(2).sum())
    assert torch.allclose(reg - plain, expected)


def test_pretraining_pipeline_end_to_end(tiny_data, tmp_path):
    """GMF and MLP trained with ncf.py, then NeuMF initialised from both and trained with SGD; the fused model's
    first evaluation is not worse than chance and the run completes; flag errors are refused up front."""
    common = ["--data", tiny_data, "-b", "4096", "-f", "8", "--layers", "16", "8", "--dropout", "0", "--seed", "1",
              "--exclude_positives"]
    for model in ("gmf", "mlp"):
        ncf_train.main([*common, "--model", model, "-e", "2", "-l", "0.01", "-b1", "0.9", "-b2", "0.999",
                  "--checkpoint_dir", str(tmp_path / model), "--log_path", str(tmp_path / f"{model}.json")])
    summary = ncf_train.main([*common, "-e", "1", "--optimizer", "sgd", "-l", "0.05", "--l2_embedding", "1e-4",
                        "--pretrained_gmf", str(tmp_path / "gmf" / "model.pth"),
                        "--pretrained_mlp", str(tmp_path / "mlp" / "model.pth"), "--log_path", str(tmp_path / "n.json")])
    assert summary["best_hr@10"] > 0.1, summary  # 10 of 101 candidates: chance is 0.099
    with pytest.raises(SystemExit):
        ncf_cli.parse_args(["--data", tiny_data, "--pretrained_gmf", "x"])
    with pytest.raises(ncf_train.INPUT_ERRORS):  # swapped: refused with a message naming the files
        ncf_train.main([*common, "-e", "1", "--pretrained_gmf", str(tmp_path / "mlp" / "model.pth"),
                  "--pretrained_mlp", str(tmp_path / "gmf" / "model.pth"), "--log_path", str(tmp_path / "x.json")])
    assert os.path.isfile(tmp_path / "n.json")


def test_learning_rate_decay_sets_each_epochs_rate_and_resumes_at_it(tiny_data, tmp_path):
    """--learning_rate_decay d: epoch e trains at -l x d^e (the optimizer's rate saved after the last epoch says so),
    and a run resumed after epoch 1 continues at the same rates: its weights equal the uninterrupted run's."""
    common = ["--data", tiny_data, "-b", "4096", "--model", "gmf", "-f", "8", "--dropout", "0", "--seed", "1",
              "-l", "0.01", "--learning_rate_decay", "0.5", "-b1", "0.9", "-b2", "0.999"]
    ncf_train.main([*common, "-e", "3", "--checkpoint_dir", str(tmp_path / "a"), "--log_path", str(tmp_path / "a.json")])
    straight = ncf_checkpointing.read_checkpoint(str(tmp_path / "a" / ncf_checkpointing.RESUME_CHECKPOINT))
    assert [g["lr"] for g in straight["optimizer"]["param_groups"]] == [pytest.approx(0.01 * 0.5 ** 2)]
    ncf_train.main([*common, "-e", "2", "--checkpoint_dir", str(tmp_path / "b"), "--log_path", str(tmp_path / "b.json")])
    ncf_train.main([*common, "-e", "3", "--checkpoint_dir", str(tmp_path / "b"), "--resume",
              "--log_path", str(tmp_path / "b.json")])
    resumed = ncf_checkpointing.read_checkpoint(str(tmp_path / "b" / ncf_checkpointing.RESUME_CHECKPOINT))
    for key, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][key]), key
    with pytest.raises(SystemExit):
        ncf_cli.parse_args(["--data", tiny_data, "--learning_rate_decay", "0"])


def test_mode_test_evaluates_the_fused_model_before_training(tiny_data, tmp_path):
    """--mode test with --pretrained_gmf/--pretrained_mlp scores NeuMF as fused (the alpha-weighted ensemble of the
    two branches): alpha 1 gives exactly the GMF's metrics, alpha 0 the MLP's."""
    common = ["--data", tiny_data, "-b", "4096", "-f", "8", "--layers", "16", "8", "--dropout", "0", "--seed", "1"]
    tested = {}
    for model in ("gmf", "mlp"):
        ncf_train.main([*common, "--model", model, "-e", "1", "-l", "0.01", "--checkpoint_dir", str(tmp_path / model),
                  "--log_path", str(tmp_path / f"{model}.json")])
        tested[model] = ncf_train.main([*common, "--model", model, "--mode", "test", "--checkpoint_dir",
                                  str(tmp_path / model), "--log_path", str(tmp_path / f"{model}_t.json")])
    pretrained = ["--pretrained_gmf", str(tmp_path / "gmf" / "model.pth"),
                  "--pretrained_mlp", str(tmp_path / "mlp" / "model.pth")]
    for alpha, model in (("1", "gmf"), ("0", "mlp")):
        fused = ncf_train.main([*common, "--mode", "test", *pretrained, "--alpha", alpha,
                          "--log_path", str(tmp_path / f"f{alpha}.json")])
        assert fused["hr@10"] == tested[model]["hr@10"] and fused["ndcg@10"] == pytest.approx(tested[model]["ndcg@10"])


def test_embedding_init_std_and_dot_product_gmf(tiny_data, tmp_path):
    """--embedding_init_std s draws every embedding from N(0, s) (0.01, NVIDIA's, by default: the same weights as
    before the flag existed); --gmf_dot_product trains GMF with h fixed to ones (a plain dot product plus a learned
    bias), saved as an ordinary GMF checkpoint that fuses into NeuMF; both refused where they cannot apply."""
    from neumf import build_model
    torch.manual_seed(5)
    default = build_model("neumf", 3000, 3000, 32, [64, 32], 0.0)
    torch.manual_seed(5)
    wide = build_model("neumf", 3000, 3000, 32, [64, 32], 0.0, embedding_init_std=0.1)
    for name, table in default.named_parameters():
        if "embedding" in name:
            assert float(table.std()) == pytest.approx(0.01, rel=0.02), name
            assert float(dict(wide.named_parameters())[name].std()) == pytest.approx(0.1, rel=0.02), name
    assert ncf_cli.parse_args(["--data", "d"]).embedding_init_std == 0.01
    common = ["--data", tiny_data, "-b", "4096", "--model", "gmf", "-f", "8", "--seed", "1", "-e", "2",
              "--optimizer", "sgd", "-l", "8", "--embedding_init_std", "0.1", "--l2_embedding", "0.0025"]
    ncf_train.main([*common, "--gmf_dot_product", "--checkpoint_dir", str(tmp_path / "dot"),
              "--log_path", str(tmp_path / "dot.json")])
    ncf_train.main([*common, "--checkpoint_dir", str(tmp_path / "h"), "--log_path", str(tmp_path / "h.json")])
    dot = ncf_checkpointing.read_checkpoint(str(tmp_path / "dot" / ncf_checkpointing.RESUME_CHECKPOINT))["model"]
    learned = ncf_checkpointing.read_checkpoint(str(tmp_path / "h" / ncf_checkpointing.RESUME_CHECKPOINT))["model"]
    assert torch.equal(dot["predictor.linear.weight"], torch.ones(1, 8))        # fixed, through two SGD epochs
    assert not torch.equal(learned["predictor.linear.weight"], torch.ones(1, 8))  # the same run without the flag
    assert float(dot["predictor.linear.bias"]) != 0.0                              # the bias is still learned
    assert 0.05 < float(dot["gmf.item_embedding.weight"].std()) < 0.2              # drawn at 0.1, not 0.01
    users, items = dot["gmf.user_embedding.weight"].shape[0], dot["gmf.item_embedding.weight"].shape[0]
    mlp = MLP(users, items, layers=[16, 8], dropout=0.0).state_dict()
    fused = NeuMF(users, items, factors=8, layers=[16, 8], dropout=0.0)
    fused.load_state_dict(neumf_state_from_pretrained(dot, mlp, alpha=0.7))
    assert torch.allclose(fused.predictor.linear.weight[0, :8], torch.full((8,), 0.7))
    for bad in (["--gmf_dot_product"], ["--model", "gmf", "--embedding_init_std", "0"]):
        with pytest.raises(SystemExit):
            ncf_cli.parse_args(["--data", tiny_data, *bad])
