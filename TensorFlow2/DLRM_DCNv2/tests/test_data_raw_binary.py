"""tf_raw (split-binary) input: batches equal recsys_common's reader, per-rank slices and files, resume, the tail."""
import numpy as np
import pytest

from recsys_common.datasets import open_reader, read_columns
from recsys_common.feature_spec import FeatureSpec

from dlrm_dcnv2.data import create_input, raw_binary_dataset
from dlrm_dcnv2.data.dataloader import DataError, batch_layout

from conftest import TABLE_SIZES, make_dataset


def _np(batch):
    num, cat, lab = batch
    return num.numpy(), [c.numpy() for c in cat], lab.numpy()


def _spec(path):
    return FeatureSpec.from_yaml(f"{path}/feature_spec.yaml")


def test_world_size_1_batches_equal_recsys_common_reader(small_dataset):
    data = create_input("tf_raw", small_dataset, mapping="train", global_batch_size=1000)
    assert len(data) == 9 and data.num_samples == 8192   # 8 full batches + a tail of 192 rows (kept: world size 1)
    assert data.metadata.table_sizes == TABLE_SIZES and data.metadata.num_numerical == 13
    ours = [_np(b) for b in data]
    ref = list(open_reader(_spec(small_dataset), "train", batch_size=1000))
    assert len(ours) == len(ref)
    for (num, cat, lab), r in zip(ours, ref):
        assert num.dtype == np.float32 and lab.dtype == np.float32 and all(c.dtype == np.int32 for c in cat)
        np.testing.assert_array_equal(num, r["numerical"])
        np.testing.assert_array_equal(lab, r["label"])
        np.testing.assert_array_equal(np.stack(cat, axis=1), r["categorical"])


def test_two_ranks_split_the_global_batch_and_open_only_their_tables(small_dataset, monkeypatch):
    opened = []
    real_open = raw_binary_dataset._open_fd
    monkeypatch.setattr(raw_binary_dataset, "_open_fd", lambda path, flags: opened.append(path) or
                        real_open(path, flags))
    # rank 0 owns tables 0, 2, 4 (model parallel), rank 1 owns 1, 3; tables 5..7 are data parallel on both
    tables = {0: [(0, True), (2, True), (4, True), (5, False), (6, False), (7, False)],
              1: [(1, True), (3, True), (5, False), (6, False), (7, False)]}
    batches, files = {}, {}
    for rank in (0, 1):
        opened.clear()
        data = create_input("tf_raw", small_dataset, mapping="test", global_batch_size=500, rank=rank,
                            world_size=2, input_tables=tables[rank], prefetch=0)
        batches[rank] = [_np(b) for b in data]
        files[rank] = sorted(p.rsplit("/", 1)[1] for p in opened)
    assert files[0] == ["cat_0.bin", "cat_2.bin", "cat_4.bin", "cat_5.bin", "cat_6.bin", "cat_7.bin",
                        "label.bin", "numerical.bin"]
    assert files[1] == ["cat_1.bin", "cat_3.bin", "cat_5.bin", "cat_6.bin", "cat_7.bin", "label.bin",
                        "numerical.bin"]
    ref = list(open_reader(_spec(small_dataset), "test", batch_size=500))
    assert len(batches[0]) == len(batches[1]) == len(ref) == 5   # 2048 rows: 4 x 500 + a tail of 48 (even)
    for i, r in enumerate(ref):
        (n0, c0, l0), (n1, c1, l1) = batches[0][i], batches[1][i]
        np.testing.assert_array_equal(np.concatenate([n0, n1]), r["numerical"])
        np.testing.assert_array_equal(np.concatenate([l0, l1]), r["label"])
        half = len(r["label"]) // 2
        for rank, cats in ((0, c0), (1, c1)):
            for (table, is_global), ids in zip(tables[rank], cats):
                want = r["categorical"][:, table]
                np.testing.assert_array_equal(ids, want if is_global else want[rank * half:(rank + 1) * half])


def test_last_batch_is_cut_to_a_multiple_of_world_size(tmp_path, caplog):
    path = make_dataset(tmp_path / "d", train_rows=1003, test_rows=7, table_sizes=[5, 9])
    assert batch_layout(1003, 250, 4) == [(0, 250), (250, 250), (500, 250), (750, 250)]  # tail of 3 < 4 ranks
    assert batch_layout(1003, 200, 2) == [(0, 200), (200, 200), (400, 200), (600, 200), (800, 200), (1000, 2)]
    tables = [(0, True), (1, False)]
    with caplog.at_level("WARNING", logger="dlrm_dcnv2.data"):
        ranks = [create_input("tf_raw", path, mapping="test", global_batch_size=4, rank=r, world_size=2,
                              input_tables=tables) for r in (0, 1)]
    assert "the last partial batch drops 1 of its 3 row(s)" in caplog.text
    cols = read_columns(_spec(path), "test")
    got = [[_np(b) for b in data] for data in ranks]
    assert [len(g) for g in got] == [2, 2]
    # the tail batch (rows 4..6) keeps 2 rows: one per rank; row 6 is dropped
    np.testing.assert_array_equal(got[0][1][2], cols["label"][4:5].astype(np.float32))
    np.testing.assert_array_equal(got[1][1][2], cols["label"][5:6].astype(np.float32))
    np.testing.assert_array_equal(got[1][1][1][0], cols["cat_0.bin"][4:6])   # model parallel: both tail rows


def test_skip_resumes_at_the_exact_batch(small_dataset):
    whole = [_np(b) for b in create_input("tf_raw", small_dataset, global_batch_size=700)]
    data = create_input("tf_raw", small_dataset, global_batch_size=700)
    data.skip(3).skip(2)
    assert data.start_batch == 5
    resumed = [_np(b) for b in data]
    assert len(resumed) == len(whole) - 5
    for a, b in zip(resumed, whole[5:]):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[2], b[2])
        for x, y in zip(a[1], b[1]):
            np.testing.assert_array_equal(x, y)
    assert data.start_batch == 0 and len([1 for _ in data]) == len(whole)   # the next epoch starts at 0 again


def test_abandoned_iteration_stops_its_prefetch_thread(small_dataset):
    import threading
    data = create_input("tf_raw", small_dataset, global_batch_size=100, prefetch=2)
    it = iter(data)
    next(it)
    it.close()
    assert not [t for t in threading.enumerate() if t.name == "dlrm-input-prefetch"]


def test_csv_spec_is_read_in_memory(tmp_path):
    spec = FeatureSpec.get_default_feature_spec(2, [6, 11])
    for name in ("num_0", "num_1"):
        spec.feature_spec[name]["dtype"] = "float32"   # pyarrow writes no float16 CSV
    for mapping in spec.source_spec.values():
        for chunk in mapping:
            chunk["type"] = "csv"
            chunk["files"] = [chunk["files"][0].replace(".bin", "") + ".csv"]
    from recsys_common.synthetic import generate_dataset
    generate_dataset(spec, str(tmp_path / "csv"), {"train": 50, "test": 10}, seed=3)
    data = create_input("tf_raw", str(tmp_path / "csv"), global_batch_size=16)
    cols = read_columns(_spec(tmp_path / "csv"), "train")
    got = [_np(b) for b in data]
    np.testing.assert_array_equal(np.concatenate([g[1][1] for g in got]), cols["cat_1.bin"])
    np.testing.assert_allclose(np.concatenate([g[0] for g in got])[:, 1], cols["num_1"])


def test_empty_split_is_an_error_naming_the_directory(tmp_path):
    path = make_dataset(tmp_path / "d", train_rows=100, test_rows=0, table_sizes=[5])
    with pytest.raises(DataError, match=r"d/test: the split is empty"):
        create_input("tf_raw", path, mapping="test", global_batch_size=8)


def test_placement_and_context_shortcuts_give_each_rank_its_tables(small_dataset):
    """With C's real placement (2 ranks, one table data parallel), ctx/placement fill rank and input_tables."""
    from dlrm_dcnv2.distributed.hvd_utils import Context
    from dlrm_dcnv2.distributed.placement import plan_placement
    placement = plan_placement(TABLE_SIZES, 4, world_size=2, data_parallel_threshold=60 * 4)
    ref = list(open_reader(_spec(small_dataset), "train", batch_size=1024))
    seen = set()
    for rank in (0, 1):
        data = create_input("tf_raw", small_dataset, global_batch_size=1024, ctx=Context(rank=rank, world_size=2),
                            placement=placement)
        assert data.input_tables == placement.input_tables(rank) and data.rank == rank
        num, cat, lab = _np(next(iter(data)))
        np.testing.assert_array_equal(lab, ref[0]["label"][rank * 512:(rank + 1) * 512])
        for (table, is_global), ids in zip(placement.input_tables(rank), cat):
            want = ref[0]["categorical"][:, table]
            np.testing.assert_array_equal(ids, want if is_global else want[rank * 512:(rank + 1) * 512])
            seen.add((table, is_global))
    assert {t for t, g in seen if g} | {t for t, g in seen if not g} == set(range(len(TABLE_SIZES)))
    assert {t for t, g in seen if not g} == {4, 5, 6, 7}   # tables under 60 rows x dim 4 are data parallel
