"""Bad input data: every error names the file, the feature and (for values) the row."""
import os
import shutil

import numpy as np
import pytest
import yaml

from dlrm_dcnv2.data import DataError, create_input

from conftest import make_dataset


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    # tables: cat_0 int16 (1000), cat_1 int16 (500), cat_2 int8 (100)
    return make_dataset(tmp_path_factory.mktemp("bad_input_src"), train_rows=2000, test_rows=64,
                        table_sizes=[1000, 500, 100])


@pytest.fixture
def dataset(pristine, tmp_path):
    path = str(tmp_path / "data")
    shutil.copytree(pristine, path)
    return path


def _open(path, **kw):
    return create_input("tf_raw", path, global_batch_size=kw.pop("global_batch_size", 256), **kw)


def _iterate(data):
    for _ in data:
        pass


def test_file_size_not_a_multiple_of_the_record_size(dataset):
    with open(os.path.join(dataset, "train/numerical.bin"), "ab") as f:
        f.write(b"\0")
    with pytest.raises(DataError, match=r"train/numerical\.bin: 52001 bytes is not a multiple of the record size 26 "
                                        r"\(13 x float16\) of feature\(s\) \['num_0'.*truncated"):
        _open(dataset)


def test_files_disagreeing_on_rows_name_the_odd_file(dataset):
    path = os.path.join(dataset, "train/cat_1.bin")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 2 * 10)   # 10 int16 rows short
    with pytest.raises(DataError, match=r"disagree on the number of rows \(most hold 2000\); odd ones: "
                                        r"cat_1\.bin: 1990 rows"):
        _open(dataset)


def test_spec_dtype_that_does_not_match_the_file(dataset):
    spec_path = os.path.join(dataset, "feature_spec.yaml")
    with open(spec_path) as f:
        spec = yaml.safe_load(f)
    spec["feature_spec"]["cat_0.bin"]["dtype"] = "int32"   # the file holds int16
    with open(spec_path, "w") as f:
        yaml.safe_dump(spec, f)
    with pytest.raises(DataError, match=r"cat_0\.bin: 1000 rows \(cat_0\.bin\.\.\. as int32\)"):
        _open(dataset)


def test_missing_file_named_with_its_feature(dataset):
    os.remove(os.path.join(dataset, "train/cat_2.bin"))
    with pytest.raises(DataError, match=r"train/cat_2\.bin: file of feature\(s\) \['cat_2\.bin'\] .* not found"):
        _open(dataset)


def test_missing_feature_spec(tmp_path):
    with pytest.raises(DataError, match=r"nowhere/feature_spec\.yaml: feature spec not found"):
        _open(str(tmp_path / "nowhere"))


def test_unknown_dataset_type(dataset):
    with pytest.raises(ValueError, match="--dataset_type 'tfrecord' is not one of tf_raw, synthetic, split_tfrecords"):
        create_input("tfrecord", dataset, global_batch_size=8)


def _poke(path, dtype, row, value, width=1, col=0):
    data = np.fromfile(path, dtype=dtype).reshape(-1, width)
    data[row, col] = value
    data.tofile(path)


def test_out_of_range_id_names_value_row_feature_and_file(dataset):
    _poke(os.path.join(dataset, "train/cat_2.bin"), np.int8, 1234, 100)
    data = _open(dataset)
    with pytest.raises(DataError, match=r"train/cat_2\.bin: categorical feature 'cat_2\.bin' row 1234 has id 100 "
                                        r"outside \[0, cardinality=100\)"):
        _iterate(data)


def test_negative_id_seen_by_the_rank_that_reads_it(dataset):
    _poke(os.path.join(dataset, "train/cat_0.bin"), np.int16, 300, -7)
    rank0 = create_input("tf_raw", dataset, global_batch_size=256, rank=0, world_size=2,
                         input_tables=[(0, False)], prefetch=0)
    rank1 = create_input("tf_raw", dataset, global_batch_size=256, rank=1, world_size=2,
                         input_tables=[(0, False)], prefetch=0)
    _iterate(rank1)   # rank 1's slice of batch 1 is rows 384..511: clean
    with pytest.raises(DataError, match=r"cat_0\.bin' row 300 has id -7"):
        _iterate(rank0)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_numerical_names_file_feature_and_row(dataset, value):
    _poke(os.path.join(dataset, "train/numerical.bin"), np.float16, 777, value, width=13, col=4)
    with pytest.raises(DataError, match=r"train/numerical\.bin: numerical feature 'num_4' row 777 is "
                                        r"(nan|inf|-inf) \(NaN/inf\)"):
        _iterate(_open(dataset))
    _iterate(_open(dataset, allow_nonfinite=True))   # the opt-out reads it


def test_unreadable_file_fails_at_open_not_mid_epoch(dataset, monkeypatch):
    from dlrm_dcnv2.data import raw_binary_dataset

    def refuse(path, flags):
        if path.endswith("cat_1.bin"):
            raise PermissionError(13, "Permission denied", path)
        return os.open(path, flags)
    monkeypatch.setattr(raw_binary_dataset, "_open_fd", refuse)
    with pytest.raises(DataError, match=r"train/cat_1\.bin: cannot open for features \['cat_1\.bin'\]: "
                                        r"Permission denied"):
        _open(dataset)
    _open(dataset, rank=0, world_size=2, input_tables=[(0, True), (2, True)])   # a rank without table 1 is fine


def test_fewer_rows_than_ranks(tmp_path):
    path = make_dataset(tmp_path / "d", train_rows=10, test_rows=1, table_sizes=[5])
    with pytest.raises(DataError, match=r"d/test: 1 row\(s\) are fewer than the 2 ranks"):
        create_input("tf_raw", path, mapping="test", global_batch_size=8, world_size=2, input_tables=[(0, True)])


def _tfrecords(tmp_path, ids, max_hotness_in_spec):
    from dlrm_dcnv2.data.dataloader import DatasetMetadata
    from dlrm_dcnv2.data.split_tfrecords_dataset import SplitWriter, tfrecords_spec
    meta = DatasetMetadata([10], [ids.shape[1]], 1, ["cat_0.bin"], ["num_0"])
    spec = tfrecords_spec(meta, ["train"])
    writer = SplitWriter(spec, str(tmp_path), "train", prebatch_size=2)
    writer.write(np.zeros((len(ids), 1), np.float32), [ids], np.zeros(len(ids), np.float32))
    writer.close()
    spec.feature_spec["cat_0.bin"]["max_hotness"] = max_hotness_in_spec
    spec.base_directory = str(tmp_path)
    spec.to_yaml(str(tmp_path / "feature_spec.yaml"))
    return str(tmp_path)


def test_split_tfrecords_missing_directory(tmp_path):
    path = _tfrecords(tmp_path, np.array([[1, 2, -1], [3, -1, -1], [4, 5, 6]]), 3)
    shutil.rmtree(os.path.join(path, "train", "label"))
    with pytest.raises(DataError, match=r"train/label: directory of feature\(s\) \['label'\] not found"):
        create_input("split_tfrecords", path, global_batch_size=3)


def test_split_tfrecords_more_ids_than_the_spec_max_hotness(tmp_path):
    path = _tfrecords(tmp_path, np.array([[1, 2, -1], [3, -1, -1], [4, 5, 6]]), 2)
    with pytest.raises(DataError, match=r"train/cat_0/data_0\.tfrecords: multi-hot feature 'cat_0\.bin' row 2 has 3 "
                                        r"ids, more than max_hotness=2 of the spec"):
        list(create_input("split_tfrecords", path, global_batch_size=3))


def test_split_tfrecords_length_json_disagreeing_with_the_files(tmp_path):
    import json
    path = _tfrecords(tmp_path, np.array([[1, 2], [3, -1], [4, 5]]), 2)
    meta_path = os.path.join(path, "train", "numerical", "length.json")
    meta = json.load(open(meta_path))
    meta["num_records"] = 3
    json.dump(meta, open(meta_path, "w"))
    with pytest.raises(DataError, match=r"train/numerical: holds 2 records, length\.json says 3"):
        create_input("split_tfrecords", path, global_batch_size=3)


def test_training_on_bad_data_exits_2_naming_the_file_and_writes_no_checkpoint(dataset, tmp_path, capsys):
    """Through the entry point: a bad id mid-epoch ends the run with status 2 (bad input: DataError is a
    recsys_common.cli.InputError, as every bad-input error of the tree) and one line naming file and row."""
    from conftest import tiny_model_flags
    from dlrm_dcnv2.train import cli
    _poke(os.path.join(dataset, "train/cat_1.bin"), np.int16, 300, 600)   # cardinality 500; batch 1
    save = tmp_path / "ckpt"
    status = cli(tiny_model_flags("dlrm") + ["--dataset_path", dataset, "--seed", "1", "--batch_size", "256",
                                             "--save_checkpoint_path", str(save)], model="dlrm")
    err = capsys.readouterr().err
    assert status == 2
    assert "train/cat_1.bin: categorical feature 'cat_1.bin' row 300 has id 600 outside [0, cardinality=500)" in err
    assert not save.exists() or not any(p.name.startswith("step_") for p in save.iterdir())
