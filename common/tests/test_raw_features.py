"""Raw request values -> model inputs (recsys_common.serving.raw_features), in process: exactly what preprocessing
wrote for the same rows, on the real Criteo and Avazu samples; and the rule for unseen, rare, empty and malformed
values."""
import json
import os

import numpy as np
import pytest

from recsys_common.criteo import polars_preprocess
from recsys_common.datasets import read_columns
from recsys_common.feature_spec import FeatureSpec
from recsys_common.serving.model_config import TensorSpec
from recsys_common.serving.raw_features import (RAW_CATEGORICAL, RAW_INTEGER, RAW_NUMERICAL, RawFeatureError,
                                                copy_mapping_files, load_raw_mapper, model_inputs)
from recsys_testing import shared_data_path

pl = pytest.importorskip("polars", reason="polars maps raw values (ci/requirements.txt)")

TRAIN_END, TEST_END = 1714, 1857   # the Kaggle split of 1999 lines (layout.split_boundaries)
AVAZU_CATEGORICAL = ["C1", "banner_pos", "site_id", "app_id", "device_model", "C14", "C17", "C19", "C20", "C21"]
AVAZU_NUMERICAL = ["C15", "C16"]


def raw_fields(lines):
    """TSV lines -> (integer fields [n, 13], categorical fields [n, 26]) as text, rows padded to 40 fields."""
    fields = [(line.split("\t") + [""] * 40)[:40] for line in lines]
    return (np.array([f[1:14] for f in fields], dtype=object),
            np.array([[v.encode() for v in f[14:]] for f in fields], dtype=object))


def split_rows(dataset, split):
    cols = read_columns(FeatureSpec.from_yaml(os.path.join(dataset, "feature_spec.yaml")), split)
    numerical = np.stack([cols[f"num_{i}"] for i in range(13)], axis=1).astype(np.float32)
    categorical = np.stack([cols[f"cat_{i}.bin"] for i in range(26)], axis=1).astype(np.int64)
    return numerical, categorical


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """The 1999 real rows prepared by the default engine (frequency limit 3: many rare values); their raw lines."""
    work = tmp_path_factory.mktemp("criteo")
    raw_path = shared_data_path("criteo", "kaggle-train-head1999.tsv")
    (work / "in").mkdir()
    os.symlink(raw_path, work / "in" / "train.txt")
    polars_preprocess.main(["--input_path", str(work / "in"), "--output_path", str(work / "data"),
                            "--frequency_limit", "3", "--train_ordering", "input"])
    with open(raw_path, encoding="utf-8") as f:
        lines = f.read().split("\n")[:TEST_END]
    return str(work / "data"), lines


def test_criteo_raw_test_rows_map_to_the_preprocessed_test_split(criteo, tmp_path):
    dataset, lines = criteo
    # read from a copy of only the files it names: what a served model's directory holds
    copy_mapping_files(load_raw_mapper(dataset), str(tmp_path / "copy"))
    mapper = load_raw_mapper(str(tmp_path / "copy"))
    integers, categorical = raw_fields(lines[TRAIN_END:TEST_END])
    mapped = mapper.map({RAW_INTEGER: integers, RAW_CATEGORICAL: categorical})
    numerical, ids = split_rows(dataset, "test")
    np.testing.assert_array_equal(mapped["numerical"], numerical)
    np.testing.assert_array_equal(mapped["categorical"], ids)
    # the sample has every case: missing (0), rare or unseen (1), frequent (>= 2)
    assert {0, 1} <= set(np.unique(ids).tolist()) and (ids >= 2).any() and (numerical == 0).any()
    # and the train rows too (in input order): the values that made the dictionaries
    integers, categorical = raw_fields(lines[:TRAIN_END])
    mapped = mapper.map({RAW_INTEGER: integers, RAW_CATEGORICAL: categorical})
    numerical, ids = split_rows(dataset, "train")
    np.testing.assert_array_equal(mapped["categorical"], ids)
    np.testing.assert_array_equal(mapped["numerical"], numerical)


def test_criteo_unseen_rare_empty_and_integer_spellings(criteo):
    dataset, lines = criteo
    mapper = load_raw_mapper(dataset)
    counts = pl.read_parquet(os.path.join(dataset, "dictionaries", "0.parquet"))
    frequent = counts["value"][0]
    train_values = [(line.split("\t") + [""] * 40)[14] for line in lines[:TRAIN_END]]
    rare = next(v for v in set(train_values) if v and train_values.count(v) < 3)
    integers = np.array([["1", "", "-3", "-2", "260", "260.0", "2.6e2", "+7", "", "", "", "", "0"]] * 4, dtype=object)
    categorical = np.full((4, 26), b"", dtype=object)
    categorical[:, 0] = [frequent.encode(), rare.encode(), b"never-seen", b""]
    mapped = mapper.map({RAW_INTEGER: integers, RAW_CATEGORICAL: categorical})
    assert mapped["categorical"][:, 0].tolist() == [2, 1, 1, 0] and (mapped["categorical"][:, 1:] == 0).all()
    expected = [np.float16(np.float32(np.log(x + 3.0))) if x is not None and x > -3 else 0.0
                for x in [1, None, -3, -2, 260, 260, 260, 7, None, None, None, None, 0]]
    np.testing.assert_array_equal(mapped["numerical"][0], np.array(expected, np.float32))
    assert mapped["numerical"].dtype == np.float32 and mapped["categorical"].dtype == np.int64


@pytest.mark.parametrize("bad, message", [
    ("abc", r"raw_integer: row 1, column I3: 'abc' is not an integer"),
    ("2.5", r"row 1, column I3: '2.5' is not an integer"),
    ("1234567890123456789", r"column I3: '1234567890123456789' is not an integer"),
])
def test_criteo_malformed_integer_is_an_error_naming_row_and_column(criteo, bad, message):
    mapper = load_raw_mapper(criteo[0])
    integers = np.full((2, 13), "1", dtype=object)
    integers[1, 2] = bad
    with pytest.raises(RawFeatureError, match=message):
        mapper.map({RAW_INTEGER: integers, RAW_CATEGORICAL: np.full((2, 26), b"", dtype=object)})


def test_criteo_wrong_shapes_types_and_missing_inputs(criteo):
    mapper = load_raw_mapper(criteo[0])
    good_cat = np.full((1, 26), b"", dtype=object)
    with pytest.raises(RawFeatureError, match=r"'raw_integer': expected shape \[batch, 13\], got \[1, 12\]"):
        mapper.map({RAW_INTEGER: np.full((1, 12), "1", dtype=object), RAW_CATEGORICAL: good_cat})
    with pytest.raises(RawFeatureError, match=r"missing input\(s\) \['raw_categorical'\]"):
        mapper.map({RAW_INTEGER: np.full((1, 13), "1", dtype=object)})
    with pytest.raises(RawFeatureError, match=r"row 0, column 0: expected text \(BYTES\), got int"):
        mapper.map({RAW_INTEGER: np.full((1, 13), 1, dtype=object), RAW_CATEGORICAL: good_cat})
    with pytest.raises(RawFeatureError, match="raw_integer has 1 rows, raw_categorical 2"):
        mapper.map({RAW_INTEGER: np.full((1, 13), "1", dtype=object), RAW_CATEGORICAL: np.vstack([good_cat] * 2)})
    empty = mapper.map({RAW_INTEGER: np.zeros((0, 13), dtype=object), RAW_CATEGORICAL: np.zeros((0, 26), object)})
    assert empty["numerical"].shape == (0, 13) and empty["categorical"].shape == (0, 26)


def test_a_dataset_without_a_mapping_or_with_another_rule_is_refused(criteo, tmp_path):
    with pytest.raises(RawFeatureError, match="no saved raw-value mapping"):
        load_raw_mapper(str(tmp_path))
    copy_mapping_files(load_raw_mapper(criteo[0]), str(tmp_path / "copy"))
    rule_path = tmp_path / "copy" / "dictionaries" / "criteo.json"
    rule = json.loads(rule_path.read_text())
    rule["numerical"]["transform"] = "log(x + 1)"
    rule_path.write_text(json.dumps(rule))
    with pytest.raises(Exception, match="criteo.json: not the rule this version maps raw values with"):
        load_raw_mapper(str(tmp_path / "copy"))


def test_click_log_raw_rows_map_as_prepare_clicks_apply_does(tmp_path):
    from recsys_common import prepare_clicks
    raw_path = shared_data_path("avazu", "avazu-train-head999.csv")
    dataset = str(tmp_path / "clicks")
    prepare_clicks.prepare([raw_path], dataset, "click", AVAZU_CATEGORICAL, AVAZU_NUMERICAL, frequency_limit=3)
    applied = read_columns(prepare_clicks.apply(dataset, [raw_path], str(tmp_path / "applied")), "test")
    raw = pl.read_csv(raw_path, infer_schema=False)
    mapper = load_raw_mapper(dataset)
    mapped = mapper.map({RAW_CATEGORICAL: raw.select(AVAZU_CATEGORICAL).to_numpy().astype(object),
                         RAW_NUMERICAL: raw.select(AVAZU_NUMERICAL).to_numpy().astype(object)})
    np.testing.assert_array_equal(mapped["categorical"],
                                  np.stack([applied[c] for c in AVAZU_CATEGORICAL], axis=1).astype(np.int64))
    np.testing.assert_array_equal(mapped["numerical"],
                                  np.stack([applied[c] for c in AVAZU_NUMERICAL], axis=1).astype(np.float32))
    assert (mapped["categorical"] == 1).any() and (mapped["categorical"] >= 2).any()
    bad = raw.select(AVAZU_NUMERICAL).head(2).to_numpy().astype(object)
    bad[1, 0] = "x1"
    with pytest.raises(RawFeatureError, match=r"numerical column\(s\) \['C15'\]"):
        mapper.map({RAW_CATEGORICAL: raw.select(AVAZU_CATEGORICAL).head(2).to_numpy().astype(object),
                    RAW_NUMERICAL: bad})


def write_id_mappings(directory, users, items):
    """The files PyTorch/NCF's convert.py writes: ``raw, id`` by code."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(directory, exist_ok=True)
    for name, raw in (("user_ids.parquet", users), ("item_ids.parquet", items)):
        pq.write_table(pa.table({"raw": raw, "id": np.arange(len(raw), dtype=np.int32)}),
                       os.path.join(directory, name))
    return str(directory)


def test_ncf_ids_map_through_the_saved_mapping_and_unknown_ids_are_errors(tmp_path):
    directory = write_id_mappings(tmp_path, np.array([10, 30, 20], np.int64), np.array([5, 9, 6, 7], np.int64))
    mapper = load_raw_mapper(directory)
    assert [(s.name, s.dtype, list(s.dims)) for s in mapper.raw_inputs()] == [("user", "int64", [1]),
                                                                              ("item", "int64", [1])]
    mapped = mapper.map({"user": np.array([[20], [10], [30]]), "item": np.array([[7], [5], [6]])})
    assert mapped["user"][:, 0].tolist() == [2, 0, 1] and mapped["item"][:, 0].tolist() == [3, 0, 2]
    with pytest.raises(RawFeatureError, match=r"input 'item': row 1: item id 8 is not in the training data's "
                                              r"mapping \(item_ids.parquet; 1 unknown in this request\)"):
        mapper.map({"user": np.array([[20], [10]]), "item": np.array([[7], [8]])})
    with pytest.raises(RawFeatureError, match=r"expected integer ids \(INT64\), got float64"):
        mapper.map({"user": np.array([[20.0]]), "item": np.array([[7]])})
    text = load_raw_mapper(write_id_mappings(tmp_path / "text", np.array(["ann", "bob"]), np.array(["x", "y"])))
    assert text.raw_inputs()[0].dtype == "object"
    assert text.map({"user": np.array([[b"bob"]], dtype=object), "item": np.array([["x"]], dtype=object)}) \
        ["user"].tolist() == [[1]]


def test_model_inputs_take_whole_inputs_or_one_categorical_column_each_cast_to_the_served_dtype():
    mapped = {"numerical": np.ones((2, 3), np.float32), "categorical": np.array([[2, 3], [4, 5]], np.int64)}
    out = model_inputs(mapped, [TensorSpec("numerical", "float32", [3]), TensorSpec("cat_1", "int32", [1])])
    assert out["cat_1"].tolist() == [[3], [5]] and out["cat_1"].dtype == np.int32
    assert model_inputs(mapped, [TensorSpec("categorical", "int64", [2])])["categorical"].shape == (2, 2)
    with pytest.raises(RawFeatureError, match="served input 'dense'"):
        model_inputs(mapped, [TensorSpec("dense", "float32", [3])])


@pytest.mark.parametrize("genres", ["slots", "multi_hot"])
def test_movielens_ctr_raw_ratings_map_to_the_datasets_test_rows(tmp_path, genres):
    """Real MovieLens-1M (users 1-2999): a raw rating's UserID, MovieID and Timestamp give the test split's features
    (the test split is the latest ratings in time order)."""
    from recsys_common import movielens_ctr
    input_dir = shared_data_path("movielens", "ml-1m")
    spec = movielens_ctr.build_dataset(input_dir, str(tmp_path / "ctr"), genres=genres, shuffle_train=False)
    ratings = movielens_ctr.read_ratings(movielens_ctr.find_ratings_file(input_dir))
    order = np.argsort(ratings["timestamp"], kind="stable")
    test_rows = order[spec.metadata["num_samples"]["train"]:][:5000]
    mapper = load_raw_mapper(str(tmp_path / "ctr"))
    mapped = mapper.map({"UserID": ratings["user"][test_rows, None], "MovieID": ratings["movie"][test_rows, None],
                         "Timestamp": ratings["timestamp"][test_rows, None]})
    columns = read_columns(spec, "test")
    np.testing.assert_array_equal(
        mapped["numerical"], np.stack([columns[n] for n in movielens_ctr.NUMERICAL_FEATURES], axis=1)[:5000]
        .astype(np.float32))
    categorical = spec.channel_spec["categorical"]
    if genres == "slots":
        expected = np.stack([columns[n] for n in categorical], axis=1)[:5000].astype(np.int64)
        np.testing.assert_array_equal(mapped["categorical"], expected)
    else:
        for name in categorical:
            np.testing.assert_array_equal(mapped[name].reshape(len(test_rows), -1),
                                          np.asarray(columns[name])[:5000].reshape(len(test_rows), -1), err_msg=name)
    with pytest.raises(RawFeatureError, match=r"input 'MovieID': row 0: MovieID 99999 is not in the dataset's"):
        mapper.map({"UserID": np.array([[1]]), "MovieID": np.array([[99999]]), "Timestamp": np.array([[0]])})
