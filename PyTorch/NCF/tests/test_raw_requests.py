"""Raw MovieLens ids served: real ML-100k ratings (users 1-120) converted by convert.py (which saves the raw id ->
code mappings), a briefly trained NeuMF deployed as the CPU repository with its raw ensemble (``deploy.py
--raw_features_from``), one real Triton for the module. Each user's held-out rating, read from the raw file by its
raw UserID and MovieID, gives the probability the framework gives on the converted test row."""
import os
import sys

import numpy as np
import pandas as pd
import pytest

from recsys_testing import shared_data_path

NCF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(NCF_DIR, "deployment"))

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient talks to Triton (requirements.txt)")

MAX_USER = 120
TOLERANCE = 1e-6   # the served ONNX model vs eager PyTorch: float32 rounding only (the test prints the largest)


@pytest.fixture(scope="module")
def ratings(tmp_path_factory):
    """u.data of users 1..MAX_USER (raw ids as GroupLens wrote them)."""
    raw = pd.read_csv(shared_data_path("movielens", "ml-100k", "u.data"), sep="\t",
                      names=["user", "item", "rating", "timestamp"])
    raw = raw[raw["user"] <= MAX_USER]
    path = tmp_path_factory.mktemp("raw_ncf") / "u.data"
    raw.to_csv(path, sep="\t", header=False, index=False)
    return str(path), raw


@pytest.fixture(scope="module")
def served(ratings, tmp_path_factory):
    import deploy as deployer
    from neumf import train as ncf_train
    from neumf.data import convert
    from recsys_common.serving.triton_server import serve_repository
    root = tmp_path_factory.mktemp("raw_ncf_model")
    data = str(root / "data")
    convert.write_split(convert.convert_ratings(ratings[0], valid_negative=20, seed=1), data)
    ncf_train.main(["--data", data, "-e", "2", "-b", "512", "-f", "8", "--layers", "16", "8", "--seed", "1",
                    "--checkpoint_dir", str(root / "ck"), "--log_path", str(root / "log.json")])
    repo = str(root / "repo")
    result = deployer.main(["--load_checkpoint_path", str(root / "ck" / "model.pth"), "--save-dir", repo,
                            "--onnx", "--deploy_cpu", "--triton-backend", "python", "--triton-max-batch-size", "1024",
                            "--check_rows", "0", "--raw_features_from", data])
    assert result["raw_models"] == ["ncf-onnx-raw"]
    with serve_repository(repo, ["ncf-onnx-raw"], startup_timeout_s=180) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            yield client, data, str(root / "ck" / "model.pth")
        finally:
            client.close()


def held_out_raw_pairs(raw):
    """Each user's held-out (UserID, MovieID), read from the raw ratings by the protocol's rule (latest distinct
    interaction; equal times in file order), users in order of first appearance (their code order)."""
    by_time = raw.iloc[np.argsort(raw["timestamp"].to_numpy(), kind="stable")]
    distinct = by_time.drop_duplicates(["user", "item"], keep="first")
    latest = distinct.groupby("user", sort=False).tail(1).set_index("user")["item"]
    users = pd.unique(raw["user"])
    return users.astype(np.int64), latest.loc[users].to_numpy().astype(np.int64)


def infer(client, users, items):
    inputs = []
    for name, array in (("user", users), ("item", items)):
        tensor = httpclient.InferInput(name, [len(array), 1], "INT64")
        tensor.set_data_from_numpy(np.asarray(array, np.int64).reshape(-1, 1))
        inputs.append(tensor)
    return client.infer("ncf-onnx-raw", inputs).as_numpy("probability").reshape(-1)


def test_raw_held_out_ratings_give_the_frameworks_probabilities_on_the_converted_rows(served, ratings):
    from neumf import serving
    from neumf.recommend import load_model
    from recsys_common.serving import torch_export
    client, data, checkpoint = served
    users, items = held_out_raw_pairs(ratings[1])
    got = infer(client, users, items)
    test = pd.read_parquet(os.path.join(data, "test.parquet"))
    positives = test[test["label"] == 1]          # one per user, users by code
    assert len(positives) == len(users) == MAX_USER
    model, _ = load_model(checkpoint)
    expected = torch_export.predict(serving.serving_module(model),
                                    {"user": positives["user"].to_numpy(np.int64)[:, None],
                                     "item": positives["item"].to_numpy(np.int64)[:, None]})
    assert expected.std() > 1e-3
    print(f"raw ids served vs PyTorch on the codes: max |diff| {np.abs(got - expected).max():.2e}")
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)


def test_an_id_the_training_data_never_had_is_refused_naming_the_row(served, ratings):
    from tritonclient.utils import InferenceServerException
    users, items = held_out_raw_pairs(ratings[1])
    with pytest.raises(InferenceServerException, match=r"input 'user': row 1: user id 999 is not in the training"):
        infer(served[0], np.array([users[0], 999]), items[:2])
