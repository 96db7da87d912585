"""``python -m dlrm_dcnv2.predict``: a checkpoint scores a user's split-binary / CSV / parquet rows; the
probabilities equal the recipe's own evaluation path on the same rows; bad rows and flags are clear errors."""
import os

import numpy as np
import pytest

from serving_fixtures import SHAPES, write_checkpoint, write_feature_spec


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict_ckpt")
    return {m: write_checkpoint(root / m, m, seed=11) for m in SHAPES}


def _recipe_probabilities(checkpoint, dataset_dir):
    """Sigmoid of the recipe's Evaluator logits over the test split read by its own tf_raw loader."""
    from dlrm_dcnv2.data import create_input
    from dlrm_dcnv2.model.evaluator import Evaluator
    from dlrm_dcnv2.serving import load_checkpoint_model
    loaded = load_checkpoint_model(checkpoint)
    data = create_input("tf_raw", dataset_dir, mapping="test", global_batch_size=16)
    logits = Evaluator(loaded.model, run_eagerly=True).predict(data)["logits"]
    return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))


@pytest.mark.parametrize("model,fmt,ext", [("dlrm", "split_binary", ".csv"), ("dcnv2", "parquet", ".npy"),
                                           ("dlrm", "csv", ".parquet")])
def test_predict_equals_the_recipe_evaluation(checkpoints, tmp_path, model, fmt, ext):
    from dlrm_dcnv2 import predict
    data = tmp_path / "data"
    write_feature_spec(data, model, rows=50, fmt=fmt)
    out = tmp_path / f"p{ext}"
    result = predict.main(["--checkpoint", os.path.dirname(checkpoints[model]), "--dataset_path", str(data),
                           "--output", str(out), "--batch_size", "16"])
    assert result["rows"] == 50
    if ext == ".csv":
        with open(out) as f:
            assert f.readline() == "probability\n"
        got = np.loadtxt(out, skiprows=1)
    elif ext == ".npy":
        got = np.load(out)
    else:
        import pyarrow.parquet as pq
        got = pq.read_table(out).column("probability").to_numpy()
    expected = _recipe_probabilities(checkpoints[model], str(data))
    assert got.shape == (50,) and np.abs(got - expected).max() < 1e-6
    assert got.std() > 1e-4


def test_bad_rows_and_flags_are_clear_errors(checkpoints, tmp_path):
    from recsys_common.datasets import DatasetError
    from dlrm_dcnv2 import predict
    from dlrm_dcnv2.checkpointing import CheckpointError
    data = tmp_path / "data"
    spec_path = write_feature_spec(data, "dlrm", rows=20, fmt="csv")
    csv = data / "test.csv"
    lines = csv.read_text().splitlines()
    fields = lines[3].split(",")
    fields[5 + 1 + 2] = "10"  # cat_2.bin (after 5 numericals and the label): its table has 10 rows
    lines[3] = ",".join(fields)
    csv.write_text("\n".join(lines) + "\n")
    out = tmp_path / "p.csv"
    argv = ["--checkpoint", checkpoints["dlrm"], "--dataset_path", str(data), "--output", str(out)]
    with pytest.raises(DatasetError, match=r"test.csv: feature 'cat_2.bin' row 3 has value 10 outside "
                                           r"\[0, cardinality=10\)"):
        predict.main(argv)
    assert not out.exists()

    fields[5 + 1 + 2], fields[1] = "1", "nan"  # a NaN numerical instead
    lines[3] = ",".join(fields)
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"test.csv: numerical feature 'num_1' row 3 is nan"):
        predict.main(argv)
    assert not out.exists()

    out.write_text("mine\n")
    with pytest.raises(predict.PredictError, match="exists; pass --overwrite"):
        predict.main(argv)
    assert out.read_text() == "mine\n"

    # a spec describing other data than the model was trained on: named feature and values
    text = open(spec_path).read().replace("cardinality: 25", "cardinality: 26")
    open(spec_path, "w").write(text)
    with pytest.raises(CheckpointError, match=r"feature 'cat_1.bin' \(table 1\) has cardinality 26, the "
                                              r"checkpoint's table has 25 rows"):
        predict.main(argv + ["--overwrite"])
    with pytest.raises(predict.PredictError, match="--mapping 'valid' is not a split"):
        predict.main(argv + ["--overwrite", "--mapping", "valid"])
    assert out.read_text() == "mine\n"
