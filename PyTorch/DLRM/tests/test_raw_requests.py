"""Raw Criteo rows served: the real Criteo sample prepared by the default engine, a briefly trained DLRM deployed as
the CPU repository with its raw ensemble (``deploy.py --raw_features_from``), one real Triton for the module. The
raw test-split lines give the probabilities the framework gives on the preprocessed test rows."""
import os

import numpy as np
import pytest

from conftest import train_args
from recsys_testing import (CRITEO_SAMPLE_TEST_END, CRITEO_SAMPLE_TRAIN_END, criteo_sample_dataset,
                            criteo_sample_raw_test_rows)

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient talks to Triton (requirements.txt)")

TRAIN_END, TEST_END = CRITEO_SAMPLE_TRAIN_END, CRITEO_SAMPLE_TEST_END
# The served ONNX model vs eager PyTorch: float32 rounding only (the test prints the largest difference).
SERVED_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """The 1999 real rows -> the default engine's dataset (frequency limit 3: rare values in every split)."""
    return criteo_sample_dataset(str(tmp_path_factory.mktemp("raw_criteo")))


@pytest.fixture(scope="module")
def served(criteo, tmp_path_factory):
    from deployment import deploy as deployer
    from recsys_common.serving.triton_server import serve_repository
    out = tmp_path_factory.mktemp("raw_dlrm")
    from dlrm.train import main as train
    train(train_args(criteo, out / "log.json", "--max_steps", "24", "--save_checkpoint_path", str(out / "ck")))
    repo = str(out / "repo")
    deployer.deploy(["--onnx", "--deploy_cpu", "--triton-backend", "python", "--triton-max-batch-size", "512",
                     "--save-dir", repo, "--model_checkpoint", str(out / "ck"), "--dataset", criteo,
                     "--check_rows", "0", "--raw_features_from", criteo])
    with serve_repository(repo, ["dlrm-onnx-raw"], startup_timeout_s=180) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            yield client, str(out / "ck")
        finally:
            client.close()


def infer_raw(client, integers, categorical):
    inputs = []
    for name, array in (("raw_integer", integers), ("raw_categorical", categorical)):
        tensor = httpclient.InferInput(name, list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer("dlrm-onnx-raw", inputs).as_numpy("probability")


def test_raw_test_rows_give_the_frameworks_probabilities_on_the_preprocessed_rows(served, criteo):
    from dlrm import serving
    from recsys_common.datasets import read_columns
    from recsys_common.feature_spec import FeatureSpec
    client, checkpoint = served
    got = infer_raw(client, *criteo_sample_raw_test_rows())
    columns = read_columns(FeatureSpec.from_yaml(os.path.join(criteo, "feature_spec.yaml")), "test")
    numerical = np.stack([columns[f"num_{i}"] for i in range(13)], axis=1).astype(np.float32)
    categorical = np.stack([columns[f"cat_{i}.bin"] for i in range(26)], axis=1).astype(np.int64)
    model, _, _ = serving.load_model(checkpoint)
    expected = serving.predict_probabilities(serving.serving_module(model), numerical, categorical)
    assert got.shape == (TEST_END - TRAIN_END, 1) and expected.std() > 1e-4   # a trained model, not a constant
    print(f"raw rows served vs PyTorch on the preprocessed rows: max |diff| "
          f"{np.abs(got.reshape(-1) - expected).max():.2e}")
    np.testing.assert_allclose(got.reshape(-1), expected, rtol=0, atol=SERVED_TOLERANCE)


def test_a_malformed_raw_integer_is_refused_naming_row_and_column(served):
    from tritonclient.utils import InferenceServerException
    integers, categorical = criteo_sample_raw_test_rows()
    integers = integers[:3].copy()
    integers[2, 0] = b"12x"
    with pytest.raises(InferenceServerException, match=r"raw_integer: row 2, column I1: '12x' is not an integer"):
        infer_raw(served[0], integers, categorical[:3])
