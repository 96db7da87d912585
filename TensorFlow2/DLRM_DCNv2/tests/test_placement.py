"""plan_placement: table-wise balance, column/row slicing, data parallel, CPU offload, and its errors."""
import pytest

from dlrm_dcnv2.distributed.placement import PlacementError, plan_placement


def _tables_by_rank(p):
    return {r: [s.table for s in p.model_parallel_shards(r)] for r in range(p.world_size)}


def test_one_rank_holds_every_whole_table_and_reads_the_global_batch():
    p = plan_placement([100, 5, 7], [4, 4, 8], world_size=1, column_slice_threshold=1, row_slice_threshold=1)
    assert [(s.table, s.rank, s.rows, s.cols) for s in p.shards] == [
        (0, 0, (0, 100), (0, 4)), (1, 0, (0, 5), (0, 4)), (2, 0, (0, 7), (0, 8))]
    assert p.input_tables(0) == [(0, True), (1, True), (2, True)]


def test_memory_balanced_puts_the_largest_tables_on_the_least_loaded_rank():
    sizes = [1000, 900, 500, 400, 100, 50]
    p = plan_placement(sizes, 8, world_size=2)
    # 1000 -> r0, 900 -> r1, 500 -> r1 (900 < 1000), 400 -> r0, 100 -> r0 (tie: lowest rank), 50 -> r1
    assert _tables_by_rank(p) == {0: [0, 3, 4], 1: [1, 2, 5]}
    assert (p.rank_elements(0), p.rank_elements(1)) == (1500 * 8, 1450 * 8)
    basic = plan_placement(sizes, 8, world_size=2, strategy="basic")
    assert _tables_by_rank(basic) == {0: [0, 2, 4], 1: [1, 3, 5]}
    assert p.input_tables(1) == [(1, True), (2, True), (5, True)]


def test_column_slicing_splits_large_tables_across_ranks():
    # 1000 x 8 = 8000 elements > 3000: two slices bring each under 4000, then four under 2000 ... at most world 4.
    p = plan_placement([1000, 10, 10, 10], 8, world_size=4, column_slice_threshold=3000)
    slices = p.shards_of_table(0)
    assert [s.cols for s in slices] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert sorted(s.rank for s in slices) == [0, 1, 2, 3]  # never two slices of one table on a rank
    two = plan_placement([1000, 10], 8, world_size=2, column_slice_threshold=3000)
    assert [s.cols for s in two.shards_of_table(0)] == [(0, 4), (4, 8)]  # capped at the world size
    assert [s.rank for s in two.shards_of_table(0)] == [0, 1]


def test_row_slicing_gives_every_rank_a_row_range():
    p = plan_placement([1001, 10, 20], 4, world_size=3, row_slice_threshold=2000, column_slice_threshold=100)
    rows = [(s.rank, s.rows, s.cols) for s in p.shards_of_table(0)]
    assert rows == [(0, (0, 334), (0, 4)), (1, (334, 668), (0, 4)), (2, (668, 1001), (0, 4))]
    assert all(p.input_tables(r)[0] == (0, True) for r in range(3))


def test_data_parallel_tables_are_replicated_and_read_per_rank():
    p = plan_placement([1000, 10, 500, 3], 8, world_size=2, data_parallel_threshold=100)
    assert p.data_parallel_tables == [1, 3] and p.model_parallel_tables == [0, 2]
    assert p.input_tables(0) == [(0, True), (1, False), (3, False)]
    assert p.input_tables(1) == [(1, False), (2, True), (3, False)]
    assert {s.table for s in p.local_shards(0) if s.data_parallel} == {1, 3}


def test_cpu_offloading_moves_the_largest_shards_over_the_threshold():
    gib = 2 ** 30
    # rank 0 of one: 3 tables of 1, 0.5, 0.25 GiB (float32); threshold 1 GiB -> the 1 GiB table goes to the host.
    sizes = [gib // 4 // 64, gib // 8 // 64, gib // 16 // 64]
    p = plan_placement(sizes, 64, world_size=1, cpu_offloading_threshold_gb=1.0)
    assert [s.offload_to_cpu for s in p.shards] == [True, False, False]
    assert not any(s.offload_to_cpu for s in plan_placement(sizes, 64, 1, cpu_offloading_threshold_gb=2.0).shards)
    both = plan_placement(sizes, 64, 1, cpu_offloading_threshold_gb=0.3)
    assert [s.offload_to_cpu for s in both.shards] == [True, True, False]


def test_more_ranks_than_tables_is_a_clear_error():
    with pytest.raises(PlacementError, match=r"3 ranks but only 2 .*--column_slice_threshold"):
        plan_placement([100, 200], 8, world_size=3)
    # Slicing makes it work.
    p = plan_placement([100, 200], 8, world_size=3, row_slice_threshold=1000)
    assert sorted({s.rank for s in p.shards}) == [0, 1, 2]


def test_bad_flags_are_clear_errors():
    with pytest.raises(PlacementError, match="memory_optimized"):
        plan_placement([10], 4, 1, strategy="memory_optimized")
    with pytest.raises(PlacementError, match="--dist_strategy 'best'"):
        plan_placement([10], 4, 1, strategy="best")
    with pytest.raises(PlacementError, match="--column_slice_threshold"):
        plan_placement([10], 4, 1, column_slice_threshold=0)
    with pytest.raises(PlacementError, match="--embedding_dim gives 2 dims for 1 tables"):
        plan_placement([10], [4, 4], 1)
    with pytest.raises(PlacementError, match="no embedding tables"):
        plan_placement([], 4, 1)
