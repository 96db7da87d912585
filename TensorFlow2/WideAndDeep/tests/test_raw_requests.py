"""Raw MovieLens ratings served to the Wide & Deep MovieLens model: real ml-100k through the ETL (its fitted workflow
saved in ``workflow/``), a short training run, the CPU repository with the raw ensemble (``movielens-onnx-raw``:
raw ``userId`` / ``movieId`` -> the workflow's ids and the movie's genres -> the model), one real Triton. Raw rows
give Keras' probabilities on the rows the workflow transforms them into, and the raw mapping equals the workflow's
transform on every rating."""
import os

import numpy as np
import pandas as pd
import pytest

from recsys_testing import shared_data_path

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient talks to Triton (requirements.txt)")

PARITY_ATOL = 1e-5   # as test_serving_movielens.py: the served ONNX model vs Keras
ROWS = 300


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    from wide_deep.movielens.etl import run_etl
    from wide_deep.movielens.train import train
    root = tmp_path_factory.mktemp("ml_raw")
    data = str(root / "data")
    run_etl(shared_data_path("movielens", "ml-100k"), data, seed=0, out=lambda s: None)
    train(data, model_dir=str(root / "snapshots"), max_iter=20, batch_size=1024, eval_interval=20, display=20,
          snapshot=20, learning_rate=0.003, seed=0, stdout=False)
    return {"root": root, "data": data, "checkpoint": str(root / "snapshots" / "snapshot_20")}


@pytest.fixture(scope="module")
def served(snapshot):
    from deployment.deploy import main
    from recsys_common.serving.triton_server import serve_repository
    repo = str(snapshot["root"] / "repo")
    assert main(["--model", "movielens", "--checkpoint-dir", snapshot["checkpoint"], "--dataset_path",
                 snapshot["data"], "--model-repository", repo, "--max-batch-size", "1024", "--output-types", "onnx",
                 "--triton-backend", "python", "--raw_features_from", snapshot["data"]]) == 0
    with serve_repository(repo, ["movielens-onnx-raw"], startup_timeout_s=180) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            yield client
        finally:
            client.close()


def raw_ratings():
    return pd.read_csv(shared_data_path("movielens", "ml-100k", "u.data"), sep="\t",
                       names=["userId", "movieId", "rating", "timestamp"])


def workflow_rows(data, ratings, max_hotness):
    """The ETL's own transform of ``ratings`` as the model's inputs (ids int32, genres -1 padded)."""
    from wide_deep.movielens.workflow import load_workflow
    table = load_workflow(os.path.join(data, "workflow")).transform(ratings)
    genres = np.full((len(table), max_hotness), -1, dtype=np.int64)
    for row, values in enumerate(table["genres"]):
        genres[row, :len(values)] = values
    return {"userId": table["userId"].to_numpy(np.int64), "movieId": table["movieId"].to_numpy(np.int64),
            "genres": genres}


def test_the_raw_mapping_is_the_workflows_transform_on_every_rating(snapshot):
    from recsys_common.serving.raw_features import load_raw_mapper
    ratings = raw_ratings()
    mapper = load_raw_mapper(snapshot["data"])
    mapped = mapper.map({"userId": ratings[["userId"]].to_numpy(), "movieId": ratings[["movieId"]].to_numpy()})
    expected = workflow_rows(snapshot["data"], ratings, mapper.max_hotness)
    np.testing.assert_array_equal(mapped["userId"][:, 0], expected["userId"])
    np.testing.assert_array_equal(mapped["movieId"][:, 0], expected["movieId"])
    np.testing.assert_array_equal(mapped["genres"], expected["genres"])
    unseen = mapper.map({"userId": np.array([[10 ** 9]]), "movieId": np.array([[10 ** 9]])})
    assert unseen["userId"].tolist() == [[2]] and (unseen["genres"] == -1).all()   # out of vocabulary, no genres


def test_raw_ratings_give_keras_probabilities_on_the_transformed_rows(snapshot, served):
    import tensorflow as tf
    from wide_deep.serving import load_model
    ratings = raw_ratings().head(ROWS)
    inputs = []
    for name in ("userId", "movieId"):
        tensor = httpclient.InferInput(name, [ROWS, 1], "INT64")
        tensor.set_data_from_numpy(ratings[[name]].to_numpy(np.int64))
        inputs.append(tensor)
    got = served.infer("movielens-onnx-raw", inputs).as_numpy("probability").reshape(-1)
    model, _, _ = load_model("movielens", snapshot["checkpoint"], dataset_path=snapshot["data"],
                             hidden_units=[128, 128])
    rows = workflow_rows(snapshot["data"], ratings, 6)
    keras = tf.sigmoid(model({k: tf.constant(v.astype(np.int32)) for k, v in rows.items()}, training=False))
    keras = keras.numpy().reshape(-1)
    assert keras.std() > 1e-3
    print(f"raw ratings served vs Keras on the workflow's rows: max |diff| {np.abs(got - keras).max():.2e}")
    np.testing.assert_allclose(got, keras, rtol=0, atol=PARITY_ATOL)
