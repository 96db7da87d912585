"""Synthetic input: deterministic by seed, independent of the world size, multi-hot, resumable, learnable."""
import numpy as np
import pytest

from dlrm_dcnv2.data import create_input

KW = dict(global_batch_size=256, synthetic_train_batches=4, synthetic_valid_batches=2,
          synthetic_cardinalities=[50, 7, 1000], synthetic_hotness=[1, 4, 1], synthetic_num_numerical=3)


def _all(data):
    return [(n.numpy(), [c.numpy() for c in cat], l.numpy()) for n, cat, l in data]


def _same(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[2], b[2])
    assert len(a[1]) == len(b[1])
    for x, y in zip(a[1], b[1]):
        np.testing.assert_array_equal(x, y)


def test_shapes_ranges_and_nvidia_defaults():
    data = create_input("synthetic", None, **KW)
    assert len(data) == 4 and len(create_input("synthetic", None, mapping="test", **KW)) == 2
    num, cat, lab = _all(data)[0]
    assert num.shape == (256, 3) and lab.shape == (256,) and set(np.unique(lab)) == {0.0, 1.0}
    assert [c.shape for c in cat] == [(256,), (256, 4), (256,)]
    assert cat[1].min() >= 0 and cat[1].max() < 7 and cat[2].max() < 1000
    # power law: the smallest ids are the most frequent
    assert np.mean(cat[2] < 10) > 0.3
    default = create_input("synthetic", None, global_batch_size=8)
    assert len(default) == 64008 and default.metadata.table_sizes == [1000] * 26
    assert default.metadata.hotness == [20] * 26 and default.metadata.num_numerical == 13


def test_deterministic_by_seed_and_distinct_across_batches_and_splits():
    a, b = _all(create_input("synthetic", None, seed=5, **KW)), _all(create_input("synthetic", None, seed=5, **KW))
    for x, y in zip(a, b):
        _same(x, y)
    c = _all(create_input("synthetic", None, seed=6, **KW))
    assert not np.array_equal(a[0][1][2], c[0][1][2])
    assert not np.array_equal(a[0][1][2], a[1][1][2])
    valid = _all(create_input("synthetic", None, seed=5, mapping="test", **KW))
    assert not np.array_equal(a[0][0], valid[0][0])


def test_two_ranks_see_slices_of_the_one_rank_batches():
    whole = _all(create_input("synthetic", None, **KW))
    tables = {0: [(0, True), (1, False)], 1: [(2, True), (1, False)]}
    ranks = [_all(create_input("synthetic", None, rank=r, world_size=2, input_tables=tables[r], **KW))
             for r in (0, 1)]
    for i, full in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([ranks[0][i][0], ranks[1][i][0]]), full[0])
        np.testing.assert_array_equal(np.concatenate([ranks[0][i][2], ranks[1][i][2]]), full[2])
        np.testing.assert_array_equal(ranks[0][i][1][0], full[1][0])
        np.testing.assert_array_equal(ranks[1][i][1][0], full[1][2])
        np.testing.assert_array_equal(np.concatenate([ranks[0][i][1][1], ranks[1][i][1][1]]), full[1][1])


def test_skip_and_cache():
    whole = _all(create_input("synthetic", None, **KW))
    data = create_input("synthetic", None, **KW)
    data.skip(3)
    resumed = _all(data)
    assert len(resumed) == 1
    _same(resumed[0], whole[3])
    cached = _all(create_input("synthetic", None, synthetic_cached_batches=2, **KW))
    _same(cached[2], whole[0])
    _same(cached[3], whole[1])


def test_labels_follow_the_hidden_model():
    """A logistic regression on one-hot ids scores a high AUC on held-out synthetic batches (the data is learnable)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    kw = dict(KW, global_batch_size=2048, synthetic_hotness=[1, 1, 1], synthetic_cardinalities=[50, 7, 30])
    train = _all(create_input("synthetic", None, **kw))
    valid = _all(create_input("synthetic", None, mapping="test", **kw))

    def features(batches):
        onehot = [np.concatenate([np.eye(s)[b[1][t]] for b in batches]) for t, s in enumerate([50, 7, 30])]
        return np.concatenate([np.concatenate([b[0] for b in batches])] + onehot, axis=1), \
            np.concatenate([b[2] for b in batches])

    x, y = features(train)
    xv, yv = features(valid)
    auc = roc_auc_score(yv, LogisticRegression(max_iter=200).fit(x, y).decision_function(xv))
    assert auc > 0.75, auc   # 0.83 measured; numericals alone give 0.57


def test_bad_synthetic_flags():
    with pytest.raises(ValueError, match="--synthetic_dataset_hotness has 2 entries"):
        create_input("synthetic", None, global_batch_size=8, synthetic_cardinalities=[4, 5, 6],
                     synthetic_hotness=[1, 2])
    with pytest.raises(ValueError, match="--synthetic_dataset_use_feature_spec needs --dataset_path"):
        create_input("synthetic", None, global_batch_size=8, synthetic_use_feature_spec=True)
    with pytest.raises(ValueError, match="not a multiple of the number of ranks 3"):
        create_input("synthetic", None, global_batch_size=8, world_size=3, input_tables=[])


def test_use_feature_spec_takes_tables_from_the_spec(small_dataset):
    data = create_input("synthetic", small_dataset, global_batch_size=32, synthetic_use_feature_spec=True,
                        synthetic_train_batches=2)
    assert data.metadata.table_sizes == [1000, 500, 200, 100, 50, 20, 10, 5]
    assert data.metadata.hotness == [1] * 8 and data.metadata.num_numerical == 13
    num, cat, lab = next(iter(data))
    assert max(int(c.numpy().max()) for c in cat[-3:]) < 20
