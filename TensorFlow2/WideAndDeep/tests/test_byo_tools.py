"""Bring-your-own data with NVIDIA's tool names: gen_csv.py -> transcode.py -> gen_embedding_sizes.py -> main.py."""
import json
import os

import numpy as np
import pandas as pd
import pytest

from conftest import RECIPE_DIR

import gen_csv
import gen_embedding_sizes
import transcode

SPEC = os.path.join(RECIPE_DIR, "tests", "feature_specs", "fspec_csv.yaml")


def test_csv_to_parquet_to_training(tmp_path):
    from wide_deep.train import main
    csv, data, emb = str(tmp_path / "csv"), str(tmp_path / "data"), str(tmp_path / "emb.json")
    gen_csv.main(["--feature_spec_in", SPEC, "--output", csv, "--size", "600", "--seed", "1"])
    raw = pd.read_csv(os.path.join(csv, "train_data.csv"), header=None)
    assert raw.shape == (600, 6)

    spec = transcode.main(["--input", csv, "--output", data, "--chunk_size", "100"])
    test_raw = pd.read_csv(os.path.join(csv, "test_data.csv"), header=None)
    assert spec.cardinality("cat_0") == max(raw[3].max(), test_raw[3].max()) + 1   # 'auto' computed over both
    train = pd.read_parquet(os.path.join(data, "train", "part_0.parquet"))
    np.testing.assert_array_equal(train["cat_2"].to_numpy(), raw[5].to_numpy())

    sizes = gen_embedding_sizes.main(["--feature_spec_in", spec.origin, "--output", emb, "--max_size", "9"])
    assert sizes == {"cat_0": 9, "cat_1": 9, "cat_2": 9}   # 6 * c ** 0.25 >= 9 for c >= 40: capped
    assert json.loads(open(emb).read()) == sizes

    out = tmp_path / "run"
    result = main(["--dataset_path", data, "--embedding_sizes_file", emb, "--cpu", "--global_batch_size", "200",
                   "--eval_batch_size", "60", "--num_epochs", "1", "--deep_warmup_epochs", "0", "--deep_hidden_units",
                   "8", "--model_dir", str(out / "model"), "--results_dir", str(out / "res")])
    # no display ids in this spec: no MAP@12; the click-model figures beside the loss and AUC
    assert set(result) == {"eval_loss", "eval_auc", "eval_normalized_entropy", "eval_calibration"}


def test_embedding_width_rule():
    assert gen_embedding_sizes.embedding_width(1, 256) == 6          # 6 * 1 ** 0.25
    assert gen_embedding_sizes.embedding_width(10000, 256) == 60     # 6 * 10 exactly
    assert gen_embedding_sizes.embedding_width(10001, 256) == 61     # rounded up
    assert gen_embedding_sizes.embedding_width(10 ** 12, 256) == 256  # capped by --max_size


def test_transcode_refuses_a_foreign_non_empty_output(tmp_path):
    csv, data = str(tmp_path / "csv"), tmp_path / "data"
    gen_csv.main(["--feature_spec_in", SPEC, "--output", csv, "--size", "20"])
    data.mkdir()
    (data / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite"):
        transcode.main(["--input", csv, "--output", str(data)])
    transcode.main(["--input", csv, "--output", str(data), "--overwrite"])
    assert (data / "notes.txt").read_text() == "mine" and (data / "feature_spec.yaml").exists()


def test_gen_embedding_sizes_needs_numeric_cardinalities(tmp_path):
    with pytest.raises(ValueError, match="cat_0"):      # the input spec still says 'auto'
        gen_embedding_sizes.main(["--feature_spec_in", SPEC, "--output", str(tmp_path / "e.json")])
    assert not (tmp_path / "e.json").exists()
