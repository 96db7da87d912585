"""The PyTorch DLRM recipe's DCN interaction (``--interaction_op dcn``, MLPerf's DLRM-DCNv2) and the TF2 recipe's
DCNv2 cross network compute the same function on the same weights (issue 32: accuracy parity on the math).

Both recipes' layers are built here, the TF2 one's weights copied into the PyTorch one (``V``: TF ``v_kernel [w, r]``
is ``down.weight.T``; ``U``: ``u_kernel [r, w]`` is ``up.weight.T``; ``b``: ``bias``), in float64 so the comparison
is exact to rounding. Needs both frameworks in one process, so it lives with the cross-recipe tests."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")


def test_pytorch_cross_interaction_equals_the_tf2_cross_network_on_the_same_weights():
    from dlrm.model import LowRankCrossInteraction
    from dlrm_dcnv2.model.dcn import CrossNetwork

    batch, tables, dim, bottom_width, layers, rank = 6, 5, 4, 7, 3, 9
    width = bottom_width + tables * dim
    rng = np.random.default_rng(0)
    bottom = rng.normal(size=(batch, bottom_width))
    embeddings = rng.normal(size=(batch, tables, dim))
    x0 = np.concatenate([bottom, embeddings.reshape(batch, -1)], axis=1)   # the TF2 recipe's x_0: [bottom, e]
    # Every cross layer's weights and arithmetic in float64, whatever policy an earlier test left set (a layer takes
    # its dtypes from the global policy when it is made, its weights when first called).
    previous_policy, previous_floatx = tf.keras.mixed_precision.global_policy(), tf.keras.backend.floatx()
    tf.keras.mixed_precision.set_global_policy("float64")
    tf.keras.backend.set_floatx("float64")
    try:
        network = CrossNetwork(num_layers=layers, projection_dim=rank)
        network(tf.constant(x0))                                             # builds the weights
    finally:
        tf.keras.mixed_precision.set_global_policy(previous_policy)
        tf.keras.backend.set_floatx(previous_floatx)
    assert network.cross_layers[0].u_kernel.dtype == tf.float64
    for layer in network.cross_layers:   # non-zero biases: every term of the formula is compared
        layer.bias.assign(rng.normal(size=width))
    expected = network(tf.constant(x0)).numpy()

    ours = LowRankCrossInteraction(tables, dim, bottom_width, num_layers=layers, low_rank=rank).double()
    with torch.no_grad():
        for layer, down, up in zip(network.cross_layers, ours.down, ours.up):
            down.weight.copy_(torch.from_numpy(layer.v_kernel.numpy().T))
            up.weight.copy_(torch.from_numpy(layer.u_kernel.numpy().T))
            up.bias.copy_(torch.from_numpy(layer.bias.numpy()))
        got = ours(torch.from_numpy(bottom), torch.from_numpy(embeddings)).numpy()
    assert got.shape == (batch, width)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert not np.allclose(expected, x0)   # the layers did something: the comparison is not vacuous
