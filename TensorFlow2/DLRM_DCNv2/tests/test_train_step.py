"""The training step and the evaluator on hand-made tensors: loss scaling, the two optimizers, metrics arithmetic."""
import numpy as np
import pytest
import tensorflow as tf

from dlrm_dcnv2.distributed.hvd_utils import Context
from dlrm_dcnv2.model.evaluator import Evaluator
from dlrm_dcnv2.model.metrics import bce_from_logits_np
from dlrm_dcnv2.model.lr_scheduler import WarmupPolyDecay
from dlrm_dcnv2.model.model import build_model
from dlrm_dcnv2.model.optimizers import create_optimizers
from dlrm_dcnv2.model.trainer import Trainer
from recsys_common.metrics import roc_auc_score

TABLES = [50, 30, 20]


def _batch(seed, rows=64):
    rng = np.random.default_rng(seed)
    numerical = tf.constant(rng.standard_normal((rows, 5)), tf.float32)
    ids = tuple(tf.constant(rng.integers(0, n, rows), tf.int32) for n in TABLES)
    labels = tf.constant(rng.random(rows) < 0.3, tf.float32)
    return numerical, ids, labels


def _model(interaction="dot_tensorflow"):
    return build_model(TABLES, 8, [16, 8], [16, 1], interaction, 5, num_cross_layers=1, cross_layer_projection_dim=4,
                       seed=5)


def _train(optimizer, loss_scale, steps=5, xla=False):
    model = _model()
    dense_opt, emb_opt = create_optimizers(optimizer, WarmupPolyDecay(0.05 if optimizer == "sgd" else 0.01, 0, 100, 0))
    trainer = Trainer(model, dense_opt, emb_opt, Context(), loss_scale=loss_scale, xla=xla)
    losses = [float(trainer.train_step(*_batch(i))) for i in range(steps)]
    return model, losses, dense_opt, emb_opt


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_static_loss_scale_is_undone(optimizer):
    """A power-of-two scale is exact in float32: the weights equal the unscaled run's (up to rounding)."""
    plain, plain_losses, _, _ = _train(optimizer, None)
    scaled, scaled_losses, _, _ = _train(optimizer, 65536.0)
    np.testing.assert_allclose(scaled_losses, plain_losses, rtol=1e-6)
    for a, b in zip(plain.weights, scaled.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_compiled_embedding_update_gives_tensorflows_weights(optimizer):
    """The XLA-compiled embedding update (the default) leaves the weights TensorFlow's own sparse kernels leave:
    duplicate ids summed, the -1 padding of a multi-hot table touching no row, lazy Adam's untouched rows kept."""
    runs = []
    for compiled in (True, False):
        model = _model()
        dense_opt, emb_opt = create_optimizers(optimizer, WarmupPolyDecay(0.05, 0, 100, 0))
        trainer = Trainer(model, dense_opt, emb_opt, Context(), compile_embedding_update=compiled)
        assert trainer.embedding_update_compiled == compiled
        for i in range(4):
            numerical, ids, labels = _batch(i)
            multi_hot = np.where(np.random.default_rng(i).random((64, 3)) < 0.3, -1,
                                 np.random.default_rng(i + 100).integers(0, TABLES[0], (64, 3)))
            trainer.train_step(numerical, (tf.constant(multi_hot, tf.int32),) + ids[1:], labels)
        runs.append(model)
    for compiled, reference in zip(runs[0].weights, runs[1].weights):
        np.testing.assert_allclose(compiled.numpy(), reference.numpy(), rtol=1e-5, atol=1e-7, err_msg=compiled.name)
    untouched = _model()
    assert not np.allclose(untouched.embedding_variables[0].numpy(), runs[0].embedding_variables[0].numpy())


def test_embedding_update_is_compiled_by_default_on_a_cpu_only():
    dense_opt, emb_opt = create_optimizers("sgd", 0.05)
    trainer = Trainer(_model(), dense_opt, emb_opt, Context())
    assert trainer.embedding_update_compiled == (not tf.config.list_logical_devices("GPU"))
    assert not Trainer(_model(), dense_opt, emb_opt, Context(), xla=True).embedding_update_compiled  # whole step


def test_each_optimizer_updates_its_own_variables():
    model, losses, dense_opt, emb_opt = _train("adam", None, steps=3)
    assert int(dense_opt.iterations.numpy()) == 3 and int(emb_opt.iterations.numpy()) == 3
    assert losses[-1] < losses[0] * 1.5  # finite and not exploding
    untouched = _model()
    for before, after in zip(untouched.embedding_variables, model.embedding_variables):
        assert not np.allclose(before.numpy(), after.numpy())


def test_loss_is_the_mean_bce_of_the_batch():
    model = _model()
    numerical, ids, labels = _batch(0)
    logits = model((numerical, ids), training=False).numpy().reshape(-1)
    opt = tf.keras.optimizers.legacy.SGD(1e-12)
    loss = float(Trainer(model, opt, opt, Context(), run_eagerly=True).train_step(numerical, ids, labels))
    assert loss == pytest.approx(bce_from_logits_np(labels.numpy(), logits), rel=1e-5)


def test_evaluator_metrics_over_several_batches():
    model = _model("cross")
    batches = [_batch(10 + i, rows=100) for i in range(3)]
    result = Evaluator(model, Context(), auc_thresholds=8000).evaluate(batches)
    logits = np.concatenate([model((n, c), training=False).numpy().reshape(-1) for n, c, _ in batches])
    labels = np.concatenate([l.numpy() for _, _, l in batches])
    assert result["samples"] == 300
    assert result["auc_exact"] == pytest.approx(roc_auc_score(labels, logits), abs=1e-9)
    assert result["loss"] == pytest.approx(bce_from_logits_np(labels, logits), rel=1e-6)
    assert abs(result["auc"] - result["auc_exact"]) < 0.01
    coarse = Evaluator(model, Context(), auc_thresholds=3).evaluate(batches)  # 3 thresholds: a crude approximation
    assert coarse["auc_exact"] == result["auc_exact"] and coarse["auc"] != result["auc"]


def test_evaluator_refuses_an_empty_split():
    with pytest.raises(ValueError, match="evaluation split produced no rows"):
        Evaluator(_model(), Context()).evaluate([])


def test_float16_policy_with_static_loss_scale_trains():
    """The GPU --amp path (mixed_float16 + --loss_scale), run on CPU: float32 weights and logits, finite losses."""
    previous = tf.keras.mixed_precision.global_policy().name
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _model()
        dense_opt, emb_opt = create_optimizers("sgd", 0.05)
        trainer = Trainer(model, dense_opt, emb_opt, Context(), loss_scale=65536.0)
        losses = [float(trainer.train_step(*_batch(i))) for i in range(3)]
        assert model((_batch(0)[0], _batch(0)[1])).dtype == tf.float32
    finally:
        tf.keras.mixed_precision.set_global_policy(previous)
    assert all(np.isfinite(losses))
    assert all(w.dtype == tf.float32 for w in model.weights)
