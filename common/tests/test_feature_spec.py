"""FeatureSpec: NVIDIA-compatible loading, validation errors that name the key, path confinement, round trip."""
import os
import shutil

import numpy as np
import pytest
import yaml

from recsys_common.datasets import open_reader
from recsys_common.feature_spec import FeatureSpec, FeatureSpecError, normalize_dtype, smallest_int_dtype

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _write_nvidia_layout_files(base, rows=10, seed=0):
    """Raw bytes exactly as NVIDIA's split_dataset.py lays them out (B.2), written without our writer."""
    rng = np.random.default_rng(seed)
    data = {}
    for m in ("train", "test"):
        os.makedirs(os.path.join(base, m), exist_ok=True)
        num = rng.normal(size=(rows, 4)).astype(np.float16)
        label = rng.random(rows) < 0.3
        cats = [rng.integers(0, c, rows).astype(t) for c, t in ((7912889, np.int32), (11, np.int8), (2209, np.int16))]
        num.tofile(os.path.join(base, m, "numerical.bin"))
        label.tofile(os.path.join(base, m, "label.bin"))
        for i, c in enumerate(cats):
            c.tofile(os.path.join(base, m, f"cat_{i}.bin"))
        data[m] = (num, label, cats)
    return data


def test_nvidia_published_layout_loads_validates_and_reads(tmp_path):
    shutil.copy(os.path.join(FIXTURES, "nvidia_split_binary.yaml"), tmp_path / "feature_spec.yaml")
    data = _write_nvidia_layout_files(str(tmp_path))
    spec = FeatureSpec.from_yaml(str(tmp_path / "feature_spec.yaml"), check_files=True)
    assert spec.channel_spec["numerical"] == ["num_0", "num_1", "num_2", "num_3"]
    assert spec.cardinality("cat_0.bin") == 7912889
    assert spec.numpy_dtype("cat_1.bin") == np.int8
    batches = list(open_reader(spec, "train", batch_size=4))
    assert [len(b["label"]) for b in batches] == [4, 4, 2]
    num, label, cats = data["train"]
    got_num = np.concatenate([b["numerical"] for b in batches])
    np.testing.assert_array_equal(got_num, num.astype(np.float32))
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in batches]), label.astype(np.float32))
    got_cat = np.concatenate([b["categorical"] for b in batches])
    np.testing.assert_array_equal(got_cat, np.stack(cats, 1).astype(np.int64))


def test_seed_csv_example_spec_loads_with_torch_dtypes():
    spec = FeatureSpec.from_yaml(os.path.join(FIXTURES, "seed_csv_example.yaml"))
    assert spec.numpy_dtype("user_gender") == np.int8
    assert spec.numpy_dtype("label") == np.float32
    assert len(spec.source_spec["train"]) == 2 and spec.source_spec["train"][0]["files"][1] == "train_data_0_1.csv"


def test_default_feature_spec_matches_nvidia_fixture():
    fixture = FeatureSpec.from_yaml(os.path.join(FIXTURES, "nvidia_split_binary.yaml"))
    ours = FeatureSpec.get_default_feature_spec(4, [7912889, 11, 2209])
    assert ours.feature_spec == fixture.feature_spec
    assert ours.channel_spec == fixture.channel_spec
    assert {k: v for k, v in ours.source_spec.items()} == fixture.source_spec


def test_yaml_round_trip(tmp_path):
    spec = FeatureSpec.get_default_feature_spec(2, [5, 300], base_directory=str(tmp_path))
    spec.metadata["note"] = "hello"
    spec.to_yaml(str(tmp_path / "fs.yaml"))
    again = FeatureSpec.from_yaml(str(tmp_path / "fs.yaml"))
    assert again.to_dict() == spec.to_dict()
    assert again.base_directory == str(tmp_path)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")], "temporary file left behind"


@pytest.mark.parametrize("dtype,expected", [("torch.float16", "float16"), ("tf.int32", "int32"), ("np.int8", "int8"),
                                            ("numpy.bool", "bool"), ("int64", "int64"), ("torch.long", "int64")])
def test_dtype_spellings(dtype, expected):
    assert normalize_dtype(dtype) == expected


def test_smallest_int_dtype_follows_nvidia_rule():
    assert smallest_int_dtype(126) == "int8" and smallest_int_dtype(127) == "int16"
    assert smallest_int_dtype(32766) == "int16" and smallest_int_dtype(32767) == "int32"


def _spec_dict():
    return yaml.safe_load(open(os.path.join(FIXTURES, "nvidia_split_binary.yaml")))


def _load(tmp_path, d, **kw):
    path = tmp_path / "feature_spec.yaml"
    path.write_text(yaml.safe_dump(d))
    return FeatureSpec.from_yaml(str(path), **kw)


def test_error_unknown_dtype(tmp_path):
    d = _spec_dict()
    d["feature_spec"]["num_2"]["dtype"] = "float17"
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.num_2\.dtype: unknown dtype 'float17'"):
        _load(tmp_path, d)


def test_error_channel_names_missing_feature(tmp_path):
    d = _spec_dict()
    d["channel_spec"]["numerical"].append("num_99")
    with pytest.raises(FeatureSpecError, match=r"channel_spec\.numerical names feature 'num_99'"):
        _load(tmp_path, d)


def test_error_categorical_without_cardinality(tmp_path):
    d = _spec_dict()
    del d["feature_spec"]["cat_1.bin"]["cardinality"]
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.cat_1\.bin: categorical .* has no cardinality"):
        _load(tmp_path, d)


def test_error_bad_cardinality_and_auto(tmp_path):
    d = _spec_dict()
    d["feature_spec"]["cat_1.bin"]["cardinality"] = "auto"
    with pytest.raises(FeatureSpecError, match=r"cat_1\.bin\.cardinality is 'auto'"):
        _load(tmp_path, d)
    assert _load(tmp_path, d, allow_auto=True).feature_spec["cat_1.bin"]["cardinality"] == "auto"
    d["feature_spec"]["cat_1.bin"]["cardinality"] = -3
    with pytest.raises(FeatureSpecError, match=r"cat_1\.bin\.cardinality must be a positive integer"):
        _load(tmp_path, d)


def test_error_chunk_lists_unknown_feature(tmp_path):
    d = _spec_dict()
    d["source_spec"]["train"][1]["features"] = ["labels"]
    with pytest.raises(FeatureSpecError, match=r"source_spec\.train\[1\]\.features lists 'labels'"):
        _load(tmp_path, d)


def test_error_unknown_chunk_type(tmp_path):
    d = _spec_dict()
    d["source_spec"]["test"][0]["type"] = "hdf5"
    with pytest.raises(FeatureSpecError, match=r"source_spec\.test\[0\]\.type: unknown chunk type 'hdf5'"):
        _load(tmp_path, d)


def test_error_missing_file(tmp_path):
    d = _spec_dict()
    with pytest.raises(FeatureSpecError, match=r"source_spec\.test\[0\]\.files: file 'test/numerical.bin' not found"):
        _load(tmp_path, d, check_files=True)


def test_error_missing_section(tmp_path):
    d = _spec_dict()
    del d["channel_spec"]
    with pytest.raises(FeatureSpecError, match="missing required section 'channel_spec'"):
        _load(tmp_path, d)


@pytest.mark.parametrize("bad", ["../outside.bin", "/etc/passwd", "train/../../x.bin"])
def test_paths_must_stay_inside_dataset_directory(tmp_path, bad):
    d = _spec_dict()
    d["source_spec"]["train"][1]["files"] = [bad]
    with pytest.raises(FeatureSpecError, match="(outside the dataset directory|is absolute)"):
        _load(tmp_path, d)


def test_symlink_escape_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "label.bin").write_bytes(b"\x01")
    base = tmp_path / "data"
    base.mkdir()
    os.symlink(outside, base / "train")
    d = _spec_dict()
    path = base / "feature_spec.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(FeatureSpecError, match="outside the dataset directory"):
        FeatureSpec.from_yaml(str(path))


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "fs.yaml"
    path.write_text("!!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(FeatureSpecError, match="not valid YAML"):
        FeatureSpec.from_yaml(str(path))


# ------------------------------------------------------------------------------- NVIDIA's hand-written BYO specs
def _write_csv(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(",".join(str(v) for v in row) + "\n" for row in rows))


def _ncf_byo_dataset(tmp_path):
    """NVIDIA's NCF BYO spec next to its three headerless CSV files (user, item, label); returns the rows."""
    shutil.copy(os.path.join(FIXTURES, "nvidia_byo_ncf_csv.yaml"), tmp_path / "feature_spec.yaml")
    rng = np.random.default_rng(3)
    rows = {name: [(int(rng.integers(0, 9)), int(rng.integers(0, 30)), int(rng.integers(0, 2))) for _ in range(n)]
            for name, n in (("train_data_1.csv", 7), ("train_data_2.csv", 5), ("test_data_1.csv", 6))}
    rows["train_data_2.csv"][0] = (11, 37, 1)   # the largest ids: auto cardinalities 12 and 38
    for name, r in rows.items():
        _write_csv(str(tmp_path / name), r)
    return rows


def test_nvidia_byo_ncf_spec_loads_without_dtypes_and_reports_auto_clearly(tmp_path):
    _ncf_byo_dataset(tmp_path)
    path = str(tmp_path / "feature_spec.yaml")
    spec = FeatureSpec.from_yaml(path, check_files=True, allow_auto=True)
    assert spec.feature_spec["label"] == {} and spec.feature_spec["user"] == {"cardinality": "auto"}
    assert spec.metadata == {"test_samples_per_series": 3}
    # Missing dtypes: int64 for categorical features, float32 for the rest (documented defaults).
    assert spec.numpy_dtype("user") == np.int64 and spec.numpy_dtype("label") == np.float32
    # A reader that needs the number says which feature and what to run.
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.user\.cardinality is 'auto'.*recsys_common\.transcode"):
        spec.cardinality("user")
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.user\.cardinality is 'auto'.*recsys_common\.transcode"):
        FeatureSpec.from_yaml(path)
    with pytest.raises(FeatureSpecError, match=r"cardinality is 'auto'"):
        open_reader(spec, "train", batch_size=4)


def test_nvidia_byo_ncf_spec_transcodes_and_reads_back(tmp_path):
    from recsys_common import transcode
    rows = _ncf_byo_dataset(tmp_path)
    out = transcode.transcode(str(tmp_path), str(tmp_path / "feature_spec.yaml"), str(tmp_path / "out"),
                              fmt="parquet")
    assert out.cardinality("user") == 12 and out.cardinality("item") == 38
    written = FeatureSpec.from_yaml(str(tmp_path / "out" / "feature_spec.yaml"), check_files=True)
    assert all(written.has_dtype(f) for f in written.feature_spec), written.feature_spec
    train = rows["train_data_1.csv"] + rows["train_data_2.csv"]
    batches = list(open_reader(written, "train", batch_size=100))
    np.testing.assert_array_equal(batches[0]["user_ch"].ravel(), [r[0] for r in train])
    np.testing.assert_array_equal(batches[0]["item_ch"].ravel(), [r[1] for r in train])
    np.testing.assert_array_equal(batches[0]["label_ch"].ravel(), [r[2] for r in train])


def test_byo_spec_without_dtypes_reads_csv_with_default_dtypes(tmp_path):
    rows = _ncf_byo_dataset(tmp_path)
    d = yaml.safe_load(open(tmp_path / "feature_spec.yaml"))
    d["feature_spec"]["user"]["cardinality"] = 12
    d["feature_spec"]["item"]["cardinality"] = 38
    spec = _load(tmp_path, d, check_files=True)
    cols = {}
    from recsys_common.datasets import read_columns
    cols = read_columns(spec, "test")
    assert cols["user"].dtype == np.int64 and cols["label"].dtype == np.float32
    np.testing.assert_array_equal(cols["item"], [r[1] for r in rows["test_data_1.csv"]])


def test_nvidia_byo_dlrm_spec_with_anchors_transcodes_to_split_binary(tmp_path):
    from recsys_common import transcode
    shutil.copy(os.path.join(FIXTURES, "nvidia_byo_dlrm_csv.yaml"), tmp_path / "feature_spec.yaml")
    rng = np.random.default_rng(5)
    data = {}
    for m, n in (("train", 9), ("test", 4)):
        num = np.round(rng.normal(size=(n, 3)), 2)
        label = rng.integers(0, 2, n)
        cat = np.stack([rng.integers(0, 200, n), rng.integers(0, 40, n), rng.integers(0, 3, n)], axis=1)
        _write_csv(str(tmp_path / m / "numerical.csv"), num.tolist())
        _write_csv(str(tmp_path / m / "label.csv"), label[:, None].tolist())
        _write_csv(str(tmp_path / m / "categorical.csv"), cat.tolist())
        data[m] = (num, label, cat)
    spec = FeatureSpec.from_yaml(str(tmp_path / "feature_spec.yaml"), allow_auto=True)
    assert spec.source_spec["train"][0]["features"] == ["num_0", "num_1", "num_2"]
    assert spec.feature_spec["num_2"] == {} and spec.feature_spec["label"] == {}
    out = transcode.transcode(str(tmp_path), str(tmp_path / "feature_spec.yaml"), str(tmp_path / "bin"))
    expected_card = max(data["train"][2][:, 0].max(), data["test"][2][:, 0].max()) + 1
    assert out.cardinality("cat_0.bin") == expected_card and out.cardinality("cat_1.bin") == 40
    assert out.numpy_dtype("num_0") == np.float16 and out.numpy_dtype("label") == np.bool_
    written = FeatureSpec.from_yaml(str(tmp_path / "bin" / "feature_spec.yaml"), check_files=True)
    num, label, cat = data["test"]
    batch = next(iter(open_reader(written, "test", batch_size=10)))
    np.testing.assert_array_equal(batch["categorical"], cat)
    np.testing.assert_array_equal(batch["label"], label.astype(np.float32))
    np.testing.assert_allclose(batch["numerical"], num.astype(np.float16).astype(np.float32))


def test_yaml_aliases_are_not_shared_after_loading(tmp_path):
    """NVIDIA's specs reuse the numerical list by alias; editing the channel must not edit the stored chunks."""
    shutil.copy(os.path.join(FIXTURES, "nvidia_byo_dlrm_csv.yaml"), tmp_path / "feature_spec.yaml")
    spec = FeatureSpec.from_yaml(str(tmp_path / "feature_spec.yaml"), allow_auto=True)
    spec.channel_spec["numerical"].remove("num_2")
    assert spec.source_spec["train"][0]["features"] == ["num_0", "num_1", "num_2"]
    assert spec.source_spec["test"][0]["features"] is not spec.source_spec["train"][0]["features"]


def test_split_binary_feature_without_dtype_is_refused_naming_it(tmp_path):
    d = _spec_dict()
    del d["feature_spec"]["cat_2.bin"]["dtype"]
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.cat_2\.bin\.dtype is missing; .*split_binary chunk "
                                               r"source_spec\.test\[4\]"):
        _load(tmp_path, d)
