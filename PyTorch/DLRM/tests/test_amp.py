"""Mixed precision: the float16 loss-scaled step with TorchRec's fused optimizer (the default GPU configuration), run
on the CPU through the same code (``--amp --amp_dtype float16`` uses ``torch.amp.GradScaler("cpu")``)."""
import math

import pytest
import torch

from conftest import train_args
from dlrm.model import torchrec_available
from dlrm.scripts.main import _Amp, main

FUSED = pytest.mark.skipif(not torchrec_available(), reason="torchrec/fbgemm not installed")


def _tables(trainable):
    """Every table's full weight (one process holds every shard), as a float32 copy."""
    state = trainable.state_dict()
    out = []
    for key in trainable.table_state_keys:
        value = state[key]
        if hasattr(value, "local_shards"):  # ShardedTensor: one process holds all of it
            value = value.local_shards()[0].tensor
        out.append(value.detach().float().clone())
    return out


def _one_step(amp_dtype, lr=0.5, scale=8192.0):
    """Build a fused DLRM (seeded), take one training step as main's loop does, return table deltas and loss."""
    from dlrm.model.parallel import ModelConfig, build_trainable_model
    from dlrm.utils.distributed import setup, teardown
    ctx = setup("cpu", need_group=True)
    try:
        torch.manual_seed(3)
        config = ModelConfig(13, [50, 20, 7], ["c0", "c1", "c2"], embedding_dim=8, bottom_mlp_sizes=[16, 8],
                             top_mlp_sizes=[16, 1])
        trainable = build_trainable_model(config, "torchrec_fused", ctx.device, 1, lr=lr, local_batch_size=64)
        amp = _Amp(amp_dtype is not None, ctx.device, amp_dtype, scale)
        generator = torch.Generator().manual_seed(5)
        numerical = torch.randn(64, 13, generator=generator)
        categorical = torch.stack([torch.randint(0, n, (64,), generator=generator) for n in (50, 20, 7)], 1)
        label = torch.randint(0, 2, (64,), generator=generator).float()
        before = _tables(trainable)
        trainable.zero_grad(amp.scaler)
        with amp.autocast():
            logits = trainable.module(numerical, categorical)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), label)
        (amp.scaler.scale(loss) if amp.scaler is not None else loss).backward()
        trainable.step(amp.scaler)
        after = _tables(trainable)
        dense = [p.detach().clone() for _, p in trainable.dense_named_parameters()]
        return [a - b for a, b in zip(after, before)], before, dense, loss.item(), amp
    finally:
        teardown(ctx)


@FUSED
def test_float16_loss_scaled_step_updates_fused_tables_as_float32():
    fp32_delta, fp32_init, fp32_dense, fp32_loss, _ = _one_step(None)
    fp16_delta, fp16_init, fp16_dense, fp16_loss, amp = _one_step("float16")
    assert amp.scaler is not None and amp.scaler.get_scale() == 8192.0  # no overflow: the scale was kept
    for a, b in zip(fp32_init, fp16_init):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # same seeded start
    assert math.isfinite(fp16_loss) and fp16_loss == pytest.approx(fp32_loss, abs=2e-3)
    moved = sum(int((d != 0).any(dim=1).sum()) for d in fp32_delta)
    assert moved > 20  # the batch touched many rows: the comparison below is about real updates
    for d32, d16 in zip(fp32_delta, fp16_delta):
        # Without the 1/scale multiplier the fused kernel would apply a 8192x larger update.
        torch.testing.assert_close(d16, d32, rtol=2e-2, atol=2e-5)
    # the MLPs were stepped by the scaler (unscaled): their weights also agree with float32's to fp16 precision
    for p32, p16 in zip(fp32_dense, fp16_dense):
        torch.testing.assert_close(p16, p32, rtol=1e-2, atol=1e-3)


@FUSED
def test_float16_loss_scaler_with_fused_optimizer_trains_like_float32(small_dataset, tmp_path):
    common = ("--embedding_type", "torchrec_fused", "--epochs", "2", "--decay_steps", "0")
    fp32 = main(train_args(small_dataset, tmp_path / "fp32.json", *common))
    fp16 = main(train_args(small_dataset, tmp_path / "fp16.json", *common, "--amp", "--amp_dtype", "float16"))
    assert fp32["amp"] == "float32" and fp16["amp"] == "float16"
    assert math.isfinite(fp16["train_loss"]) and fp16["train_loss"] == pytest.approx(fp32["train_loss"], abs=5e-3)
    assert fp16["auc"] == pytest.approx(fp32["auc"], abs=5e-3), (fp16["auc"], fp32["auc"])
    assert fp16["auc"] > 0.62
