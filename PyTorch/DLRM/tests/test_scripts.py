"""Bring-your-own data: gen_csv -> transcode -> train, and the synthetic dataset script."""
import os

import pytest

from conftest import SMALL_MODEL
from dlrm.scripts import gen_csv, prepare_synthetic_dataset, transcode
from dlrm.scripts.main import main

HERE = os.path.dirname(os.path.abspath(__file__))


def test_csv_to_split_binary_to_training(tmp_path):
    gen_csv.main(["--feature_spec_in", os.path.join(HERE, "transcoding", "small_csv.yaml"),
                  "--output", str(tmp_path / "csv"), "--size", "4096"])
    assert (tmp_path / "csv" / "train_data.csv").read_text().count("\n") == 4096
    spec = transcode.main(["--input", str(tmp_path / "csv"), "--output", str(tmp_path / "binary")])
    assert spec.cardinality("cat_1") == 50
    assert sorted(os.listdir(tmp_path / "binary" / "train")) == ["cat_0.bin", "cat_1.bin", "cat_2.bin", "label.bin",
                                                                  "numerical.bin"]
    result = main(["--dataset", str(tmp_path / "binary"), "--batch_size", "256", "--test_batch_size", "256",
                   "--lr", "0.5", "--warmup_steps", "4", "--embedding_type", "multi_table", "--nofp16",
                   "--log_path", str(tmp_path / "log.json"), *SMALL_MODEL])
    assert result["global_step"] == 16 and result["test_samples"] == 409
    assert 0.0 <= result["auc"] <= 1.0


def test_prepare_synthetic_dataset_writes_criteo_layout(tmp_path):
    out = prepare_synthetic_dataset.main(["--synthetic_dataset_dir", str(tmp_path / "syn"),
                                          "--synthetic_dataset_num_entries", "800",
                                          "--synthetic_dataset_table_sizes", "10,300,70000"])
    assert out.cardinality("cat_2.bin") == 70000 and str(out.numpy_dtype("cat_2.bin")) == "int32"
    assert os.path.getsize(tmp_path / "syn" / "train" / "numerical.bin") == 800 * 13 * 2
    assert os.path.getsize(tmp_path / "syn" / "test" / "label.bin") == 100
    with pytest.raises(FileExistsError):
        prepare_synthetic_dataset.main(["--synthetic_dataset_dir", str(tmp_path / "syn")])
