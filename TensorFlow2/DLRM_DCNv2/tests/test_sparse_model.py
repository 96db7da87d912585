"""SparseModel and embedding lookups on one process: values against numpy, pooling, slicing, gradients."""
import numpy as np
import pytest
import tensorflow as tf

from dlrm_dcnv2.distributed import hvd_utils
from dlrm_dcnv2.distributed.gradients import reduce_gradients
from dlrm_dcnv2.distributed.placement import Placement, ShardSpec, plan_placement
from dlrm_dcnv2.model.embedding import INIT_BLOCK_ROWS, embedding_lookup, initial_values
from dlrm_dcnv2.model.sparse_model import SparseModel

SIZES = [10, 20, 5]
DIMS = [4, 4, 2]


def _tables(model):
    return {s.table: v.numpy() for s, v in model.shard_variables}


def test_hvd_utils_single_process_is_identity():
    ctx = hvd_utils.init()
    assert (ctx.rank, ctx.world_size, ctx.local_rank) == (0, 1, 0)
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(hvd_utils.allreduce(x).numpy(), x.numpy())
    np.testing.assert_array_equal(hvd_utils.allgather(x).numpy(), x.numpy())
    np.testing.assert_array_equal(hvd_utils.alltoall(x, [2], name="t").numpy(), x.numpy())
    assert hvd_utils.broadcast_value(17) == 17
    hvd_utils.barrier()
    hvd_utils.shutdown()
    hvd_utils.shutdown()  # twice is fine (every entry point calls it in a finally)


def test_one_hot_lookup_equals_numpy():
    model = SparseModel(SIZES, DIMS, seed=3)
    ids = [np.array([1, 2, 9, 0, 9]), np.array([19, 0, 7, 7, 3]), np.array([4, 4, 0, 1, 2])]
    out = model(tuple(tf.constant(i, tf.int32) for i in ids))
    tables = _tables(model)
    assert len(out) == 3
    for t in range(3):
        assert out[t].dtype == tf.float32 and out[t].shape == (5, DIMS[t])
        np.testing.assert_array_equal(out[t].numpy(), tables[t][ids[t]])


def test_multi_hot_sum_pooling_ignores_padding():
    model = SparseModel(SIZES, DIMS, hotness=[3, 1, 2], seed=5)
    multi = np.array([[1, -1, -1], [2, 3, -1], [-1, -1, -1], [9, 9, 0]])
    out = model((tf.constant(multi), tf.constant([0, 1, 2, 3]), tf.constant([[4, -1], [0, 1], [-1, 3], [2, 2]])))
    tables = _tables(model)
    expected = np.stack([tables[0][1], tables[0][2] + tables[0][3], np.zeros(4), 2 * tables[0][9] + tables[0][0]])
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(out[2].numpy()[0], tables[2][4])
    np.testing.assert_allclose(out[2].numpy()[3], 2 * tables[2][2], rtol=1e-6)


def test_gradients_are_indexed_slices_of_the_looked_up_rows():
    model = SparseModel(SIZES, DIMS, hotness=[1, 2, 1], seed=1)
    ids = (tf.constant([1, 1, 4]), tf.constant([[3, -1], [5, 6], [-1, -1]]), tf.constant([0, 0, 0]))
    with tf.GradientTape() as tape:
        out = model(ids)
        loss = tf.reduce_sum(out[0]) + 2.0 * tf.reduce_sum(out[1]) + tf.reduce_sum(out[2])
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)
    dense = tf.convert_to_tensor(grads[0]).numpy()
    expected = np.zeros((10, 4), np.float32)
    expected[1] = 2.0   # id 1 looked up twice
    expected[4] = 1.0
    np.testing.assert_array_equal(dense, expected)
    dense1 = tf.convert_to_tensor(grads[1]).numpy()
    assert dense1[3].tolist() == [2.0] * 4 and dense1[5].tolist() == [2.0] * 4 and dense1[0].tolist() == [0.0] * 4
    # One rank: the gradient rule is the identity.
    ctx = hvd_utils.Context()
    same = reduce_gradients(grads, model.trainable_variables, model.model_parallel_variables, ctx)
    assert all(a is b for a, b in zip(same, grads))


def test_initialisation_is_nvidia_uniform_and_slice_independent():
    rows, dim = INIT_BLOCK_ROWS + 1000, 6  # crosses an init block boundary
    full = initial_values(rows, dim, seed=9, table=2)
    bound = np.sqrt(1.0 / rows)
    assert full.dtype == np.float32 and np.abs(full).max() <= bound
    assert np.abs(full).max() > 0.95 * bound and abs(full.mean()) < 0.01 * bound  # uses the whole range
    part = initial_values(rows, dim, seed=9, table=2, rows=(INIT_BLOCK_ROWS - 7, INIT_BLOCK_ROWS + 5), cols=(2, 5))
    np.testing.assert_array_equal(part, full[INIT_BLOCK_ROWS - 7:INIT_BLOCK_ROWS + 5, 2:5])
    assert not np.array_equal(initial_values(100, 4, seed=9, table=2), initial_values(100, 4, seed=9, table=3))
    assert not initial_values(100, 4, 9, 0, zeros=True).any()


def test_row_slice_lookup_gives_zeros_outside_its_rows():
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    ids = tf.constant([[0, 4, -1], [5, 9, 3], [-1, -1, -1]])
    low = embedding_lookup(tf.constant(table[:5]), ids, row_start=0, row_count=5)
    high = embedding_lookup(tf.constant(table[5:]), ids, row_start=5, row_count=5)
    whole = embedding_lookup(tf.constant(table), ids)
    np.testing.assert_array_equal(low.numpy()[1], table[3])
    np.testing.assert_array_equal(high.numpy()[1], table[5] + table[9])
    np.testing.assert_array_equal((low + high).numpy(), whole.numpy())


@pytest.mark.parametrize("as_variable", [True, False])
def test_lookup_gradient_indexes_padding_and_other_slices_no_row(as_variable):
    """The table's gradient is a tf.IndexedSlices whose padding and out-of-slice entries have index -1 (NO_ROW) and
    value 0, so that no optimizer counts row 0 as touched by them (variable: the training path)."""
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    source = tf.Variable(table) if as_variable else tf.constant(table)
    ids = tf.constant([[5, 9, -1], [7, 2, 5]])   # this slice holds rows 5..9 of the table
    weights = tf.constant([[1.0], [2.0]])
    with tf.GradientTape() as tape:
        tape.watch(source)
        out = embedding_lookup(source, ids, row_start=5, row_count=5)
        loss = tf.reduce_sum(out * weights)
    np.testing.assert_array_equal(out.numpy(), [table[0] + table[4], table[2] + table[0]])
    grad = tape.gradient(loss, source)
    assert isinstance(grad, tf.IndexedSlices)
    assert grad.indices.numpy().tolist() == [0, 4, -1, 2, -1, 0]
    np.testing.assert_array_equal(grad.values.numpy()[:, 0], [1, 1, 0, 2, 0, 2])
    np.testing.assert_array_equal(tf.convert_to_tensor(grad).numpy()[:, 0], [3, 0, 2, 0, 1])


def test_sliced_placement_assembles_the_same_tables_on_one_rank():
    """A placement whose shards are column and row slices gives the lookups of whole tables (one process)."""
    whole = SparseModel(SIZES, DIMS, hotness=[2, 1, 1], seed=4)
    shards = (ShardSpec(0, 0, (0, 10), (0, 1)), ShardSpec(0, 0, (0, 10), (1, 4)),
              ShardSpec(1, 0, (0, 7), (0, 4)), ShardSpec(1, 0, (7, 20), (0, 4)), ShardSpec(2, -1, (0, 5), (0, 2)))
    sliced_plan = Placement(tuple(SIZES), tuple(DIMS), 1, "basic", shards)
    sliced = SparseModel(SIZES, DIMS, hotness=[2, 1, 1], placement=sliced_plan, seed=4)
    assert len(sliced.model_parallel_variables) == 4 and len(sliced.data_parallel_variables) == 1
    ids = (tf.constant([[1, 9], [-1, 0], [3, 3]]), tf.constant([6, 7, 19]), tf.constant([0, 4, 2]))
    for a, b in zip(whole(ids), sliced(ids)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_sparse_model_rejects_mismatched_inputs_and_placement():
    model = SparseModel(SIZES, DIMS, seed=0)
    with pytest.raises(ValueError, match="expects ids of 3 tables"):
        model((tf.constant([0]), tf.constant([0])))
    with pytest.raises(ValueError, match="planned for tables"):
        SparseModel(SIZES, DIMS, placement=plan_placement([10, 20], 4, 1), seed=0)


def test_create_sparse_model_without_mde_uses_our_placement_and_says_so(caplog):
    from dlrm_dcnv2.model.sparse_model import create_sparse_model, mde_available
    if mde_available():
        pytest.skip("distributed_embeddings is installed here: the MDE path is taken")
    ctx = hvd_utils.Context()
    with caplog.at_level("INFO", logger="dlrm_dcnv2.model.sparse_model"):
        model = create_sparse_model(SIZES, 4, 1, ctx, seed=2, use_mde_embeddings=True,
                                    cpu_offloading_threshold_gb=1e-7)
    assert isinstance(model, SparseModel)
    assert "distributed_embeddings (Merlin Distributed Embeddings) is not installed" in caplog.text
    assert "table_0" in [v.name.split(":")[0] for v in model.model_parallel_variables]
    assert [s.offload_to_cpu for s, _ in model.shard_variables] == [True, True, False]  # 160, 320 B over 107 B
    assert model.placement.input_tables(0) == [(0, True), (1, True), (2, True)]


def test_compile_step_with_xla_matches_eager_on_one_process():
    model = SparseModel(SIZES, DIMS, hotness=[2, 1, 1], seed=6)
    ids = (tf.constant([[1, -1], [3, 9]]), tf.constant([0, 19]), tf.constant([4, 1]))
    compiled = hvd_utils.compile_step(lambda: model(ids), xla=True)
    assert compiled._jit_compile is True  # one process: the whole step is one XLA program
    assert hvd_utils.compile_step(lambda: model(ids), xla=False)._jit_compile is None
    for a, b in zip(compiled(), model(ids)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_variables_are_filled_with_the_slices_of_the_one_rank_tables():
    rows = INIT_BLOCK_ROWS + 300
    shards = (ShardSpec(0, 0, (0, INIT_BLOCK_ROWS - 5), (0, 3)), ShardSpec(0, 0, (INIT_BLOCK_ROWS - 5, rows), (0, 3)),
              ShardSpec(1, 0, (0, 7), (0, 1)), ShardSpec(1, 0, (0, 7), (1, 3)))
    plan = Placement((rows, 7), (3, 3), 1, "basic", shards)
    model = SparseModel([rows, 7], 3, placement=plan, seed=12)
    for shard, variable in model.shard_variables:
        full = initial_values((rows, 7)[shard.table], 3, seed=12, table=shard.table)
        np.testing.assert_array_equal(variable.numpy(), full[shard.rows[0]:shard.rows[1], shard.cols[0]:shard.cols[1]])
    zeros = SparseModel([rows, 7], 3, placement=plan, seed=12, zeros_initializer=True)
    assert not any(v.numpy().any() for v in zeros.model_parallel_variables)
