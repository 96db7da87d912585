import pytest
import torch

from neumf.data import duplicate_mask
from neumf import GMF, MLP, NeuMF, build_model


@pytest.mark.parametrize("name", ["neumf", "gmf", "mlp"])
def test_every_model_maps_pairs_to_one_logit(name):
    model = build_model(name, num_users=7, num_items=11, factors=4, layers=[8, 6, 2], dropout=0.1)
    out = model(torch.tensor([0, 6, 3]), torch.tensor([10, 0, 5]))
    assert out.shape == (3,) and out.dtype == torch.float32


def test_neumf_is_the_predictor_over_concatenated_branches():
    torch.manual_seed(0)
    model = NeuMF(5, 6, factors=3, layers=[4, 2], dropout=0.0).eval()
    u, i = torch.tensor([1, 4]), torch.tensor([0, 5])
    gmf = model.gmf.user_embedding(u) * model.gmf.item_embedding(i)
    h = torch.cat([model.mlp.user_embedding(u), model.mlp.item_embedding(i)], 1)
    mlp = torch.relu(model.mlp.mlp[0](h))
    expected = model.predictor.linear(torch.cat([gmf, mlp], 1)).squeeze(1)
    torch.testing.assert_close(model(u, i), expected)


def test_gmf_is_a_weighted_inner_product():
    model = GMF(5, 6, factors=3)
    u, i = torch.tensor([2]), torch.tensor([3])
    w, b = model.predictor.linear.weight[0], model.predictor.linear.bias[0]
    expected = (model.gmf.user_embedding.weight[2] * model.gmf.item_embedding.weight[3] * w).sum() + b
    torch.testing.assert_close(model(u, i)[0], expected)


def test_initialisation_follows_the_recipe():
    torch.manual_seed(0)
    model = NeuMF(2000, 3000, factors=64, layers=[256, 128, 64], dropout=0.5)
    assert abs(model.gmf.user_embedding.weight.std().item() - 0.01) < 0.001
    assert abs(model.mlp.item_embedding.weight.std().item() - 0.01) < 0.001
    first = model.mlp.mlp[0]
    limit = (6 / (256 + 128)) ** 0.5  # Glorot uniform
    assert first.weight.abs().max() <= limit and first.weight.abs().max() > 0.95 * limit
    last = model.predictor.linear
    assert last.weight.abs().max() <= (3 / last.weight.shape[1]) ** 0.5  # LeCun uniform
    assert torch.count_nonzero(first.bias) == 0
    assert model.mlp.user_embedding.weight.shape == (2000, 128)  # layers[0] // 2


def test_dropout_zero_means_no_dropout_layers():
    assert not any(isinstance(m, torch.nn.Dropout) for m in MLP(3, 3, layers=[4, 2], dropout=0.0).modules())
    assert any(isinstance(m, torch.nn.Dropout) for m in MLP(3, 3, layers=[4, 2], dropout=0.5).modules())


def test_odd_first_layer_is_rejected():
    with pytest.raises(ValueError, match="must be even"):
        MLP(3, 3, layers=[5, 2], dropout=0.0)


def test_duplicate_mask_keeps_the_first_occurrence():
    cands = torch.tensor([[7, 3, 7, 1, 3, 3], [1, 2, 3, 4, 5, 6]])
    assert duplicate_mask(cands).tolist() == [[False, False, True, False, True, True], [False] * 6]
