"""Model parts: MLP, dot interaction, cross network, DenseModel, RecModel (shapes, math against numpy, AMP, XLA)."""
import numpy as np
import pytest
import tensorflow as tf

from dlrm_dcnv2.model import interaction as interaction_lib
from dlrm_dcnv2.model.dcn import CrossLayer, CrossNetwork
from dlrm_dcnv2.model.dense_model import DenseModel
from dlrm_dcnv2.model.interaction import DotInteraction, select_interaction
from dlrm_dcnv2.model.mlp import MLP
from dlrm_dcnv2.model.model import RecModel, build_model


@pytest.fixture
def mixed_bfloat16():
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        yield
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_mlp_shapes_activation_and_init():
    mlp = MLP([64, 32, 1], activate_last=False, seed=1)
    x = tf.constant(_rng().normal(size=(5, 16)), tf.float32)
    y = mlp(x).numpy()
    assert y.shape == (5, 1)
    # The reference computation: ReLU after every layer but the last.
    h = x.numpy()
    for i, layer in enumerate(mlp.dense_layers):
        h = h @ layer.kernel.numpy() + layer.bias.numpy()
        if i < 2:
            h = np.maximum(h, 0)
    np.testing.assert_allclose(y, h, rtol=1e-5, atol=1e-5)
    bottom = MLP([8], activate_last=True)
    assert np.all(bottom(-tf.ones([3, 4]) * 100).numpy() >= 0)
    # NVIDIA's init: bias ~ N(0, 1/units); GlorotNormal kernel std = sqrt(2/(fan_in+fan_out)) (truncation corrected).
    big = MLP([1024], activate_last=True, seed=3)
    big(tf.zeros([1, 512]))
    assert abs(np.std(big.dense_layers[0].bias.numpy()) / np.sqrt(1 / 1024) - 1) < 0.1
    assert abs(np.std(big.dense_layers[0].kernel.numpy()) / np.sqrt(2 / 1536) - 1) < 0.02
    with pytest.raises(ValueError, match="dims"):
        MLP([], activate_last=True)


def _numpy_dot_interaction(bottom, embeddings):
    stacked = np.stack([bottom] + embeddings, axis=1)
    gram = np.einsum("bik,bjk->bij", stacked, stacked)
    num = stacked.shape[1]
    pairs = [gram[:, i, j] for i in range(num) for j in range(i)]
    return np.concatenate([bottom, np.stack(pairs, axis=1)], axis=1)


def test_dot_interaction_equals_numpy_gram_matrix():
    rng = _rng(1)
    bottom = rng.normal(size=(6, 4)).astype(np.float32)
    embeddings = [rng.normal(size=(6, 4)).astype(np.float32) for _ in range(5)]
    out = DotInteraction()(tf.constant(bottom), [tf.constant(e) for e in embeddings]).numpy()
    assert out.shape == (6, 4 + 6 * 5 // 2)
    np.testing.assert_allclose(out, _numpy_dot_interaction(bottom, embeddings), rtol=1e-5, atol=1e-5)
    # Layout: bottom first, then (1,0), (2,0), (2,1), ... : column 4 is <bottom, e_1>, column 6 is <e_1, e_2>.
    np.testing.assert_allclose(out[:, 4], np.sum(bottom * embeddings[0], axis=1), rtol=1e-5)
    np.testing.assert_allclose(out[:, 6], np.sum(embeddings[0] * embeddings[1], axis=1), rtol=1e-5)
    # Self-interaction keeps the diagonal too; without a bottom output only the pairs come back.
    with_diag = DotInteraction(self_interaction=True)(tf.constant(bottom), [tf.constant(e) for e in embeddings])
    assert with_diag.shape == (6, 4 + 6 * 7 // 2)
    only_pairs = DotInteraction()(None, [tf.constant(e) for e in embeddings])
    assert only_pairs.shape == (6, 5 * 4 // 2)
    with pytest.raises(ValueError, match="same size"):
        DotInteraction()(tf.constant(bottom), [tf.zeros([6, 3])])


def test_select_interaction_fallback_and_xla_error(monkeypatch):
    layer, note = select_interaction("dot_tensorflow", xla=True)
    assert isinstance(layer, DotInteraction) and note is None
    monkeypatch.setattr(interaction_lib, "custom_dot_op", lambda: None)
    layer, note = select_interaction("dot_custom_cuda", xla=True)
    assert isinstance(layer, DotInteraction) and "dot_tensorflow" in note
    # With the custom op installed, --xla is refused naming both flags; without a GPU it falls back.
    monkeypatch.setattr(interaction_lib, "custom_dot_op", lambda: (lambda features, bottom: features))
    with pytest.raises(ValueError, match=r"--interaction dot_custom_cuda.*--xla"):
        select_interaction("dot_custom_cuda", xla=True)
    layer, note = select_interaction("dot_custom_cuda", xla=False, on_gpu=False)
    assert isinstance(layer, DotInteraction) and "GPU" in note
    layer, note = select_interaction("dot_custom_cuda", xla=False, on_gpu=True)
    assert isinstance(layer, interaction_lib.CudaDotInteraction) and note is None
    layer, _ = select_interaction("cross", xla=True, num_cross_layers=2, cross_layer_projection_dim=3)
    assert isinstance(layer, CrossNetwork) and layer.num_layers == 2
    with pytest.raises(ValueError, match="--interaction 'dot'"):
        select_interaction("dot", xla=False)


def test_cross_layer_equals_formula():
    rng = _rng(2)
    x0 = rng.normal(size=(7, 10)).astype(np.float32)
    xl = rng.normal(size=(7, 10)).astype(np.float32)
    layer = CrossLayer(projection_dim=3, seed=5)
    out = layer(tf.constant(x0), tf.constant(xl)).numpy()
    layer.bias.assign(rng.normal(size=10).astype(np.float32))  # a non-zero bias so the formula's b is exercised
    out = layer(tf.constant(x0), tf.constant(xl)).numpy()
    v, u, b = layer.v_kernel.numpy(), layer.u_kernel.numpy(), layer.bias.numpy()
    assert v.shape == (10, 3) and u.shape == (3, 10)
    np.testing.assert_allclose(out, x0 * ((xl @ v) @ u + b) + xl, rtol=1e-5, atol=1e-5)
    # Init as TFRS' Cross defaults: truncated normal 0.05 kernels, zero bias.
    fresh = CrossLayer(projection_dim=64, seed=1)
    fresh(tf.zeros([1, 256]))
    assert np.all(fresh.bias.numpy() == 0)
    assert np.all(np.abs(fresh.v_kernel.numpy()) <= 0.1 + 1e-6)
    full = CrossLayer(projection_dim=None)
    out = full(tf.constant(x0)).numpy()
    np.testing.assert_allclose(out, x0 * (x0 @ full.kernel.numpy() + full.bias.numpy()) + x0, rtol=1e-5, atol=1e-5)


def test_cross_network_stacks_layers_on_x0():
    x0 = tf.constant(_rng(3).normal(size=(4, 6)), tf.float32)
    net = CrossNetwork(num_layers=3, projection_dim=2, seed=0)
    out = net(x0).numpy()
    x = x0.numpy()
    for layer in net.cross_layers:
        x = x0.numpy() * ((x @ layer.v_kernel.numpy()) @ layer.u_kernel.numpy() + layer.bias.numpy()) + x
    np.testing.assert_allclose(out, x, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="--num_cross_layers"):
        CrossNetwork(num_layers=0)


def _dense_inputs(batch=8, num_numerical=13, dims=(8, 8, 8), seed=4):
    rng = _rng(seed)
    numerical = tf.constant(rng.normal(size=(batch, num_numerical)), tf.float32)
    embeddings = [tf.constant(rng.normal(size=(batch, d)), tf.float32) for d in dims]
    return numerical, embeddings


def test_dlrm_dense_model_shapes_padding_and_math():
    model = DenseModel([16, 8], [12, 1], "dot_tensorflow", embedding_dims=[8, 8, 8], seed=0)
    numerical, embeddings = _dense_inputs()
    logits = model(numerical, embeddings)
    assert logits.shape == (8, 1) and logits.dtype == tf.float32
    # Bottom input 13 -> padded to 16; top input 8 + 4*3/2 = 14 -> padded to 16.
    assert model.bottom_mlp.dense_layers[0].kernel.shape == (16, 16)
    assert model.top_mlp.dense_layers[0].kernel.shape == (16, 12)
    # Recompute in numpy from the weights.
    h = np.pad(numerical.numpy(), [[0, 0], [0, 3]])
    for layer in model.bottom_mlp.dense_layers:
        h = np.maximum(h @ layer.kernel.numpy() + layer.bias.numpy(), 0)
    z = np.pad(_numpy_dot_interaction(h, [e.numpy() for e in embeddings]), [[0, 0], [0, 2]])
    top = model.top_mlp.dense_layers
    z = np.maximum(z @ top[0].kernel.numpy() + top[0].bias.numpy(), 0)
    np.testing.assert_allclose(logits.numpy(), z @ top[1].kernel.numpy() + top[1].bias.numpy(), rtol=1e-4, atol=1e-4)


def test_dcnv2_dense_model_shapes():
    model = DenseModel([16, 8], [12, 1], "cross", num_cross_layers=2, cross_layer_projection_dim=4,
                       embedding_dims=[4, 8, 6], seed=0)
    numerical, embeddings = _dense_inputs(dims=(4, 8, 6))
    assert model(numerical, embeddings).shape == (8, 1)
    assert model.interaction.cross_layers[0].v_kernel.shape == (8 + 18, 4)
    assert model.top_mlp.dense_layers[0].kernel.shape == (32, 12)  # 26 padded to 32


def test_no_numerical_features():
    model = DenseModel([16, 4], [4, 1], "dot_tensorflow", embedding_dims=[8, 8, 8], num_numerical_features=0)
    logits = model(tf.zeros([5, 0]), [tf.ones([5, 8])] * 3)
    assert logits.shape == (5, 1) and model.bottom_mlp.weights == []


def test_dlrm_dimension_errors_name_the_flags():
    with pytest.raises(ValueError, match=r"--bottom_mlp_dims.*--embedding_dim"):
        DenseModel([16, 4], [4, 1], "dot_tensorflow", embedding_dims=[8, 8])
    with pytest.raises(ValueError, match=r"--embedding_dim"):
        DenseModel([16, 8], [4, 1], "dot_tensorflow", embedding_dims=[8, 4])
    with pytest.raises(ValueError, match=r"--top_mlp_dims"):
        DenseModel([16, 8], [4, 2], "cross", embedding_dims=[8, 4])
    DenseModel([16, 4], [4, 1], "cross", embedding_dims=[8, 4])  # DCNv2 accepts any sizes


@pytest.mark.parametrize("interaction", ["dot_tensorflow", "cross"])
def test_mixed_bfloat16_close_to_float32_and_logits_float32(interaction, mixed_bfloat16):
    numerical, embeddings = _dense_inputs(batch=64, dims=(8, 8, 8))
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    amp = DenseModel([16, 8], [16, 1], interaction, num_cross_layers=2, cross_layer_projection_dim=4,
                     embedding_dims=[8, 8, 8], seed=0)
    amp_logits = amp(numerical, embeddings)
    assert amp_logits.dtype == tf.float32
    assert amp.top_mlp.dense_layers[0].compute_dtype == "bfloat16"
    tf.keras.mixed_precision.set_global_policy("float32")
    ref = DenseModel([16, 8], [16, 1], interaction, num_cross_layers=2, cross_layer_projection_dim=4,
                     embedding_dims=[8, 8, 8], seed=0)
    ref(numerical, embeddings)
    ref.set_weights(amp.get_weights())
    ref_logits = ref(numerical, embeddings).numpy()
    scale = np.max(np.abs(ref_logits))
    # bfloat16 keeps 8 mantissa bits (relative step 2^-8 = 0.4 %); a few layers compound it.
    np.testing.assert_allclose(amp_logits.numpy(), ref_logits, atol=0.05 * scale)
    assert not np.allclose(amp_logits.numpy(), ref_logits, atol=0, rtol=1e-7)  # really computed in bfloat16


@pytest.mark.parametrize("interaction", ["dot_tensorflow", "cross"])
def test_jit_compile_equals_eager(interaction):
    numerical, embeddings = _dense_inputs(batch=16, dims=(8, 8, 8))
    model = DenseModel([16, 8], [16, 1], interaction, num_cross_layers=2, cross_layer_projection_dim=4,
                       embedding_dims=[8, 8, 8], seed=0)
    eager = model(numerical, embeddings).numpy()
    compiled = tf.function(lambda n, e: model(n, e), jit_compile=True)
    np.testing.assert_allclose(compiled(numerical, embeddings).numpy(), eager, rtol=1e-5, atol=1e-5)

    # Gradients too: the training step is what --xla compiles.
    def grads(n, e):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(n, e))
        return tape.gradient(loss, model.trainable_variables)
    compiled_grads = tf.function(grads, jit_compile=True)(numerical, embeddings)
    for a, b in zip(compiled_grads, grads(numerical, embeddings)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_rec_model_and_build_model():
    model = build_model(table_sizes=[50, 20, 10], embedding_dims=8, bottom_mlp_dims=[16, 8], top_mlp_dims=[8, 1],
                        interaction="dot_custom_cuda", num_numerical_features=13, seed=3)
    assert isinstance(model, RecModel) and model.dense.weights  # dense built by build_model
    numerical = tf.zeros([4, 13])
    categorical = tuple(tf.constant([0, 1, 2, 3], tf.int32) for _ in range(3))
    logits = model((numerical, categorical), training=True)
    assert logits.shape == (4, 1) and logits.dtype == tf.float32
    # Same seed, same initial model.
    again = build_model(table_sizes=[50, 20, 10], embedding_dims=8, bottom_mlp_dims=[16, 8], top_mlp_dims=[8, 1],
                        interaction="dot_tensorflow", num_numerical_features=13, seed=3)
    np.testing.assert_allclose(again((numerical, categorical)).numpy(), logits.numpy(), rtol=1e-6)
    assert {v.ref() for v in model.embedding_variables}.isdisjoint({v.ref() for v in model.dense_variables})
    with pytest.raises(ValueError, match="--bottom_mlp_dims"):
        build_model(table_sizes=[50], embedding_dims=8, bottom_mlp_dims=[16, 4], top_mlp_dims=[8, 1],
                    interaction="dot_tensorflow", num_numerical_features=13, seed=3)
