"""Model parts against hand-computed references."""
import pytest
import torch

from dlrm.model import DLRM, CatInteraction, DotInteraction, MultiTableEmbeddings, TopMLP
from dlrm.model.interaction import make_interaction


def test_dot_interaction_matches_explicit_pairs():
    torch.manual_seed(0)
    bottom, emb = torch.randn(3, 4), torch.randn(3, 5, 4)
    out = DotInteraction(5, 4)(bottom, emb)
    z = torch.cat([bottom.unsqueeze(1), emb], 1)
    pairs = [(z[:, i] * z[:, j]).sum(1) for i in range(6) for j in range(i)]
    expected = torch.cat([bottom, torch.stack(pairs, 1)], 1)
    assert out.shape == (3, 4 + 15)
    torch.testing.assert_close(out, expected)


def test_self_interaction_adds_diagonal():
    out = DotInteraction(5, 4, self_interaction=True)(torch.randn(2, 4), torch.randn(2, 5, 4))
    assert out.shape == (2, 4 + 21)


def test_cat_interaction_and_width_checks():
    out = CatInteraction(3, 4, bottom_width=7)(torch.ones(2, 7), torch.ones(2, 3, 4))
    assert out.shape == (2, 19)
    with pytest.raises(ValueError, match="embedding_dim"):
        make_interaction("dot", 3, 8, bottom_width=16)
    with pytest.raises(ValueError, match="end with 1"):
        TopMLP(10, [4, 2])


def test_embedding_bag_tables_look_up_rows():
    emb = MultiTableEmbeddings([10, 20], 3)
    ids = torch.tensor([[1, 19], [9, 0]])
    out = emb(ids)
    torch.testing.assert_close(out[1, 0], emb.tables[0].weight[9])
    torch.testing.assert_close(out[0, 1], emb.tables[1].weight[19])
    bound = (1 / 20) ** 0.5
    assert emb.tables[1].weight.abs().max() <= bound


def test_hash_indices_wraps_ids():
    torch.manual_seed(0)
    emb = MultiTableEmbeddings([10, 20], 4)
    model = DLRM(2, [10, 20], 4, [8, 4], [8, 1], emb, hash_indices=True)
    numerical = torch.randn(2, 2)
    wrapped = model(numerical, torch.tensor([[13, 45], [10, 20]]))
    direct = model(numerical, torch.tensor([[3, 5], [0, 0]]))
    torch.testing.assert_close(wrapped, direct)


def test_dlrm_trains_on_a_learnable_toy_problem():
    torch.manual_seed(0)
    model = DLRM(2, [50], 8, [16, 8], [16, 1], MultiTableEmbeddings([50], 8, sparse=False))
    ids = torch.randint(0, 50, (512, 1))
    labels = (ids[:, 0] % 2).float()
    numerical = torch.randn(512, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    first = loss_fn(model(numerical, ids), labels).item()
    for _ in range(100):
        optimizer.zero_grad()
        loss = loss_fn(model(numerical, ids), labels)
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.2 < first


def test_the_planner_gets_this_machines_memory(monkeypatch):
    """TorchRec's planner is told the memory it may use (not its 32 GiB HBM / 128 GiB host defaults): on the CPU the
    host's memory shared by the processes of the node (the GPU's own total memory on CUDA, not testable here)."""
    import os

    import torch
    from dlrm.model.parallel import device_memory_caps
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert device_memory_caps(torch.device("cpu")) == {"ddr_cap": host // 2}
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert device_memory_caps(torch.device("cpu")) == {"ddr_cap": host}
