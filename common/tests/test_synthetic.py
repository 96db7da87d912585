"""Synthetic data: reproducible, the right shapes and ranges, power-law ids, and labels a model can learn."""
import os

import numpy as np
import pytest

from recsys_common import synthetic
from recsys_common.datasets import open_reader, read_columns
from recsys_common.feature_spec import FeatureSpec, FeatureSpecError
from recsys_common.io import OutputDirectoryError


def _spec():
    return FeatureSpec(
        feature_spec={"user": {"dtype": "int32", "cardinality": 1000}, "item": {"dtype": "int32", "cardinality": 40},
                      "tags": {"dtype": "int64", "cardinality": 200, "max_hotness": 4},
                      "price": {"dtype": "float32"}, "age": {"dtype": "int8"}, "click": {"dtype": "float32"}},
        source_spec={m: [{"type": "parquet", "features": ["user", "item", "tags", "price", "age", "click"],
                          "files": [f"{m}/part_0.parquet"]}] for m in ("train", "test")},
        channel_spec={"categorical": ["user", "item"], "multihot_categorical": ["tags"], "numerical": ["price", "age"],
                      "label": ["click"]})


def test_columns_have_declared_shapes_ranges_and_dtypes():
    cols = synthetic.generate_columns(_spec(), 5000, seed=3)
    assert cols["user"].dtype == np.int32 and 0 <= cols["user"].min() and cols["user"].max() < 1000
    tags = cols["tags"]
    assert tags.shape == (5000, 4)
    hot = (tags != -1).sum(1)
    assert hot.min() == 1 and hot.max() == 4
    assert ((tags == -1) | ((tags >= 0) & (tags < 200))).all()
    # padding only at the end of each row
    assert all(np.all(row[:h] >= 0) and np.all(row[h:] == -1) for row, h in zip(tags[:200], hot[:200]))
    assert set(np.unique(cols["click"])) == {0.0, 1.0}
    assert cols["age"].dtype == np.int8


def test_seeded_and_reproducible():
    a = synthetic.generate_columns(_spec(), 1000, seed=7)
    b = synthetic.generate_columns(_spec(), 1000, seed=7)
    c = synthetic.generate_columns(_spec(), 1000, seed=8)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["user"], c["user"])


def test_power_law_ids():
    rng = np.random.default_rng(0)
    ids = synthetic.power_law_ids(rng, 10**6, 200000)
    counts = np.bincount(ids, minlength=10**6)
    assert counts[0] > counts[10] > counts[1000]  # frequency falls with the id
    assert ids.max() < 10**6
    assert len(np.unique(ids)) > 20000  # a long tail, not a handful of ids
    huge = synthetic.power_law_ids(rng, 300_000_000, 1000)  # any cardinality, O(rows)
    assert huge.max() < 300_000_000


def test_labels_are_learnable_on_held_out_rows():
    """A simple learner on one-hot ids + numericals beats AUC 0.5 clearly on held-out synthetic rows."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import OneHotEncoder
    spec = FeatureSpec.get_default_feature_spec(3, [50, 200, 1000, 30])
    train = synthetic.generate_columns(spec, 20000, seed=1, stream=1)
    test = synthetic.generate_columns(spec, 5000, seed=1, stream=2)
    cats = [f"cat_{i}.bin" for i in range(4)]

    def x(cols, enc=None):
        c = np.stack([cols[f] for f in cats], 1)
        enc = enc or OneHotEncoder(handle_unknown="ignore").fit(c)
        from scipy.sparse import hstack, csr_matrix
        num = np.stack([cols[f"num_{i}"].astype(np.float32) for i in range(3)], 1)
        return hstack([enc.transform(c), csr_matrix(num)]).tocsr(), enc
    x_train, enc = x(train)
    x_test, _ = x(test, enc)
    model = LogisticRegression(max_iter=300, C=0.5).fit(x_train, train["label"])
    auc = roc_auc_score(test["label"], model.predict_proba(x_test)[:, 1])
    assert auc > 0.70, auc
    assert 0.15 < test["label"].mean() < 0.85


def test_generate_dataset_writes_every_mapping_and_the_spec_last(tmp_path):
    out = synthetic.generate_dataset(_spec(), str(tmp_path / "ds"), {"train": 300, "test": 50}, seed=2)
    again = FeatureSpec.from_yaml(str(tmp_path / "ds" / "feature_spec.yaml"), check_files=True)
    assert again.to_dict() == out.to_dict()
    batches = list(open_reader(again, "test", batch_size=64))
    assert sum(len(b["label"]) for b in batches) == 50
    assert isinstance(batches[0]["multihot_categorical"], list) and batches[0]["multihot_categorical"][0].shape[1] == 4


def test_cli_default_criteo_spec(tmp_path, capsys):
    out = synthetic.main(["--output", str(tmp_path / "d"), "--size", "2000", "--table_sizes", "10,20,40000",
                          "--num_numerical_features", "2"])
    text = capsys.readouterr().out
    assert "train: 2000 rows" in text and "test: 200 rows" in text and "rows/s" in text
    cols = read_columns(out, "train")
    assert cols["cat_2.bin"].dtype == np.int32 and cols["cat_0.bin"].dtype == np.int8
    assert sorted(os.listdir(tmp_path / "d" / "train")) == ["cat_0.bin", "cat_1.bin", "cat_2.bin", "label.bin",
                                                            "numerical.bin"]


def test_cli_mlperf_shape_has_mlperfs_hotness_in_every_row_and_capped_tables(tmp_path):
    out = synthetic.main(["--output", str(tmp_path / "d"), "--size", "300", "--mlperf_dcnv2",
                          "--max_table_size", "5000"])
    assert [out.feature_spec[f]["cardinality"] for f in out.channel_spec["categorical"]] == \
        [min(n, 5000) for n in synthetic.MLPERF_CARDINALITIES]
    assert [out.max_hotness(f) for f in out.channel_spec["categorical"]] == list(synthetic.MLPERF_HOTNESS)
    cols = read_columns(out, "train")
    wide = cols["cat_20.bin"]                                   # MLPerf's 100-hot table
    assert wide.shape == (300, 100) and wide.min() >= 0 and wide.max() < 5000   # every row full: no -1 padding
    assert len(np.unique(wide)) > 1000                          # ids spread over the table (power law, not one id)
    assert cols["cat_5.bin"].shape == (300,) and cols["cat_5.bin"].max() < 3
    with pytest.raises(ValueError, match="--hotness needs 2"):
        synthetic.default_spec([10, 20], [1], 1)


def test_cli_refuses_non_empty_output(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(OutputDirectoryError, match="not empty"):
        synthetic.main(["--output", str(tmp_path), "--size", "10"])
    assert (tmp_path / "x").read_text() == "keep me"


def _files(directory):
    return {os.path.relpath(os.path.join(r, n), directory): open(os.path.join(r, n), "rb").read()
            for r, _, names in os.walk(directory) for n in names}


def test_cli_overwrite_keeps_the_input_spec_and_the_users_notes(tmp_path):
    """The issue's scenario: the output directory holds the input (here the spec) and notes.txt."""
    _spec().to_yaml(str(tmp_path / "my_spec.yaml"))
    (tmp_path / "notes.txt").write_text("my notes")
    args = ["--feature_spec", str(tmp_path / "my_spec.yaml"), "--output", str(tmp_path), "--size", "100"]
    with pytest.raises(OutputDirectoryError, match="not empty.*--overwrite"):
        synthetic.main(args)
    synthetic.main(args + ["--overwrite"])
    out = synthetic.main(args + ["--overwrite", "--size", "50"])          # a re-run replaces its own outputs
    assert (tmp_path / "notes.txt").read_text() == "my notes"
    assert FeatureSpec.from_yaml(str(tmp_path / "my_spec.yaml")).to_dict() == _spec().to_dict()
    assert len(read_columns(out, "train")["click"]) == 50


def test_a_failure_part_way_through_an_overwrite_never_mixes_old_and_new_files(tmp_path, monkeypatch):
    out_dir = tmp_path / "ds"
    synthetic.generate_dataset(_spec(), str(out_dir), {"train": 300, "test": 50}, seed=2)
    before = _files(out_dir)
    real_write = synthetic.DatasetWriter.write

    def fail_on_test(self, columns):   # the train mapping is written, then the generator dies
        if self.mapping == "test":
            raise OSError("disk full")
        real_write(self, columns)

    monkeypatch.setattr(synthetic.DatasetWriter, "write", fail_on_test)
    with pytest.raises(OSError, match="disk full"):
        synthetic.generate_dataset(_spec(), str(out_dir), {"train": 200, "test": 20}, seed=3, overwrite=True)
    assert _files(out_dir) == before                 # the old dataset, whole and untouched
    monkeypatch.setattr(synthetic.DatasetWriter, "write", real_write)

    real_replace, moved = os.replace, []

    def crash_after_first_move(src, dst):           # the process dies while moving the new files in
        if ".recsys_tmp-" in str(src) and ".recsys_tmp-" not in str(dst):
            moved.append(dst)
            if len(moved) == 2:
                raise OSError("killed")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_after_first_move)
    with pytest.raises(OSError, match="killed"):
        synthetic.generate_dataset(_spec(), str(out_dir), {"train": 200, "test": 20}, seed=3, overwrite=True)
    monkeypatch.setattr(os, "replace", real_replace)
    after = _files(out_dir)
    assert "feature_spec.yaml" not in after          # not a dataset any more: no old spec over new files
    assert not any(after.get(name) == data for name, data in before.items() if name != ".recsys_outputs.json")
    out = synthetic.generate_dataset(_spec(), str(out_dir), {"train": 200, "test": 20}, seed=3, overwrite=True)
    assert len(read_columns(out, "train")["click"]) == 200 and len(read_columns(out, "test")["click"]) == 20


def test_auto_cardinality_is_refused():
    spec = _spec()
    spec.feature_spec["user"]["cardinality"] = "auto"
    with pytest.raises(FeatureSpecError, match="auto"):
        synthetic.generate_columns(spec, 10)
