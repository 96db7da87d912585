"""The MLPerf DLRM-DCNv2 configuration in the PyTorch recipe (issue 32, item 2): the low-rank cross interaction,
Adagrad as MLPerf's reference trains it, and the ``--mlperf_dcnv2`` preset (each part also alone).

The cross layer's agreement with the TF2 recipe's ``CrossLayer`` on the same weights is in
``ci/tests/test_cross_recipe_dcn.py`` (it needs both frameworks in one process)."""
import json

import pytest
import torch

from conftest import train_steps
from dlrm import cli
from dlrm.data import default_synthetic_info
from dlrm.model import DLRM, LowRankCrossInteraction, MultiTableEmbeddings, torchrec_available
from dlrm.model.interaction import make_interaction
from dlrm.model.parallel import ADAGRAD_EPS, ModelConfig, build_trainable_model

SIZES = [40, 9, 120]
CONFIG = ModelConfig(3, SIZES, ["a", "b", "c"], 4, [8, 6], [8, 1], interaction_op="dcn", dcn_num_layers=2,
                     dcn_low_rank_dim=5)


def test_cross_layers_compute_x0_times_low_rank_projection_plus_x():
    torch.manual_seed(0)
    cross = LowRankCrossInteraction(num_embeddings=3, embedding_dim=4, bottom_width=6, num_layers=2, low_rank=5)
    for p in cross.parameters():   # non-zero biases, so every term of the formula is exercised
        p.data.normal_()
    cross = cross.double()
    bottom, embeddings = torch.randn(7, 6, dtype=torch.float64), torch.randn(7, 3, 4, dtype=torch.float64)
    x0 = torch.cat([bottom, embeddings.reshape(7, 12)], 1)
    x = x0
    for v, u in zip(cross.down, cross.up):   # x_{l+1} = x0 * (U (V x_l) + b) + x_l, written out
        x = x0 * ((x @ v.weight.T) @ u.weight.T + u.bias) + x
    out = cross(bottom, embeddings)
    assert out.shape == (7, 6 + 3 * 4) and cross.output_width == 18
    torch.testing.assert_close(out, x, rtol=0, atol=1e-12)
    assert [tuple(v.weight.shape) for v in cross.down] == [(5, 18)] * 2   # rank 5, no bias on V
    assert all(v.bias is None for v in cross.down)


def test_dcn_needs_no_bottom_width_equal_to_the_embedding_width_and_rejects_empty_sizes():
    dlrm = DLRM(3, SIZES, 4, [8, 6], [8, 1], MultiTableEmbeddings(SIZES, 4), interaction_op="dcn",
                dcn_num_layers=2, dcn_low_rank_dim=5)
    assert dlrm.top_mlp.layers[0].in_features == 6 + 3 * 4
    assert dlrm(torch.rand(5, 3), torch.zeros(5, 3, dtype=torch.long)).shape == (5,)
    with pytest.raises(ValueError, match="dcn_num_layers"):
        make_interaction("dcn", 3, 4, 6, dcn_num_layers=0)
    with pytest.raises(ValueError, match="'dot', 'cat' or 'dcn'"):
        make_interaction("cross", 3, 4, 6)


def _batches(count, batch=32):
    generator = torch.Generator().manual_seed(7)
    return [(torch.rand(batch, 3, generator=generator),
             torch.stack([torch.randint(0, n, (batch,), generator=generator) for n in SIZES], 1),
             torch.randint(0, 2, (batch,), generator=generator).float()) for _ in range(count)]


def test_adagrad_updates_the_mlps_and_the_tables_as_torch_adagrad_does():
    """The recipe's Adagrad (sparse table gradients) equals dense ``torch.optim.Adagrad`` over every parameter."""
    batches = _batches(4)
    torch.manual_seed(1)
    ours = build_trainable_model(CONFIG, "multi_table", torch.device("cpu"), 1, lr=0.05, adagrad=True)
    assert not ours.fused_sgd and isinstance(ours.embedding_optimizer, torch.optim.Adagrad)
    reference = DLRM(3, SIZES, 4, [8, 6], [8, 1], MultiTableEmbeddings(SIZES, 4, sparse=False),
                     interaction_op="dcn", dcn_num_layers=2, dcn_low_rank_dim=5)
    reference.load_state_dict(ours.core.state_dict())
    initial = {k: v.clone() for k, v in reference.state_dict().items()}
    optimizer = torch.optim.Adagrad(reference.parameters(), lr=0.05, eps=1e-10)
    train_steps(ours, batches)
    for numerical, categorical, label in batches:
        optimizer.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(reference(numerical, categorical), label).backward()
        optimizer.step()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(ours.core.state_dict()[key], value, rtol=0, atol=1e-6, msg=key)
        assert not torch.equal(value, initial[key]), f"{key} did not move: the comparison would be vacuous"
    assert ADAGRAD_EPS == 1e-10


@pytest.mark.skipif(not torchrec_available(), reason="TorchRec/FBGEMM not installed")
def test_fused_torchrec_adagrad_tables_match_the_plain_ones(monkeypatch):
    import torch.distributed as dist
    from recsys_testing import free_port
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        torch.manual_seed(2)
        fused = build_trainable_model(CONFIG, "torchrec_fused", torch.device("cpu"), 1, lr=0.05, adagrad=True,
                                      local_batch_size=32)
        plain = build_trainable_model(CONFIG, "multi_table", torch.device("cpu"), 1, lr=0.05, adagrad=True)
        state = fused.state_dict()
        tables = [(state[k].local_shards()[0].tensor if hasattr(state[k], "local_shards") else state[k]).clone()
                  for k in fused.table_state_keys]
        plain.core.load_state_dict({k: v for k, v in state.items() if not k.startswith("embeddings.")},
                                   strict=False)
        for i, table in enumerate(tables):
            plain.core.embeddings.tables[i].weight.data.copy_(table)
        batches = _batches(3)
        train_steps(fused, batches)
        train_steps(plain, batches)
        state = fused.state_dict()
        for i, key in enumerate(fused.table_state_keys):
            table = state[key].local_shards()[0].tensor if hasattr(state[key], "local_shards") else state[key]
            torch.testing.assert_close(table, plain.core.embeddings.tables[i].weight.detach(), rtol=0, atol=1e-5)
            assert not torch.equal(table, tables[i])
    finally:
        dist.destroy_process_group()


def _settle(argv, device="cpu", rows=1_000_000, monkeypatch=None):
    monkeypatch.setattr(cli, "train_rows", lambda flag_values, info: rows)
    flag_values, given = cli.read_flags(["--dataset", "/nonexistent"] + argv)
    return cli.settle(flag_values, given, device_type=device, info=default_synthetic_info([1000] * 26, 13),
                      memory_bytes=23 * 2 ** 30)


def test_the_mlperf_preset_sets_every_part_and_each_flag_given_wins(monkeypatch):
    config, line = _settle(["--mlperf_dcnv2"], device="cuda", monkeypatch=monkeypatch)
    assert line is None
    assert (config.interaction_op, config.dcn_num_layers, config.dcn_low_rank_dim, config.embedding_dim) == \
        ("dcn", 3, 512, 128)
    assert config.bottom_mlp_sizes == ("512", "256", "128")
    assert config.top_mlp_sizes == ("1024", "1024", "512", "256", "1")
    assert (config.adagrad, config.lr, config.batch_size) == (True, 0.005, 65536)
    assert (config.max_table_size, config.hash_indices) == (40_000_000, True)
    assert (config.warmup_steps, config.decay_steps) == (0, 0)
    assert "interaction_op" not in config.given_flags   # given_flags stay what the command line set
    config, _ = _settle(["--mlperf_dcnv2", "--dcn_low_rank_dim", "64", "--lr", "0.01"], device="cuda",
                        monkeypatch=monkeypatch)
    assert (config.dcn_low_rank_dim, config.lr, config.dcn_num_layers) == (64, 0.01, 3)
    alone, _ = _settle(["--interaction_op", "dcn"], device="cuda", monkeypatch=monkeypatch)
    assert (alone.interaction_op, alone.adagrad, alone.lr, alone.embedding_dim) == ("dcn", False, 28.0, 128)


def test_the_preset_on_a_cpu_scales_mlperfs_rate_and_keeps_its_flat_schedule(monkeypatch):
    config, line = _settle(["--mlperf_dcnv2"], monkeypatch=monkeypatch)
    assert config.batch_size < 65536
    # Adagrad: the square-root rule from MLPerf's 0.005 at 65536
    assert config.lr == pytest.approx(0.005 * (config.batch_size / 65536) ** 0.5, rel=5e-3)
    assert (config.warmup_steps, config.decay_start_step, config.decay_steps) == (0, 0, 0)
    assert f"--lr {config.lr:g} (MLPerf's 0.005 x sqrt({config.batch_size}/65536))" in line


def _preset_run(dataset, tmp_path, name, *more):
    from dlrm.train import main
    return main(["--mlperf_dcnv2", "--base_device", "cpu", "--dataset", str(dataset), "--batch_size", "512",
                 "--embedding_dim", "16", "--dcn_low_rank_dim", "32", "--log_path", str(tmp_path / f"{name}.json"),
                 "--save_checkpoint_path", str(tmp_path / name), "--nofp16", "--seed", "1", *more])


def test_the_preset_trains_mlperf_shaped_data_and_resumes_adagrad_exactly(tmp_path):
    """End to end: MLPerf-shaped multi-hot data from the generator, the preset (fused Adagrad tables, DCN), and a
    resume from a step-4 checkpoint that equals the uninterrupted run bit for bit (Adagrad's accumulators resume)."""
    from recsys_common import synthetic
    from dlrm.checkpointing import checkpoint_name, read_tensors
    dataset = tmp_path / "data"
    synthetic.main(["--mlperf_dcnv2", "--max_table_size", "300", "--size", "4096", "--test_size", "2048",
                    "--output", str(dataset)])
    straight = _preset_run(dataset, tmp_path, "straight")
    assert straight["embedding_type"] == "torchrec_fused" and straight["global_step"] == 8
    assert straight["auc"] > 0.56   # 0.59-0.62 over seeds and precisions; an untrained model scores 0.5
    meta = json.loads((tmp_path / "straight" / checkpoint_name(8) / "meta.json").read_text())
    assert meta["config"]["hotness"] == list(synthetic.MLPERF_HOTNESS)
    assert (meta["config"]["interaction_op"], meta["config"]["dcn_num_layers"]) == ("dcn", 3)
    _preset_run(dataset, tmp_path, "resumed", "--max_steps", "4")
    resumed = _preset_run(dataset, tmp_path, "resumed", "--load_checkpoint_path", str(tmp_path / "resumed"))
    assert resumed["auc"] == straight["auc"]
    left = read_tensors(tmp_path / "straight" / checkpoint_name(8))
    right = read_tensors(tmp_path / "resumed" / checkpoint_name(8))
    assert sorted(left) == sorted(right)
    assert sum(k.startswith("embedding_optimizer/") and k.endswith(".momentum1") for k in left) == 26   # accumulators
    for key, value in left.items():
        assert torch.equal(value, right[key]), key
