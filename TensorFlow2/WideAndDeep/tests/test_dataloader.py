"""ParquetBatches, our own parquet reader: the batches merlin.dataloader 23.08's Loader gave (its chunking, its
seeded shuffle, its rank sharding, drop_last), re-derived here from that definition with numpy's global legacy
generator as Merlin and pandas used it; multi-hot padding; the errors. (Checked batch for batch against the Merlin
Loader itself on the quickstart's Outbrain and MovieLens data, shuffled and not, 1 and 2 ranks, 2 epochs.)"""
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys_common.feature_spec import FeatureSpec

ROWS = (23, 17, 30, 11, 19)   # rows of the five files


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("batches")
    start, files = 0, []
    for i, n in enumerate(ROWS):
        ids = np.arange(start, start + n)
        lists = [list(range(k % 4)) for k in ids]          # 0 to 3 ids a row
        pq.write_table(pa.table({"label": (ids % 2).astype(np.int8), "display": ids // 3, "item": ids * 10,
                                 "num": ids / 7.0, "tags": pa.array(lists, pa.list_(pa.int64()))}),
                       str(root / f"part_{i}.parquet"), row_group_size=7)
        files.append(f"part_{i}.parquet")
        start += n
    features = ["label", "display", "item", "num", "tags"]
    spec = FeatureSpec({"label": {"dtype": "int8"}, "display": {"dtype": "int64"},
                        "item": {"dtype": "int64", "cardinality": 1000},
                        "tags": {"dtype": "int64", "cardinality": 4, "max_hotness": 3},
                        "num": {"dtype": "float64"}},
                       {"train": [{"type": "parquet", "features": features, "files": files}]},
                       {"label": ["label"], "map": ["display"], "onehot_categorical": ["item"],
                        "multihot_categorical": ["tags"], "numerical": ["num"]},
                       {}, base_directory=str(root), origin=str(root / "feature_spec.yaml"))
    return spec


def _expected_ids(rank, world, batch, shuffle, seed, epoch, drop_last):
    """The row ids Merlin's Loader gives, batch by batch (ids = row number over all files)."""
    offsets = np.cumsum((0,) + ROWS)
    per = math.ceil(len(ROWS) / world)
    mine = list(range(len(ROWS)))[rank * per:(rank + 1) * per]
    if shuffle:
        np.random.seed(seed + epoch)
        np.random.shuffle(np.arange(len(ROWS)))     # the partition shuffle: draws only
    batches, spill = [], np.array([], dtype=np.int64)
    for p in mine:
        chunk = np.concatenate([spill, np.arange(offsets[p], offsets[p + 1])])
        cut = len(chunk) // batch * batch
        chunk, spill = chunk[:cut], chunk[cut:]
        if shuffle:
            chunk = chunk[np.random.permutation(len(chunk))]   # pandas' DataFrame.sample(n=len)
        batches += [chunk[i:i + batch] for i in range(0, cut, batch)]
    if len(spill) and not drop_last:
        batches.append(spill)
    return batches


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("rank,world", [(0, 1), (0, 2), (1, 2), (1, 3), (2, 3)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_follow_the_merlin_loader(dataset, shuffle, rank, world, drop_last):
    from wide_deep.data.loader import ParquetBatches
    batches = ParquetBatches(dataset, "train", 8, rank, world, shuffle=shuffle, seed=11, drop_last=drop_last)
    for epoch in range(2):
        expected = _expected_ids(rank, world, 8, shuffle, 11, epoch, drop_last)
        got = list(batches)
        assert len(got) == len(expected) == len(batches)
        for (features, labels, display), ids in zip(got, expected):
            assert list(features) == ["item", "num", "tags"]
            np.testing.assert_array_equal(features["item"].numpy(), ids * 10)
            assert features["item"].dtype.name == "int32" and features["num"].dtype.name == "float32"
            np.testing.assert_array_equal(features["num"].numpy(), (ids / 7.0).astype(np.float32))
            np.testing.assert_array_equal(labels.numpy(), (ids % 2).astype(np.float32))
            np.testing.assert_array_equal(display.numpy(), ids // 3)
            tags = features["tags"].numpy()
            assert tags.shape == (len(ids), 3) and tags.dtype == np.int32
            np.testing.assert_array_equal(tags, [[j if j < k % 4 else -1 for j in range(3)] for k in ids])


def test_ranks_share_the_files_and_fewer_files_than_ranks_is_an_error(dataset):
    from wide_deep.data.loader import DataError, ParquetBatches
    sizes = [ParquetBatches(dataset, "train", 4, r, 2).shard_rows for r in range(2)]
    assert sizes == [23 + 17 + 30, 11 + 19]
    with pytest.raises(DataError, match="5 parquet partition"):
        ParquetBatches(dataset, "train", 4, 0, 6)


def test_a_list_longer_than_max_hotness_is_refused(dataset):
    from wide_deep.data.loader import DataError, ParquetBatches
    spec = dataset.copy()
    spec.feature_spec["tags"]["max_hotness"] = 2
    with pytest.raises(DataError, match="list of 3 ids, longer than its max_hotness 2"):
        list(ParquetBatches(spec, "train", 8))
