"""split_tfrecords: transcribe round trips (split-binary, parquet multi-hot, synthetic), per-rank reads, bad files."""
import os
import subprocess
import sys

import numpy as np
import pytest

from recsys_common.datasets import read_columns
from recsys_common.feature_spec import FeatureSpec

from dlrm_dcnv2.data import DataError, create_input
from dlrm_dcnv2.data.transcribe import main as transcribe_main
from dlrm_dcnv2.data.transcribe import parse_int_list, transcribe

from conftest import subprocess_env


def _all(data):
    return [(n.numpy(), [c.numpy() for c in cat], l.numpy()) for n, cat, l in data]


def _same(xs, ys):
    assert len(xs) == len(ys)
    for a, b in zip(xs, ys):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[2], b[2])
        assert len(a[1]) == len(b[1])
        for x, y in zip(a[1], b[1]):
            np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def converted(small_dataset, tmp_path_factory):
    dst = str(tmp_path_factory.mktemp("tfr") / "out")
    # prebatch 300 and batches of 1000 do not align: reads straddle records and files (4 records per file)
    transcribe("tf_raw", small_dataset, dst, src_batch_size=700, dst_prebatch_size=300, records_per_file=4)
    return dst


def test_round_trip_from_split_binary(small_dataset, converted):
    for mapping in ("train", "test"):
        src = _all(create_input("tf_raw", small_dataset, mapping=mapping, global_batch_size=1000))
        got = create_input("split_tfrecords", converted, mapping=mapping, global_batch_size=1000)
        assert got.metadata.table_sizes == [1000, 500, 200, 100, 50, 20, 10, 5]
        _same(_all(got), src)
    assert sorted(os.listdir(os.path.join(converted, "train", "cat_0"))) == \
        ["data_0.tfrecords", "data_1.tfrecords", "data_2.tfrecords", "data_3.tfrecords", "data_4.tfrecords",
         "data_5.tfrecords", "data_6.tfrecords", "length.json"]   # 8192 rows / 300 = 28 records, 4 per file


def test_two_ranks_read_their_directories_and_slices(converted):
    whole = _all(create_input("split_tfrecords", converted, global_batch_size=1024))
    tables = {0: [(0, True), (3, True), (7, False)], 1: [(1, True), (2, True), (7, False)]}
    ranks = {}
    for r in (0, 1):
        data = create_input("split_tfrecords", converted, global_batch_size=1024, rank=r, world_size=2,
                            input_tables=tables[r])
        assert [os.path.basename(p) for p in data.opened_files] == \
            sorted([f"cat_{t}" for t, _ in tables[r]] + ["label", "numerical"])
        ranks[r] = _all(data)
    for i, full in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([ranks[0][i][0], ranks[1][i][0]]), full[0])
        np.testing.assert_array_equal(np.concatenate([ranks[0][i][2], ranks[1][i][2]]), full[2])
        for r in (0, 1):
            for (t, is_global), ids in zip(tables[r], ranks[r][i][1]):
                np.testing.assert_array_equal(ids, full[1][t] if is_global else full[1][t][r * 512:(r + 1) * 512])


def test_skip_resumes_exactly(converted):
    whole = _all(create_input("split_tfrecords", converted, global_batch_size=900))
    data = create_input("split_tfrecords", converted, global_batch_size=900)
    _same(_all(data.skip(6)), whole[6:])


def test_parquet_multi_hot_round_trip(tmp_path):
    from recsys_common.synthetic import generate_dataset
    spec = FeatureSpec.get_default_feature_spec(2, [30, 12, 9])
    spec.feature_spec["num_0"]["dtype"] = spec.feature_spec["num_1"]["dtype"] = "float32"
    spec.feature_spec["cat_1.bin"]["max_hotness"] = 4      # a list column: 1..4 ids per row
    for chunks in spec.source_spec.values():
        for chunk in chunks:
            chunk["type"] = "parquet"
            chunk["files"] = [chunk["files"][0].replace(".bin", "") + ".parquet"]
    src = str(tmp_path / "pq")
    generate_dataset(spec, src, {"train": 300, "test": 50}, seed=4)
    dst = str(tmp_path / "tfr")
    transcribe_main(["--src_dataset_type", "parquet", "--src_dataset_path", src, "--dst_dataset_path", dst,
                     "--src_batch_size", "64", "--dst_prebatch_size", "100"])
    data = create_input("split_tfrecords", dst, global_batch_size=128)
    assert data.metadata.hotness == [1, 4, 1]
    got = _all(data)
    cols = read_columns(FeatureSpec.from_yaml(f"{src}/feature_spec.yaml"), "train")
    multi = np.concatenate([g[1][1] for g in got])
    assert multi.shape == (300, 4) and (multi[:, 0] >= 0).all()
    np.testing.assert_array_equal(multi, cols["cat_1.bin"])   # padded with -1 like recsys_common's reader
    np.testing.assert_array_equal(np.concatenate([g[1][2] for g in got]), cols["cat_2.bin"])
    np.testing.assert_allclose(np.concatenate([g[0] for g in got]),
                               np.stack([cols["num_0"], cols["num_1"]], 1))
    np.testing.assert_array_equal(np.concatenate([g[2] for g in got]), cols["label"].astype(np.float32))


def test_synthetic_round_trip_and_overwrite_rule(tmp_path):
    kw = dict(synthetic_train_batches=3, synthetic_valid_batches=1, synthetic_cardinalities=[40, 9],
              synthetic_hotness=[5, 1], synthetic_num_numerical=3)
    dst = str(tmp_path / "syn")
    argv = ["--src_dataset_type", "synthetic", "--synthetic_dataset_train_batches", "3",
            "--synthetic_dataset_valid_batches", "1", "--synthetic_dataset_cardinalities", "40,9",
            "--synthetic_dataset_hotness", "5,1", "--synthetic_dataset_num_numerical_features", "3",
            "--src_batch_size", "96", "--dst_prebatch_size", "50", "--dst_dataset_path", dst]
    assert transcribe_main(argv)["rows"] == {"train": 288, "test": 96}
    for mapping in ("train", "test"):
        _same(_all(create_input("split_tfrecords", dst, mapping=mapping, global_batch_size=96)),
              _all(create_input("synthetic", None, mapping=mapping, global_batch_size=96, **kw)))
    with pytest.raises(FileExistsError):
        transcribe_main(argv)
    transcribe_main(argv + ["--overwrite", "--max_batches_train", "1", "--train_only"])
    assert len(create_input("split_tfrecords", dst, global_batch_size=96)) == 1
    assert not os.path.exists(os.path.join(dst, "test"))   # the earlier output was replaced, not merged


def test_cli_error_exits_non_zero_naming_the_path(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dlrm_dcnv2.dataloading.transcribe", "--src_dataset_path",
                           str(tmp_path / "missing"), "--dst_dataset_path", str(tmp_path / "out")],
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2   # bad input
    assert f"transcribe.py: error: {tmp_path}/missing/feature_spec.yaml: feature spec not found" in proc.stderr
    assert not os.path.exists(tmp_path / "out")


def test_parse_int_list():
    assert parse_int_list("3x7") == [7, 7, 7] and parse_int_list("1,2x5,9") == [1, 5, 5, 9]


def test_truncated_record_file(converted, tmp_path):
    import shutil
    dst = str(tmp_path / "copy")
    shutil.copytree(converted, dst)
    path = os.path.join(dst, "train", "cat_2", "data_3.tfrecords")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 5)
    create_input("split_tfrecords", dst, global_batch_size=1000, world_size=2, rank=0,
                 input_tables=[(1, True)])   # a rank that does not read cat_2 never opens it
    with pytest.raises(DataError, match=r"train/cat_2/data_3\.tfrecords: record 15 at byte \d+ claims \d+ bytes, "
                                        r"past the end of the file \(truncated\)"):
        create_input("split_tfrecords", dst, global_batch_size=1000)


def test_multi_hot_out_of_range_names_directory_feature_and_row(tmp_path):
    import json
    from dlrm_dcnv2.data.dataloader import DatasetMetadata
    from dlrm_dcnv2.data.split_tfrecords_dataset import SplitWriter, tfrecords_spec
    meta = DatasetMetadata([10], [3], 1, ["cat_0.bin"], ["num_0"])
    spec = tfrecords_spec(meta, ["train"])
    writer = SplitWriter(spec, str(tmp_path), "train", prebatch_size=4)
    ids = np.array([[1, 2, -1], [3, -1, -1], [4, 5, 6], [0, 12, -1], [9, -1, -1]])
    writer.write(np.zeros((5, 1), np.float32), [ids], np.zeros(5, np.float32))
    writer.close()
    spec.base_directory = str(tmp_path)
    spec.to_yaml(str(tmp_path / "feature_spec.yaml"))
    assert json.load(open(tmp_path / "train" / "cat_0" / "length.json"))["num_records"] == 2
    with pytest.raises(DataError, match=r"train/cat_0: categorical feature 'cat_0\.bin' row 3 has id 12 "
                                        r"outside \[0, cardinality=10\)"):
        list(create_input("split_tfrecords", str(tmp_path), global_batch_size=5))


def test_re_prebatch_split_tfrecords(converted, tmp_path):
    dst = str(tmp_path / "re")
    transcribe("split_tfrecords", converted, dst, src_batch_size=1000, dst_prebatch_size=2048, train_only=True)
    assert not os.path.exists(os.path.join(dst, "test"))
    _same(_all(create_input("split_tfrecords", dst, global_batch_size=1500)),
          _all(create_input("split_tfrecords", converted, global_batch_size=1500)))


def test_records_interoperate_with_tensorflow_own_encoding():
    """Our records parse with tf.io.parse_tensor (+ RaggedTensorFromVariant), and records written by TensorFlow's own
    serializer (varint-encoded ragged components) parse with ours (the fallback path)."""
    import tensorflow as tf
    from dlrm_dcnv2.data.split_tfrecords_dataset import parse_rows, serialize_rows
    padded = np.array([[4, 1, -1], [-1, -1, -1], [7, 8, 9]], np.int32)
    splits, ids = np.array([0, 2, 2, 5]), np.array([4, 1, 7, 8, 9], np.int32)
    ours = serialize_rows(padded, ragged=True)
    tf_splits, tf_ids = tf.raw_ops.RaggedTensorFromVariant(
        encoded_ragged=tf.io.parse_tensor(ours, tf.variant), input_ragged_rank=-1, output_ragged_rank=1,
        Tvalues=tf.int32, Tsplits=tf.int64)
    np.testing.assert_array_equal(tf_splits[0].numpy(), splits)
    np.testing.assert_array_equal(tf_ids.numpy(), ids)
    theirs = tf.io.serialize_tensor(tf.RaggedTensor.from_row_splits(ids, splits)._to_variant()).numpy()
    assert theirs != ours
    for payload in (ours, theirs):
        got_splits, got_ids = parse_rows(payload, "int32", ragged=True)
        np.testing.assert_array_equal(got_splits, splits)
        np.testing.assert_array_equal(got_ids, ids)
    dense = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(tf.io.parse_tensor(serialize_rows(dense, False), tf.float32).numpy(), dense)
    np.testing.assert_array_equal(parse_rows(tf.io.serialize_tensor(dense).numpy(), "float32", False), dense)
