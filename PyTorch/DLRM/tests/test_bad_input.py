"""Bad input gets a clear error naming the file and the feature, and the command line exits non-zero."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import RECIPE_DIR, subprocess_env, train_args
from dlrm.train import main


@pytest.fixture
def dataset_copy(small_dataset, tmp_path):
    target = tmp_path / "data"
    shutil.copytree(small_dataset, target)
    return target


def run(dataset, tmp_path, *extra):
    return main(train_args(str(dataset), tmp_path / "log.json", "--embedding_type", "multi_table",
                           "--max_steps", "3", *extra))


def test_truncated_binary_file(dataset_copy, tmp_path):
    path = dataset_copy / "train" / "numerical.bin"
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 3)  # records are 13 x float16 = 26 bytes
    with pytest.raises(ValueError, match=r"numerical\.bin.*truncated"):
        run(dataset_copy, tmp_path)


def _set_cardinality(dataset, feature, cardinality):
    spec_path = dataset / "feature_spec.yaml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["feature_spec"][feature]["cardinality"] = cardinality
    spec_path.write_text(yaml.safe_dump(spec))
    return spec["feature_spec"][feature]["dtype"]


def test_categorical_id_above_cardinality_without_hash_indices(dataset_copy, tmp_path):
    _set_cardinality(dataset_copy, "cat_0.bin", 10)  # the files hold ids up to ~1000
    with pytest.raises(ValueError, match=r"train/cat_0\.bin: feature 'cat_0\.bin' row \d+ has id \d+, outside "
                                         r"\[0, cardinality=10\).*pass --hash_indices"):
        run(dataset_copy, tmp_path)


def test_hash_indices_maps_ids_above_cardinality_modulo_the_table(dataset_copy, tmp_path):
    """--hash_indices (the README's advice for out-of-range ids) trains as if the files held id % rows."""
    dtype = _set_cardinality(dataset_copy, "cat_0.bin", 10)
    hashed = run(dataset_copy, tmp_path, "--hash_indices", "--max_steps", "12")
    reduced = tmp_path / "reduced"
    shutil.copytree(dataset_copy, reduced)
    for split in ("train", "test"):
        path = reduced / split / "cat_0.bin"
        ids = np.fromfile(path, dtype=dtype)
        assert ids.max() >= 10  # the case under test: ids the table cannot hold
        (ids % 10).astype(dtype).tofile(path)
    expected = run(reduced, tmp_path, "--max_steps", "12")
    assert hashed["global_step"] == expected["global_step"] == 12
    assert hashed["auc"] == expected["auc"] and hashed["test_loss"] == expected["test_loss"]


def test_negative_categorical_id_is_refused_even_with_hash_indices(dataset_copy, tmp_path):
    dtype = _set_cardinality(dataset_copy, "cat_2.bin", 200)
    path = dataset_copy / "train" / "cat_2.bin"
    ids = np.fromfile(path, dtype=dtype)
    ids[7] = -3
    ids.tofile(path)
    with pytest.raises(ValueError, match=r"train/cat_2\.bin: feature 'cat_2\.bin' row 7 has id -3; ids must be >= 0"):
        run(dataset_copy, tmp_path, "--hash_indices")


def test_max_table_size_needs_hash_indices(dataset_copy, tmp_path):
    with pytest.raises(ValueError, match=r"cat_0\.bin \(1000 rows\).*--hash_indices"):
        run(dataset_copy, tmp_path, "--max_table_size", "100")
    result = run(dataset_copy, tmp_path, "--max_table_size", "100", "--hash_indices")
    assert result["global_step"] == 3


def test_feature_spec_that_does_not_match_the_files(dataset_copy, tmp_path):
    os.remove(dataset_copy / "test" / "cat_2.bin")
    with pytest.raises(ValueError, match=r"test/cat_2\.bin"):
        run(dataset_copy, tmp_path)


def test_row_counts_that_disagree(dataset_copy, tmp_path):
    path = dataset_copy / "train" / "label.bin"
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1)
    with pytest.raises(ValueError, match=r"label\.bin=8191"):
        run(dataset_copy, tmp_path)


def test_nan_numerical_names_file_feature_and_row(dataset_copy, tmp_path):
    path = dataset_copy / "train" / "numerical.bin"
    values = np.fromfile(path, dtype=np.float16).reshape(-1, 13)
    values[5, 3] = np.nan
    values.tofile(path)
    with pytest.raises(ValueError, match=r"numerical\.bin: numerical feature 'num_3' row 5 is nan"):
        run(dataset_copy, tmp_path)


def test_empty_split(dataset_copy, tmp_path):
    for name in os.listdir(dataset_copy / "test"):
        open(dataset_copy / "test" / name, "wb").close()
    with pytest.raises(ValueError, match=r"mapping 'test' is empty.*test/label\.bin"):
        run(dataset_copy, tmp_path)


def test_command_line_exits_non_zero_with_the_message(dataset_copy, tmp_path):
    os.remove(dataset_copy / "train" / "cat_1.bin")
    proc = subprocess.run([sys.executable, "-m", "dlrm.scripts.main",
                           *train_args(str(dataset_copy), tmp_path / "log.json", "--embedding_type", "multi_table")],
                          cwd=RECIPE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2   # bad input (recsys_common.cli); a failed run exits 1
    assert "error:" in proc.stderr and "train/cat_1.bin" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_command_line_reports_an_unwritable_log_path(small_dataset, tmp_path):
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "dlrm.scripts.main",
                           *train_args(small_dataset, blocker / "log.json", "--embedding_type", "multi_table",
                                       "--max_steps", "1")],
                          cwd=RECIPE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "error:" in proc.stderr and "not_a_directory" in proc.stderr
    assert "Traceback" not in proc.stderr
