"""MLPerf's multi-hot Criteo from a one-hot dataset (``recsys_common.criteo.multi_hot``): the same bags as MLPerf's
in-memory rule, whatever the piece size, resumed after a kill without redrawing finished tables, bad input refused."""
import os

import numpy as np
import pytest

from recsys_common import synthetic
from recsys_common.criteo import multi_hot
from recsys_common.datasets import read_columns
from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import OutputDirectoryError

CARDS = [50, 7, 300, 3, 1000]
SIZES = [50, 7, 200, 3, 1000]          # table 2 capped below its cardinality: ids taken modulo 200
HOTNESS = [3, 1, 5, 2, 1]


@pytest.fixture(scope="module")
def one_hot(tmp_path_factory):
    path = tmp_path_factory.mktemp("one_hot") / "data"
    synthetic.main(["--size", "3000", "--test_size", "500", "--table_sizes", ",".join(map(str, CARDS)),
                    "--num_numerical_features", "2", "--output", str(path)])
    return path


def _mlperf_bags(ids_by_table, distribution="uniform"):
    """MLPerf's rule written out in memory: seed 0 once, a whole [n, h-1] draw per table in order, L_t[id % n]."""
    np.random.seed(0)
    tables = []
    for n, h in zip(SIZES, HOTNESS):
        if distribution == "uniform":
            extra = np.random.randint(0, n, size=(n, h - 1))
        else:
            extra = np.random.pareto(a=0.25, size=(n, h - 1)).astype(np.int32) % n
        tables.append(np.concatenate([np.arange(n)[:, None], extra], axis=1))
    return [table[np.asarray(ids) % n] for table, n, ids in zip(tables, SIZES, ids_by_table)]


def _convert(one_hot, out, *more):
    return multi_hot.main(["--input", str(one_hot), "--output", str(out), "--multi_hot_sizes",
                           ",".join(map(str, HOTNESS)), "--num_embeddings_per_feature", ",".join(map(str, SIZES)),
                           "--block_rows", "700", *more])


@pytest.mark.parametrize("distribution", ["uniform", "pareto"])
def test_bags_equal_mlperfs_rule_in_any_piece_size(one_hot, tmp_path, monkeypatch, distribution):
    monkeypatch.setattr(multi_hot, "DRAW_ROWS", 7)   # lookup tables drawn 7 rows at a time
    out = _convert(one_hot, tmp_path / "mh", "--distribution", distribution)
    for mapping in ("train", "test"):
        result = read_columns(out, mapping)
        source = read_columns(FeatureSpec.from_yaml(str(one_hot / "feature_spec.yaml")), mapping)
        names = [f"cat_{t}.bin" for t in range(len(SIZES))]
        expected = _mlperf_bags([source[name] for name in names], distribution)
        for t, name in enumerate(names):
            got = result[name] if HOTNESS[t] > 1 else result[name][:, None]
            np.testing.assert_array_equal(got, expected[t], err_msg=f"{mapping} {name}")
        np.testing.assert_array_equal(result["label"], source["label"])
        np.testing.assert_array_equal(result["num_1"], source["num_1"])
    assert [out.max_hotness(f"cat_{t}.bin") for t in range(5)] == HOTNESS
    assert out.cardinality("cat_2.bin") == 200 and result["cat_2.bin"].max() < 200


def test_a_killed_run_resumes_at_the_first_unfinished_table(one_hot, tmp_path):
    lookup = tmp_path / "lookup"
    _convert(one_hot, tmp_path / "whole", "--lookup_dir", str(lookup))
    whole = {name: (lookup / name).read_bytes() for name in os.listdir(lookup) if name.endswith(".int32")}
    # as a kill after table 1: tables 2.. and their generator states are gone; table 0's file is kept
    for t in range(2, len(SIZES)):
        for path in (lookup / f"table_{t}.int32", lookup / f"rng_after_{t}.npz"):
            if path.exists():
                path.unlink()
    before = (lookup / "table_0.int32").stat().st_mtime_ns
    _convert(one_hot, tmp_path / "resumed", "--lookup_dir", str(lookup))
    assert (lookup / "table_0.int32").stat().st_mtime_ns == before          # not redrawn
    assert {name: (lookup / name).read_bytes() for name in whole} == whole  # the same draws from table 2 on


def test_bad_input_is_refused(one_hot, tmp_path):
    with pytest.raises(multi_hot.MultiHotError, match="more than its cardinality 300"):
        _convert(one_hot, tmp_path / "a", "--num_embeddings_per_feature", "50,7,301,3,1000")
    with pytest.raises(multi_hot.MultiHotError, match="--multi_hot_sizes has 2 values"):
        multi_hot.main(["--input", str(one_hot), "--output", str(tmp_path / "b"), "--multi_hot_sizes", "1,2"])
    lookup = tmp_path / "lookup"
    _convert(one_hot, tmp_path / "c", "--lookup_dir", str(lookup))
    with pytest.raises(multi_hot.MultiHotError, match="lookup tables of other settings"):
        _convert(one_hot, tmp_path / "d", "--lookup_dir", str(lookup), "--distribution", "pareto")
    with pytest.raises(OutputDirectoryError):
        _convert(one_hot, tmp_path / "c", "--lookup_dir", str(lookup))   # a finished output is not overwritten
    with pytest.raises(multi_hot.MultiHotError, match="already multi-hot"):
        multi_hot.main(["--input", str(tmp_path / "c"), "--output", str(tmp_path / "e")])
