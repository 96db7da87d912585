"""Readers and writers: round trips, sharding and shuffling, whole-file and cardinality checks, atomic writes."""
import os

import numpy as np
import pytest

from recsys_common.datasets import DatasetError, DatasetWriter, open_reader, read_columns, write_columns
from recsys_common.feature_spec import FeatureSpec
from recsys_common.transcode import transcode

CARDS = [5, 300, 70000]


def _csv_dataset(tmp_path, rows=103, seed=0):
    """Headerless CSVs with a simplified spec (cardinality auto), as a user brings them to transcode."""
    rng = np.random.default_rng(seed)
    raw = tmp_path / "raw"
    raw.mkdir()
    columns = {}
    for m, n in (("train", rows), ("test", rows // 3)):
        cols = {"num_0": np.round(rng.normal(size=n), 3), "num_1": np.round(rng.random(n) * 10, 3),
                "label": rng.integers(0, 2, n)}
        for i, c in enumerate(CARDS):
            cols[f"cat_{i}"] = rng.integers(0, c, n)
        order = ["label", "num_0", "num_1", "cat_0", "cat_1", "cat_2"]
        with open(raw / f"{m}.csv", "w") as f:
            for r in range(n):
                f.write(",".join(str(cols[k][r]) for k in order) + "\n")
        columns[m] = cols
    spec = {
        "feature_spec": {"label": {"dtype": "int8"}, "num_0": {"dtype": "float32"}, "num_1": {"dtype": "float32"},
                         **{f"cat_{i}": {"dtype": "int32", "cardinality": "auto"} for i in range(3)}},
        "source_spec": {m: [{"type": "csv", "features": ["label", "num_0", "num_1", "cat_0", "cat_1", "cat_2"],
                             "files": [f"{m}.csv"]}] for m in ("train", "test")},
        "channel_spec": {"label": ["label"], "numerical": ["num_0", "num_1"],
                         "categorical": ["cat_0", "cat_1", "cat_2"]},
        "metadata": {},
    }
    import yaml
    (raw / "spec.yaml").write_text(yaml.safe_dump(spec))
    return raw, columns


def test_round_trip_csv_to_split_binary_to_reader(tmp_path):
    raw, columns = _csv_dataset(tmp_path)
    out = transcode(str(raw), str(raw / "spec.yaml"), str(tmp_path / "bin"), "split_binary")
    assert [out.feature_spec[f"cat_{i}"]["dtype"] for i in range(3)] == ["int8", "int16", "int32"]
    assert out.feature_spec["num_0"]["dtype"] == "float16" and out.feature_spec["label"]["dtype"] == "bool"
    for i in range(3):  # auto cardinality = max + 1
        assert out.feature_spec[f"cat_{i}"]["cardinality"] == int(max(columns[m][f"cat_{i}"].max()
                                                                       for m in columns)) + 1
    spec = FeatureSpec.from_yaml(str(tmp_path / "bin" / "feature_spec.yaml"), check_files=True)
    for m, cols in columns.items():
        batches = list(open_reader(spec, m, batch_size=16))
        got = {k: np.concatenate([b[k] for b in batches]) for k in ("label", "numerical", "categorical")}
        np.testing.assert_array_equal(got["label"], cols["label"].astype(np.float32))
        np.testing.assert_array_equal(got["categorical"], np.stack([cols[f"cat_{i}"] for i in range(3)], 1))
        expected_num = np.stack([cols["num_0"], cols["num_1"]], 1).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(got["numerical"], expected_num)
    assert sorted(os.listdir(tmp_path / "bin" / "train")) == ["cat_0.bin", "cat_1.bin", "cat_2.bin", "label.bin",
                                                               "numerical.bin"]


def test_round_trip_csv_to_parquet(tmp_path):
    raw, columns = _csv_dataset(tmp_path)
    spec = transcode(str(raw), str(raw / "spec.yaml"), str(tmp_path / "pq"), "parquet")
    cols = read_columns(spec, "train")
    np.testing.assert_array_equal(cols["cat_2"], columns["train"]["cat_2"])
    np.testing.assert_allclose(cols["num_1"], columns["train"]["num_1"], rtol=1e-6)


def test_transcode_output_is_all_or_nothing(tmp_path):
    raw, _ = _csv_dataset(tmp_path)
    with open(raw / "test.csv", "a") as f:
        f.write("1,0.5,0.5,1,2,-7\n")  # negative categorical id
    with pytest.raises(DatasetError, match="'cat_2' has negative value -7"):
        transcode(str(raw), str(raw / "spec.yaml"), str(tmp_path / "bin"), "split_binary")
    assert not os.path.exists(tmp_path / "bin")
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".bin")], "temporary output left behind"


def test_transcode_into_its_input_directory_keeps_the_input_and_the_users_notes(tmp_path):
    """The issue's scenario: --output is the directory holding the input CSVs, their spec and notes.txt."""
    from recsys_common import transcode as transcode_module
    from recsys_common.io import OutputDirectoryError
    raw, columns = _csv_dataset(tmp_path)
    (raw / "notes.txt").write_text("my notes")
    inputs = {name: (raw / name).read_bytes() for name in ("train.csv", "test.csv", "spec.yaml", "notes.txt")}
    args = ["--input", str(raw), "--feature_spec_in", "spec.yaml", "--output", str(raw)]
    with pytest.raises(OutputDirectoryError, match="not empty"):
        transcode_module.main(args)
    with pytest.raises(OutputDirectoryError, match="spec.yaml: exists and was not written by this tool"):
        transcode_module.main(args + ["--overwrite", "--feature_spec_out", "spec.yaml"])   # would clobber the input
    for _ in range(2):   # the second --overwrite replaces the first run's outputs
        out = transcode_module.main(args + ["--overwrite"])
    assert {name: (raw / name).read_bytes() for name in inputs} == inputs
    spec = FeatureSpec.from_yaml(str(raw / "feature_spec.yaml"), check_files=True)
    np.testing.assert_array_equal(read_columns(spec, "train")["cat_1"], columns["train"]["cat_1"])
    assert out.origin == str(raw / "feature_spec.yaml")


def test_csv_with_wrong_column_count_names_the_file(tmp_path):
    raw, _ = _csv_dataset(tmp_path)
    with open(raw / "train.csv", "a") as f:
        f.write("1,0.5,0.5,1,2\n")
    with pytest.raises(DatasetError, match=r"train\.csv: cannot read as headerless CSV"):
        transcode(str(raw), str(raw / "spec.yaml"), str(tmp_path / "bin"))


def _binary_dataset(tmp_path, rows=50, seed=0):
    spec = FeatureSpec.get_default_feature_spec(3, CARDS, base_directory=str(tmp_path / "ds"))
    rng = np.random.default_rng(seed)
    cols = {"label": rng.random(rows) < 0.5, **{f"num_{i}": rng.normal(size=rows) for i in range(3)},
            **{f"cat_{i}.bin": rng.integers(0, c, rows) for i, c in enumerate(CARDS)}}
    write_columns(spec, "train", cols)
    return spec, cols


@pytest.mark.parametrize("name, cut, message", [
    ("cat_1.bin", 1, r"cat_1\.bin: file is truncated .* record size 2"),      # int16: half a record
    ("cat_2.bin", 4, r"disagree on the number of rows .*cat_2\.bin=49"),      # int32: one whole record fewer
])
def test_a_truncated_or_short_binary_file_is_named(tmp_path, name, cut, message):
    spec, _ = _binary_dataset(tmp_path)
    path = spec.resolve_file(f"train/{name}")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - cut)
    with pytest.raises(DatasetError, match=message):
        open_reader(spec, "train", batch_size=8)


def test_categorical_value_at_cardinality_is_reported(tmp_path):
    spec, cols = _binary_dataset(tmp_path)
    values = cols["cat_1.bin"].astype(np.int16)
    values[37] = 300  # == cardinality
    values.tofile(spec.resolve_file("train/cat_1.bin"))
    with pytest.raises(DatasetError, match=r"cat_1\.bin: feature 'cat_1\.bin' row 37 has value 300 outside \[0, "
                                           r"cardinality=300\)"):
        list(open_reader(spec, "train", batch_size=8))


def test_writer_refuses_out_of_range_and_leaves_nothing(tmp_path):
    spec = FeatureSpec.get_default_feature_spec(1, [10], base_directory=str(tmp_path / "ds"))
    with pytest.raises(DatasetError, match=r"feature 'cat_0\.bin' row 5 has value 10"):
        with DatasetWriter(spec, "train") as w:
            w.write({"num_0": np.zeros(3), "label": np.ones(3), "cat_0.bin": np.array([1, 2, 3])})
            w.write({"num_0": np.zeros(3), "label": np.ones(3), "cat_0.bin": np.array([1, 2, 10])})
    left = [f for _, _, fs in os.walk(tmp_path / "ds") for f in fs]
    assert left == [], f"half-written files left: {left}"


def test_shards_partition_batches_and_shuffle_is_seeded(tmp_path):
    spec, cols = _binary_dataset(tmp_path, rows=100)
    world = 3
    seen = []
    for rank in range(world):
        r = open_reader(spec, "train", batch_size=7, rank=rank, world_size=world, shuffle=True, seed=5)
        seen += [tuple(b["categorical"][:, 2]) for b in r]
    all_batches = [tuple(b["categorical"][:, 2]) for b in open_reader(spec, "train", batch_size=7)]
    assert sorted(seen) == sorted(all_batches)  # every batch exactly once across ranks
    a = open_reader(spec, "train", batch_size=7, shuffle=True, seed=5)
    b = open_reader(spec, "train", batch_size=7, shuffle=True, seed=5)
    assert list(a.batch_order()) == list(b.batch_order())
    a.set_epoch(1)
    assert list(a.batch_order()) != list(b.batch_order())
    assert list(a.batch_order()) != sorted(a.batch_order())
    # 15 batches (14 full + 1 partial) over 4 ranks: even_batches keeps 12, three per rank.
    even = [len(open_reader(spec, "train", batch_size=7, rank=r, world_size=4, even_batches=True)) for r in range(4)]
    assert even == [3, 3, 3, 3]
    assert [len(open_reader(spec, "train", batch_size=7, rank=r, world_size=4)) for r in range(4)] == [4, 4, 4, 3]
    assert len(open_reader(spec, "train", batch_size=7, drop_last=True)) == 14


def test_parquet_multi_hot_round_trip(tmp_path):
    spec = FeatureSpec(
        feature_spec={"tags": {"dtype": "int64", "cardinality": 50, "max_hotness": 3},
                      "item": {"dtype": "int32", "cardinality": 9}, "clicked": {"dtype": "float32"}},
        source_spec={"train": [{"type": "parquet", "features": ["tags", "item", "clicked"],
                                "files": ["train/part.parquet"]}]},
        channel_spec={"multihot_categorical": ["tags"], "onehot_categorical": ["item"], "label": ["clicked"]},
        base_directory=str(tmp_path))
    tags = np.array([[1, 2, -1], [49, -1, -1], [3, 4, 5]])
    write_columns(spec, "train", {"tags": tags, "item": np.array([0, 8, 4]), "clicked": np.array([1.0, 0.0, 1.0])})
    batch = next(iter(open_reader(spec, "train", batch_size=3)))
    np.testing.assert_array_equal(batch["multihot_categorical"][0], tags)
    np.testing.assert_array_equal(batch["onehot_categorical"], [[0], [8], [4]])
    np.testing.assert_array_equal(batch["label"], [1.0, 0.0, 1.0])


def test_multi_file_csv_chunks_of_the_seed_example(tmp_path):
    import shutil
    shutil.copy(os.path.join(os.path.dirname(__file__), "fixtures", "seed_csv_example.yaml"), tmp_path / "fs.yaml")
    (tmp_path / "train_data_0_0.csv").write_text("0,31\n1,45\n")
    (tmp_path / "train_data_0_1.csv").write_text("2,22\n")
    (tmp_path / "train_data_1.csv").write_text("10,5,1.0\n2654,855,0.0\n7,0,1.0\n")
    (tmp_path / "test_data.csv").write_text("1,2,1.0,0,50\n")
    spec = FeatureSpec.from_yaml(str(tmp_path / "fs.yaml"), check_files=True)
    batch = next(iter(open_reader(spec, "train", batch_size=10)))
    np.testing.assert_array_equal(batch["categorical_user_inputs"], [[0, 10], [1, 2654], [2, 7]])
    np.testing.assert_array_equal(batch["numeric_inputs"], [[31], [45], [22]])
    np.testing.assert_array_equal(batch["label_ch"], [1.0, 0.0, 1.0])


def test_atomic_outputs_get_ordinary_permissions(tmp_path):
    from recsys_common.io import atomic_directory, atomic_write_text
    old = os.umask(0o022)
    try:
        atomic_write_text(str(tmp_path / "a.txt"), "x")
        with atomic_directory(str(tmp_path / "d")) as d:
            open(os.path.join(d, "f"), "w").close()
    finally:
        os.umask(old)
    assert (os.stat(tmp_path / "a.txt").st_mode & 0o777) == 0o644
    assert (os.stat(tmp_path / "d").st_mode & 0o777) == 0o755
