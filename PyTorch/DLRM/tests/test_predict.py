"""dlrm.scripts.predict: a checkpoint scores split-binary, CSV and parquet rows described by a FeatureSpec; equals the
recipe's own evaluation; bad rows, flags and outputs are clear errors and leave nothing written."""
import os

import numpy as np
import pytest

from conftest import TABLE_SIZES, train_args
from test_serving_export import checkpoint  # noqa: F401  (module-scoped fixture: a briefly trained checkpoint)

NUMERICAL = [f"num_{i}" for i in range(13)]
CATEGORICAL = [f"cat_{i}.bin" for i in range(len(TABLE_SIZES))]


def _user_dataset(directory, kind, columns, check_values=True):
    """A FeatureSpec dataset of one mapping ``score`` in one ``kind`` (csv / parquet) file, without labels."""
    from recsys_common.datasets import DatasetWriter
    from recsys_common.feature_spec import FeatureSpec
    spec = FeatureSpec.get_default_feature_spec(13, TABLE_SIZES, mappings=("score",), base_directory=str(directory))
    for name in NUMERICAL:
        spec.feature_spec[name]["dtype"] = "float32"
    spec.channel_spec["label"] = []
    spec.source_spec["score"] = [{"type": kind, "features": NUMERICAL + CATEGORICAL, "files": [f"rows.{kind}"]}]
    os.makedirs(directory, exist_ok=True)
    with DatasetWriter(spec, "score", check_values=check_values) as writer:
        writer.write(columns)
    spec.to_yaml(os.path.join(directory, "feature_spec.yaml"))
    return str(directory)


def _test_columns(dataset, rows=300):
    from recsys_common.datasets import read_columns
    from recsys_common.feature_spec import FeatureSpec
    spec = FeatureSpec.from_yaml(os.path.join(dataset, "feature_spec.yaml"))
    columns = read_columns(spec, "test", NUMERICAL + CATEGORICAL)
    return {k: np.asarray(v[:rows], np.float32 if k in NUMERICAL else np.int64) for k, v in columns.items()}


def test_predict_equals_the_recipes_evaluation(checkpoint, small_dataset, tmp_path):
    from dlrm.scripts import predict
    from dlrm.train import main as train_main
    out = tmp_path / "p.csv"
    summary = predict.main(["--load_checkpoint_path", checkpoint, "--dataset", small_dataset, "--output", str(out),
                            "--batch_size", "500"])
    assert summary["rows"] == 2048
    lines = out.read_text().splitlines()
    assert lines[0] == "probability" and len(lines) == 2049
    probabilities = np.array(lines[1:], dtype=np.float64)
    assert ((probabilities > 0) & (probabilities < 1)).all() and probabilities.std() > 1e-3
    evaluation = train_main(train_args(small_dataset, tmp_path / "log.json", "--mode", "test",
                                       "--load_checkpoint_path", checkpoint))
    assert summary["auc"] == pytest.approx(evaluation["auc"], abs=1e-6)


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_predict_csv_and_parquet_equal_split_binary(checkpoint, small_dataset, tmp_path, kind):
    from dlrm.scripts import predict
    columns = _test_columns(small_dataset)
    user = _user_dataset(tmp_path / kind, kind, columns)
    predict.main(["--load_checkpoint_path", checkpoint, "--dataset", user, "--mapping", "score",
                  "--output", str(tmp_path / "u.npy")])
    predict.main(["--load_checkpoint_path", checkpoint, "--dataset", small_dataset, "--output",
                  str(tmp_path / "b.npy")])
    got, expected = np.load(tmp_path / "u.npy"), np.load(tmp_path / "b.npy")[:300]
    assert got.shape == (300,)
    # split-binary stores numericals as float16; the CSV / parquet copies hold the same (float16-exact) values
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_predict_bad_rows_name_feature_and_row(checkpoint, small_dataset, tmp_path):
    from dlrm.scripts import predict
    columns = _test_columns(small_dataset, rows=50)
    columns["cat_2.bin"][37] = 200  # table 2 has 200 rows
    user = _user_dataset(tmp_path / "ids", "csv", columns, check_values=False)
    out = tmp_path / "p.csv"
    with pytest.raises(ValueError, match=r"cat_2.bin'? row 37 has (value|id) 200 outside \[0"):
        predict.main(["--load_checkpoint_path", checkpoint, "--dataset", user, "--mapping", "score",
                      "--output", str(out)])
    columns = _test_columns(small_dataset, rows=50)
    columns["num_4"][11] = np.nan
    user = _user_dataset(tmp_path / "nan", "parquet", columns)
    with pytest.raises(predict.PredictError, match=r"'num_4' row 11 is nan"):
        predict.main(["--load_checkpoint_path", checkpoint, "--dataset", user, "--mapping", "score",
                      "--output", str(out)])
    assert sorted(os.listdir(tmp_path)) == ["ids", "nan"]  # no output, no temporary file
    csv = os.path.join(user, "..", "ids", "rows.csv")
    lines = open(csv).read().splitlines()
    fields = lines[5].split(",")
    fields[15] = "x7"  # cat_2.bin, after 13 numericals
    lines[5] = ",".join(fields)
    open(csv, "w").write("\n".join(lines) + "\n")
    with pytest.raises(predict.PredictError, match=r"rows.csv: feature 'cat_2.bin' row 5 has value 'x7'"):
        predict.main(["--load_checkpoint_path", checkpoint, "--dataset", str(tmp_path / "ids"), "--mapping", "score",
                      "--output", str(out)])
    out.write_text("keep")
    with pytest.raises(predict.PredictError, match="exists; pass --overwrite"):
        predict.main(["--load_checkpoint_path", checkpoint, "--dataset", small_dataset, "--output", str(out)])
    assert out.read_text() == "keep"
    with pytest.raises(predict.PredictError, match="no mapping 'valid'"):
        predict.main(["--load_checkpoint_path", checkpoint, "--dataset", small_dataset, "--mapping", "valid",
                      "--output", str(tmp_path / "q.csv")])


def test_predict_cli_exits_nonzero_with_the_error(checkpoint, tmp_path):
    import subprocess
    import sys
    from conftest import RECIPE_DIR, subprocess_env
    proc = subprocess.run([sys.executable, "-m", "dlrm.scripts.predict", "--load_checkpoint_path", checkpoint,
                           "--dataset", str(tmp_path / "none"), "--output", str(tmp_path / "p.csv")],
                          cwd=RECIPE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2   # bad input (recsys_common.cli)
    assert "feature spec file not found" in proc.stderr and not (tmp_path / "p.csv").exists()
