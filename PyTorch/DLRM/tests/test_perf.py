"""The CPU fast path (issue 11): one-buffer tables with SGD fused into the backward, the padded dot interaction,
torch.compile of the dense part, and the benchmark against TorchRec's DLRM (its figures are in RESULTS.md)."""
import pytest
import torch

from conftest import load_benchmark
from dlrm.model import DotInteraction, MultiTableEmbeddings, torchrec_available
from dlrm.model.embeddings import FusedSGDTableEmbeddings
from dlrm.model.parallel import ModelConfig, build_trainable_model

SIZES = [50, 7, 300]
CONFIG = ModelConfig(13, SIZES, ["a", "b", "c"], 4, [8, 4], [8, 1])


def _batches(count, batch=32, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.rand(batch, 13, generator=generator),
             torch.stack([torch.randint(0, n, (batch,), generator=generator) for n in SIZES], 1),
             torch.randint(0, 2, (batch,), generator=generator).float()) for _ in range(count)]


def _train(fused_sgd, batches, amp_dtype=None):
    torch.manual_seed(0)
    trainable = build_trainable_model(CONFIG, "multi_table", torch.device("cpu"), 1, lr=0.5, fused_sgd=fused_sgd)
    for step, (numerical, categorical, label) in enumerate(batches):
        for optimizer in trainable.optimizers:   # a changing learning rate, as the schedule sets it
            for group in optimizer.param_groups:
                group["lr"] = 0.5 / (1 + step)
        trainable.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp_dtype is not None):
            logits = trainable.module(numerical, categorical)
        torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), label).backward()
        trainable.step()
    return trainable


@pytest.mark.parametrize("amp_dtype", [None, "bfloat16"])
def test_fused_sgd_tables_train_exactly_as_sparse_sgd_with_the_same_state_dict_keys(amp_dtype):
    batches = _batches(12)
    plain, fused = _train(False, batches, amp_dtype), _train(True, batches, amp_dtype)
    assert type(plain.core.embeddings) is MultiTableEmbeddings and fused.fused_sgd and not plain.fused_sgd
    plain_state, fused_state = plain.state_dict(), fused.state_dict()
    assert list(plain_state) == list(fused_state)
    initial = _train(True, []).state_dict()
    for key in plain_state:
        torch.testing.assert_close(fused_state[key], plain_state[key], rtol=0, atol=1e-6, msg=key)
    moved = [k for k in plain_state if k.startswith("embeddings.") and not torch.equal(initial[k], fused_state[k])]
    assert len(moved) == len(SIZES)   # every table was updated (the comparison above is not vacuous)


def test_fused_sgd_is_the_default_for_one_process_sgd_and_loads_state_into_its_buffer():
    default = build_trainable_model(CONFIG, "multi_table", torch.device("cpu"), 1, lr=0.1)
    adam = build_trainable_model(CONFIG, "multi_table", torch.device("cpu"), 1, lr=0.1, adam_embeddings=True)
    assert default.fused_sgd and not adam.fused_sgd
    other = build_trainable_model(CONFIG, "multi_table", torch.device("cpu"), 1, lr=0.1, fused_sgd=False)
    default.core.load_state_dict(other.core.state_dict())
    ids = torch.tensor([[49, 6, 299]])
    default.core.eval(), other.core.eval()
    torch.testing.assert_close(default.core.embeddings(ids), other.core.embeddings(ids), rtol=0, atol=0)


def test_fused_sgd_tables_refuse_an_id_outside_its_table():
    embeddings = FusedSGDTableEmbeddings([10, 20], 4)
    with pytest.raises(IndexError, match="categorical feature 0: id 10 outside its table of 10 rows"):
        embeddings(torch.tensor([[10, 0]]))   # would otherwise read row 0 of table 1
    with pytest.raises(IndexError, match="categorical feature 1: id -1"):
        embeddings(torch.tensor([[0, -1]]))


def test_dot_interaction_padded_for_tensor_cores_gives_the_same_output_and_gradients():
    generator = torch.Generator().manual_seed(0)
    bottom = torch.randn(5, 8, generator=generator, requires_grad=True)
    embedded = torch.randn(5, 26, 8, generator=generator, requires_grad=True)
    results = []
    for multiple in (1, 8):
        dot = DotInteraction(26, 8)
        dot.pad_multiple = multiple
        out = dot(bottom, embedded)
        grads = torch.autograd.grad(out.square().sum(), [bottom, embedded])
        results.append((out, grads))
    assert results[0][0].shape == (5, 8 + 27 * 26 // 2)
    torch.testing.assert_close(results[1][0], results[0][0], rtol=0, atol=1e-6)
    for padded, plain in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(padded, plain, rtol=1e-6, atol=1e-5)


def test_compiled_dense_part_trains_as_the_eager_one():
    """torch.compile (about 10-40 s on 2 cores): same losses and weights as eager over a few steps."""
    from dlrm.utils.compile import compile_dense
    batches = _batches(3)
    losses = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        trainable = build_trainable_model(CONFIG, "multi_table", torch.device("cpu"), 1, lr=0.5)
        if compiled:
            compile_dense(trainable.core)
        losses[compiled] = []
        for numerical, categorical, label in batches:
            trainable.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(trainable.module(numerical, categorical),
                                                                        label)
            loss.backward()
            trainable.step()
            losses[compiled].append(loss.item())
        losses[compiled].append(trainable.state_dict())
    assert losses[True][:-1] == pytest.approx(losses[False][:-1], rel=1e-5, abs=1e-6)
    assert list(losses[True][-1]) == list(losses[False][-1])   # compile left the state_dict keys alone
    for key, value in losses[False][-1].items():
        torch.testing.assert_close(losses[True][-1][key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.skipif(not torchrec_available(), reason="torchrec/fbgemm not installed")
def test_benchmark_prints_ours_and_torchrecs_dlrm_side_by_side_with_the_ratio(capsys):
    import json
    benchmark = load_benchmark("throughput")
    result = benchmark.main(["--shapes", "tiny", "--peer_batch_size", "16", "--peer_table_size", "50", "--rounds", "2",
                             "--steps", "2", "--warmup_steps", "1", "--no-compile", "--precision", "float32"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(result))
    tiny = printed["shapes"]["tiny"]
    assert set(tiny["median_samples_per_s"]) == {"ours", "torchrec_fused", "torchrec_dmp"}
    assert len(tiny["rounds"]) == 2
    assert printed["ours"]["precision"] == "float32" and printed["peer"]["model"] == "torchrec.models.dlrm.DLRM"
    assert printed["cpu_model_name"]
    with pytest.raises(ValueError, match="unknown shape"):
        benchmark.main(["--shapes", "huge", "--no-compile"])


@pytest.mark.parametrize("precision", [["--nofp16"], ["--amp", "--amp_dtype", "bfloat16"]], ids=["float32", "bf16"])
def test_fused_sgd_tables_leave_the_test_auc_on_synthetic_data_unchanged(small_dataset, tmp_path, monkeypatch,
                                                                          precision):
    """Whole training runs (one epoch) with the fused tables and with the plain sparse-SGD ones reach the same test AUC
    and loss (the tolerance is float rounding: the update is the same sum in another order)."""
    from conftest import train_args
    from dlrm.model import parallel
    from dlrm.train import main
    results = {}
    for fused in (True, False):
        build = parallel.build_trainable_model
        monkeypatch.setattr(parallel, "build_trainable_model",
                            lambda *a, _build=build, _fused=fused, **k: _build(*a, fused_sgd=_fused, **k))
        results[fused] = main(train_args(small_dataset, tmp_path / f"{fused}.json", "--embedding_type",
                                         "multi_table", *precision))
        monkeypatch.undo()
    assert results[True]["auc"] == pytest.approx(results[False]["auc"], abs=1e-5)
    assert results[True]["test_loss"] == pytest.approx(results[False]["test_loss"], abs=1e-5)
    assert results[True]["auc"] > 0.65   # a trained model on this data (chance is 0.5), so equality says something
