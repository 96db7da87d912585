"""LazyAdam against a numpy Adam on the touched rows; SGD / Adam pairs of create_optimizers."""
import numpy as np
import pytest
import tensorflow as tf

from dlrm_dcnv2.model.lr_scheduler import WarmupPolyDecay
from dlrm_dcnv2.model.optimizers import LazyAdam, create_optimizers

B1, B2, EPS, LR = 0.9, 0.999, 1e-7, 0.01


def _numpy_lazy_adam(var, m, v, t, indices, values, lr=LR):
    """Reference: sum duplicates, then Adam on those rows only (Keras' epsilon-hat form)."""
    var, m, v = var.copy(), m.copy(), v.copy()
    grads = {}
    for i, g in zip(indices, values):
        grads[i] = grads.get(i, 0) + g.astype(np.float64)
    lr_t = lr * np.sqrt(1 - B2 ** t) / (1 - B1 ** t)
    for i, g in grads.items():
        m[i] = B1 * m[i] + (1 - B1) * g
        v[i] = B2 * v[i] + (1 - B2) * g * g
        var[i] = var[i] - lr_t * m[i] / (np.sqrt(v[i]) + EPS)
    return var, m, v


def _sparse(indices, values):
    return tf.IndexedSlices(tf.constant(values, tf.float32), tf.constant(indices, tf.int32),
                            dense_shape=tf.constant([20, 3]))


@pytest.mark.parametrize("compiled", [False, True])
def test_lazy_adam_touched_rows_match_numpy_untouched_rows_bit_identical(compiled):
    rng = np.random.default_rng(0)
    init = rng.normal(size=(20, 3)).astype(np.float32)
    var = tf.Variable(init)
    opt = LazyAdam(LR, B1, B2, EPS)
    apply = opt.apply_gradients
    if compiled:
        @tf.function(jit_compile=True)
        def apply(grad):
            opt.apply_gradients([(grad, var)])
    ref_var, ref_m, ref_v = init.astype(np.float64), np.zeros((20, 3)), np.zeros((20, 3))
    steps = [[3, 5, 3, 7], [5, 11, 11, 11, 0], [19, 3]]   # duplicates, and row 0 (the padding target) once
    for t, indices in enumerate(steps, start=1):
        values = rng.normal(size=(len(indices), 3)).astype(np.float32)
        before = {"var": var.numpy().copy()}
        if t > 1:
            before.update(m=opt.get_slot(var, "m").numpy().copy(), v=opt.get_slot(var, "v").numpy().copy())
        if compiled:
            apply(_sparse(indices, values))
        else:
            apply([(_sparse(indices, values), var)])
        ref_var, ref_m, ref_v = _numpy_lazy_adam(ref_var, ref_m, ref_v, t, indices, values)
        slots = opt.slot_variables(var)
        np.testing.assert_allclose(var.numpy(), ref_var, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(slots["m"].numpy(), ref_m, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(slots["v"].numpy(), ref_v, rtol=1e-4, atol=1e-9)  # float32 vs float64
        untouched = np.setdiff1d(np.arange(20), indices)
        for name, array in before.items():
            now = {"var": var, "m": slots["m"], "v": slots["v"]}[name].numpy()
            assert np.array_equal(now[untouched].view(np.uint32), array[untouched].view(np.uint32)), name
        assert int(opt.iterations.numpy()) == t
    # Rows never touched keep moments 0 (not decayed, not written).
    never = np.setdiff1d(np.arange(20), sum(steps, []))
    assert np.all(opt.get_slot(var, "m").numpy()[never] == 0)


def test_lazy_adam_all_rows_touched_matches_keras_adam():
    rng = np.random.default_rng(1)
    init = rng.normal(size=(6, 4)).astype(np.float32)
    lazy_var, dense_var = tf.Variable(init), tf.Variable(init)
    lazy = LazyAdam(LR, B1, B2, EPS)
    adam = tf.keras.optimizers.legacy.Adam(LR, B1, B2, EPS)
    for _ in range(5):
        values = rng.normal(size=(6, 4)).astype(np.float32)
        order = rng.permutation(6)
        lazy.apply_gradients([(tf.IndexedSlices(tf.constant(values[order]), tf.constant(order, tf.int32)),
                               lazy_var)])
        adam.apply_gradients([(tf.constant(values), dense_var)])
    np.testing.assert_allclose(lazy_var.numpy(), dense_var.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(lazy.get_slot(lazy_var, "v").numpy(), adam.get_slot(dense_var, "v").numpy(),
                               rtol=1e-6)
    # A dense gradient gets the ordinary Adam update.
    values = rng.normal(size=(6, 4)).astype(np.float32)
    lazy.apply_gradients([(tf.constant(values), lazy_var)])
    adam.apply_gradients([(tf.constant(values), dense_var)])
    np.testing.assert_allclose(lazy_var.numpy(), dense_var.numpy(), rtol=0, atol=1e-6)


def test_gather_gradient_is_lazy_and_slots_for_checkpoints():
    table = tf.Variable(np.ones((10, 2), np.float32))
    opt = LazyAdam(0.1)
    with pytest.raises(KeyError):
        opt.slot_variables(table)
    opt.build([table])
    assert set(opt.slot_variables(table)) == {"m", "v"} and int(opt.iterations.numpy()) == 0
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [1, 1, 4]))
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)
    opt.apply_gradients([(grad, table)])
    changed = np.where(np.any(table.numpy() != 1, axis=1))[0]
    assert changed.tolist() == [1, 4]


def test_create_optimizers():
    schedule = WarmupPolyDecay(1.0, 2, 10, 5)
    dense, emb = create_optimizers("sgd", schedule)
    assert isinstance(dense, tf.keras.optimizers.legacy.SGD) and isinstance(emb, tf.keras.optimizers.legacy.SGD)
    assert dense is not emb and dense.get_config()["momentum"] == 0
    dense, emb = create_optimizers("adam", schedule, beta1=0.8, beta2=0.99, epsilon=1e-6)
    assert isinstance(emb, LazyAdam) and type(dense) is tf.keras.optimizers.legacy.Adam
    assert dense.get_config()["beta_1"] == pytest.approx(0.8) and emb.get_config()["beta_2"] == pytest.approx(0.99)
    assert emb.get_config()["epsilon"] == pytest.approx(1e-6)
    with pytest.raises(ValueError, match="--optimizer 'rmsprop'"):
        create_optimizers("rmsprop", 0.1)


def test_sgd_sparse_update_only_touched_rows_with_schedule():
    table = tf.Variable(np.zeros((5, 2), np.float32))
    _, sgd = create_optimizers("sgd", WarmupPolyDecay(2.0, 1, 10, 5))
    grad = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([2, 2, 4]))
    sgd.apply_gradients([(grad, table)])          # warmup step 0: rate 0
    assert np.all(table.numpy() == 0)
    sgd.apply_gradients([(grad, table)])          # rate 2: duplicates summed
    np.testing.assert_allclose(table.numpy()[:, 0], [0, 0, -4, 0, -2])


@pytest.mark.parametrize("compiled", [False, True])
def test_no_row_indices_touch_nothing(compiled):
    """Index -1 (``nn.embedding.NO_ROW``: padding, an id outside this rank's row slice) is no row: lazy Adam and the
    embedding SGD update the other rows as without it, and row 0 keeps its bits and its moments (it has momentum
    from a first step, so a zero gradient counted as a touch would move it)."""
    rng = np.random.default_rng(3)
    init = rng.normal(size=(20, 3)).astype(np.float32)
    adam_var, plain_var, sgd_var = tf.Variable(init), tf.Variable(init), tf.Variable(init)
    adam, plain = LazyAdam(LR, B1, B2, EPS), LazyAdam(LR, B1, B2, EPS)
    _, sgd = create_optimizers("sgd", 0.5)

    def apply(grad, clean):
        adam.apply_gradients([(grad, adam_var)])
        plain.apply_gradients([(clean, plain_var)])
        sgd.apply_gradients([(grad, sgd_var)])
    if compiled:
        apply = tf.function(apply, jit_compile=True)
    first = rng.normal(size=(2, 3))
    apply(_sparse([0, 4], first), _sparse([0, 4], first))
    states = lambda var, opt: [var.numpy().copy()] + [opt.get_slot(var, s).numpy().copy() for s in ("m", "v")]
    adam_before, sgd_before = states(adam_var, adam), sgd_var.numpy().copy()

    values = rng.normal(size=(5, 3)).astype(np.float32)
    values[[0, 2]] = 0  # as the lookup's gradient: NO_ROW entries carry zeros
    apply(_sparse([-1, 3, -1, 5, 3], values), _sparse([3, 5, 3], values[[1, 3, 4]]))
    for ours, reference in zip(states(adam_var, adam), states(plain_var, plain)):
        np.testing.assert_array_equal(ours, reference)
    for before, after in zip(adam_before, states(adam_var, adam)):
        np.testing.assert_array_equal(after[[0, 1, 2, 4]], before[[0, 1, 2, 4]])
        assert not np.array_equal(after[3], before[3])
    np.testing.assert_array_equal(sgd_var.numpy()[[0, 1, 2, 4]], sgd_before[[0, 1, 2, 4]])
    np.testing.assert_allclose(sgd_var.numpy()[3], sgd_before[3] - 0.5 * (values[1] + values[4]), rtol=1e-6)

    adam_before = states(adam_var, adam)
    apply(_sparse([-1, -1], np.zeros((2, 3))), _sparse([4], np.zeros((1, 3))))  # nothing but padding
    for before, after in zip(adam_before, states(adam_var, adam)):
        np.testing.assert_array_equal(after, before)
