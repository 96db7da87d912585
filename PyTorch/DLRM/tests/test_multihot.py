"""Multi-hot features in the PyTorch DLRM (issue 17): sum-pooled bags, the same in every embedding path.

The id matrix is ``[B, sum(hotness)]`` with -1 padding; plain ``nn.EmbeddingBag`` (values + offsets), the one-buffer
fused-SGD tables and TorchRec's ``EmbeddingBagCollection`` must give the same vectors and, over training steps, the
same tables."""
import pytest
import torch

from conftest import train_steps
from dlrm.model import MultiTableEmbeddings, torchrec_available
from dlrm.model.embeddings import FusedSGDTableEmbeddings
from dlrm.model.parallel import ModelConfig, build_trainable_model

SIZES = [50, 7, 300]
HOTNESS = [1, 3, 10]
CONFIG = ModelConfig(2, SIZES, ["a", "b", "c"], 4, [8, 4], [8, 1], hotness=HOTNESS)


def _ids(batch, seed):
    """Random bags of 0..h ids per row (some empty), -1 padded, single-hot columns always filled."""
    generator = torch.Generator().manual_seed(seed)
    columns = []
    for n, h in zip(SIZES, HOTNESS):
        ids = torch.randint(0, n, (batch, h), generator=generator)
        if h > 1:
            counts = torch.randint(0, h + 1, (batch, 1), generator=generator)
            ids[torch.arange(h)[None, :] >= counts] = -1
        columns.append(ids)
    return torch.cat(columns, 1)


def _batches(count, batch=16):
    generator = torch.Generator().manual_seed(99)
    return [(torch.rand(batch, 2, generator=generator), _ids(batch, i),
             torch.randint(0, 2, (batch,), generator=generator).float()) for i in range(count)]


def test_bags_sum_the_rows_of_their_ids_and_empty_bags_are_zero():
    emb = MultiTableEmbeddings(SIZES, 4, hotness=HOTNESS)
    ids = torch.tensor([[3, 1, 2, -1, 5, 5, -1, -1, -1, -1, -1, -1, -1, -1],
                        [0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1]])
    out = emb(ids)
    weights = [t.weight.detach() for t in emb.tables]
    torch.testing.assert_close(out[0, 0], weights[0][3])
    torch.testing.assert_close(out[0, 1], weights[1][1] + weights[1][2])
    torch.testing.assert_close(out[0, 2], 2 * weights[2][5])            # a repeated id counts twice (sum)
    torch.testing.assert_close(out[1, 1], torch.zeros(4))               # no id: zeros
    fused = FusedSGDTableEmbeddings(SIZES, 4, hotness=HOTNESS)
    fused.load_state_dict(emb.state_dict())
    torch.testing.assert_close(fused(ids), out, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="14 id columns"):
        emb(ids[:, :13])


def _train(embedding_type, batches, fused_sgd=None):
    torch.manual_seed(0)
    return train_steps(build_trainable_model(CONFIG, embedding_type, torch.device("cpu"), 1, lr=0.5,
                                             fused_sgd=fused_sgd), batches)


def test_fused_and_plain_multi_hot_tables_train_the_same():
    batches = _batches(6)
    plain, fused = _train("multi_table", batches, fused_sgd=False), _train("multi_table", batches, fused_sgd=True)
    assert fused.fused_sgd and not plain.fused_sgd
    initial = _train("multi_table", [], fused_sgd=True).state_dict()
    plain_state, fused_state = plain.state_dict(), fused.state_dict()
    for key in plain_state:
        torch.testing.assert_close(fused_state[key], plain_state[key], rtol=0, atol=1e-6, msg=key)
    moved = [k for k in plain_state if k.startswith("embeddings.") and not torch.equal(initial[k], plain_state[k])]
    assert len(moved) == len(SIZES)   # every table was updated: the comparison is not vacuous


@pytest.mark.skipif(not torchrec_available(), reason="TorchRec/FBGEMM not installed")
def test_torchrec_bags_give_the_plain_vectors(monkeypatch):
    import torch.distributed as dist
    from recsys_testing import free_port
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        torchrec = build_trainable_model(CONFIG, "torchrec_fused", torch.device("cpu"), 1, lr=0.5)
        plain = build_trainable_model(CONFIG, "multi_table", torch.device("cpu"), 1, lr=0.5, fused_sgd=False)
        state = torchrec.state_dict()
        for i, key in enumerate(torchrec.table_state_keys):   # one process: each table is one whole shard
            table = state[key].local_shards()[0].tensor if hasattr(state[key], "local_shards") else state[key]
            plain.core.embeddings.tables[i].weight.data.copy_(table)
        ids = _ids(32, seed=5)
        torch.testing.assert_close(torchrec.core.embeddings(ids), plain.core.embeddings(ids), rtol=0, atol=1e-6)
    finally:
        dist.destroy_process_group()


def test_hash_indices_keep_the_padding():
    config = ModelConfig(2, SIZES, ["a", "b", "c"], 4, [8, 4], [8, 1], hash_indices=True, hotness=HOTNESS)
    model = build_trainable_model(config, "multi_table", torch.device("cpu"), 1, lr=0.1).core
    ids = _ids(4, seed=3)
    big = torch.where(ids >= 0, ids + torch.tensor([50] + [7] * 3 + [300] * 10), ids)   # + one table size
    numerical = torch.rand(4, 2)
    torch.testing.assert_close(model(numerical, big), model(numerical, ids))


def test_checkpoint_config_from_before_multi_hot_loads_single_hot():
    """A meta.json written before the ``hotness`` field existed still loads (as single-hot); other fields stay
    required."""
    import pytest
    from dlrm.serving import ModelMismatchError, config_from_meta

    saved = dict(num_numerical_features=13, table_sizes=[10, 20], feature_names=["c0", "c1"], embedding_dim=8,
                 bottom_mlp_sizes=[16, 8], top_mlp_sizes=[8, 1], interaction_op="dot", self_interaction=False,
                 hash_indices=False)
    config = config_from_meta({"config": saved}, "ckpt")
    assert config.hotness == [1, 1] and not config.multi_hot
    del saved["embedding_dim"]
    with pytest.raises(ModelMismatchError, match="embedding_dim"):
        config_from_meta({"config": saved}, "ckpt")
