"""Raw Criteo rows served: the real Criteo sample prepared by the default engine, a DCNv2 of its shape (weights from
a fixed seed, saved as ``dcnv2.py`` saves them) deployed with its raw ensemble (``deploy.py --raw_features_from``),
its models run by Triton's Python backend on one real Triton for the module. The raw test-split lines give Keras'
probabilities on the preprocessed test rows, through the monolithic model and through the sparse/dense ensemble
(the raw ensemble then holds an ensemble)."""
import json
import os

import numpy as np
import pytest

from recsys_testing import (CRITEO_SAMPLE_TEST_END, CRITEO_SAMPLE_TRAIN_END, criteo_sample_dataset,
                            criteo_sample_raw_test_rows)

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient talks to Triton (requirements.txt)")

TRAIN_END, TEST_END = CRITEO_SAMPLE_TRAIN_END, CRITEO_SAMPLE_TEST_END
# The served ONNX model vs eager Keras: float32 rounding only (the test prints the largest difference).
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """The 1999 real rows -> the default engine's dataset (frequency limit 3: rare values in every split)."""
    return criteo_sample_dataset(str(tmp_path_factory.mktemp("raw_criteo")))


def write_checkpoint(root, table_sizes, seed=3):
    """A DCNv2 for the dataset's 26 tables and 13 numericals, saved with the recipe's own ``save_checkpoint``."""
    import tensorflow as tf
    from dlrm_dcnv2.checkpointing import save_checkpoint
    from dlrm_dcnv2.distributed.hvd_utils import Context
    from dlrm_dcnv2.model.model import build_model
    shape = dict(table_sizes=table_sizes, hotness=[1] * 26, embedding_dims=[4] * 26, bottom_mlp_dims=[16, 4],
                 top_mlp_dims=[16, 8, 1], interaction="cross", num_numerical_features=13, num_cross_layers=2,
                 cross_layer_projection_dim=4)
    tf.keras.utils.set_random_seed(seed)
    model = build_model(table_sizes=table_sizes, embedding_dims=shape["embedding_dims"],
                        bottom_mlp_dims=shape["bottom_mlp_dims"], top_mlp_dims=shape["top_mlp_dims"],
                        interaction="cross", num_numerical_features=13, hotness=shape["hotness"],
                        num_cross_layers=2, cross_layer_projection_dim=4, seed=seed)
    return save_checkpoint(str(root), 1, model, None, Context(), dict(shape, model="dcnv2"))


@pytest.fixture(scope="module")
def served(criteo, tmp_path_factory):
    from deployment import deploy
    from recsys_common.serving.triton_server import serve_repository
    out = tmp_path_factory.mktemp("raw_dcnv2")
    with open(os.path.join(criteo, "preprocess_report.json"), encoding="utf-8") as f:
        checkpoint = write_checkpoint(out / "ckpt", json.load(f)["cardinalities"])
    repo = str(out / "repo")
    result = deploy.main(["--checkpoint-dir", os.path.dirname(checkpoint), "--model-repository-path", repo,
                          "--model-name", "dcnv2", "--formats", "onnx", "--cpu", "--dataset_path", criteo,
                          "--layout", "both", "--sparse-format", "onnx", "--dense-format", "onnx",
                          "--max-batch-size", "512", "--triton-backend", "python", "--raw_features_from", criteo])
    # the monolithic model and the sparse/dense ensemble get one each (an ensemble inside an ensemble)
    assert sorted(result["raw_models"]) == ["dcnv2-onnx-raw", "dcnv2-raw"]
    with serve_repository(repo, ["dcnv2-onnx-raw", "dcnv2-raw"], startup_timeout_s=180) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            yield client, checkpoint
        finally:
            client.close()


@pytest.mark.parametrize("model", ["dcnv2-onnx-raw", "dcnv2-raw"])
def test_raw_test_rows_give_keras_probabilities_on_the_preprocessed_rows(served, criteo, model):
    from dlrm_dcnv2.serving import keras_probabilities, load_checkpoint_model
    from recsys_common.datasets import read_columns
    from recsys_common.feature_spec import FeatureSpec
    client, checkpoint = served
    inputs = []
    for name, array in zip(("raw_integer", "raw_categorical"), criteo_sample_raw_test_rows()):
        tensor = httpclient.InferInput(name, list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    got = client.infer(model, inputs).as_numpy("probability")
    columns = read_columns(FeatureSpec.from_yaml(os.path.join(criteo, "feature_spec.yaml")), "test")
    batch = {"numerical": np.stack([columns[f"num_{i}"] for i in range(13)], axis=1).astype(np.float32)}
    batch.update({f"cat_{t}": columns[f"cat_{t}.bin"].astype(np.int64)[:, None] for t in range(26)})
    expected = keras_probabilities(load_checkpoint_model(checkpoint), batch)
    assert got.shape == (TEST_END - TRAIN_END, 1) and expected.std() > 1e-4   # not a constant model
    print(f"{model}: raw rows served vs Keras on the preprocessed rows: max |diff| "
          f"{np.abs(got - expected).max():.2e}")
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)
