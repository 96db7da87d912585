"""Raw-request ensembles on a real Triton (recsys_common.serving.raw_ensemble): raw rows in, the same probabilities
as the served model on the preprocessed rows; bad raw values answered with a clear error.

Tiny ONNX models shaped as the recipes' served models (PyTorch DLRM's ``numerical`` + ``categorical``, TensorFlow2
DLRM/DCNv2's ``numerical`` + one ``cat_<t>`` per feature, NCF's ``user`` + ``item``, a prepare_clicks model),
run by the Python backend; one server for the module.
"""
import json
import os

import numpy as np
import pytest

from recsys_common import prepare_clicks
from recsys_common.criteo import polars_preprocess
from recsys_common.serving.raw_ensemble import add_raw_ensemble, main as raw_ensemble_main
from recsys_common.serving.raw_features import RAW_CATEGORICAL, RAW_INTEGER, RAW_NUMERICAL
from recsys_testing import shared_data_path
from test_raw_features import (AVAZU_CATEGORICAL, AVAZU_NUMERICAL, TEST_END, TRAIN_END, raw_fields, split_rows,
                               write_id_mappings)

pytest.importorskip("onnx", reason="onnx builds the tiny served models (ci/requirements.txt)")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient talks to Triton (ci/requirements.txt)")

NUM_USERS, NUM_ITEMS = 3, 4


def linear_onnx(inputs, gathers, numerical_width=0, seed=0):
    """``sigmoid(numerical @ w + sum of one table row per id input)`` as ONNX: ``inputs`` [(name, elem type, width)],
    ``gathers`` {id input name: table rows}. Returns (model, weights, tables) for the reference computation."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    nodes, initializers, terms = [], [], []
    weights = rng.normal(size=(numerical_width, 1)).astype(np.float32) if numerical_width else None
    if numerical_width:
        initializers.append(numpy_helper.from_array(weights, "w"))
        nodes.append(helper.make_node("MatMul", ["numerical", "w"], ["linear"]))
        terms.append("linear")
    tables = {}
    initializers.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    for name, rows in gathers.items():
        tables[name] = rng.normal(size=(rows, 1)).astype(np.float32)
        initializers.append(numpy_helper.from_array(tables[name], f"table_{name}"))
        nodes.append(helper.make_node("Gather", [f"table_{name}", name], [f"g_{name}"], axis=0))   # [B, k, 1]
        nodes.append(helper.make_node("ReduceSum", [f"g_{name}", "axis1"], [f"s_{name}"], keepdims=0))   # [B, 1]
        terms.append(f"s_{name}")
    total = terms[0]
    for k, term in enumerate(terms[1:]):
        nodes.append(helper.make_node("Add", [total, term], [f"sum_{k}"]))
        total = f"sum_{k}"
    nodes.append(helper.make_node("Sigmoid", [total], ["probability"]))
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(n, t, ["batch", w]) for n, t, w in inputs],
                              [helper.make_tensor_value_info("probability", TensorProto.FLOAT, ["batch", 1])],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, weights, tables


def reference(weights, tables, numerical, ids):
    """The tiny models' probabilities in numpy: ``ids`` {input name: int array [B, k]}."""
    logit = numerical @ weights if weights is not None else 0.0
    for name, table in tables.items():
        logit = logit + table[ids[name]].sum(axis=1)
    return 1.0 / (1.0 + np.exp(-logit))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The Criteo sample prepared by the default engine, three tiny served models with their raw ensembles, one
    Triton serving them all."""
    from onnx import TensorProto
    from recsys_common.serving.model_config import TensorSpec, model_config_text
    from recsys_common.serving.repository import model_repository
    from recsys_common.serving.triton_server import serve_repository
    work = tmp_path_factory.mktemp("raw_ensemble")
    (work / "in").mkdir()
    os.symlink(shared_data_path("criteo", "kaggle-train-head1999.tsv"), work / "in" / "train.txt")
    criteo = str(work / "criteo")
    polars_preprocess.main(["--input_path", str(work / "in"), "--output_path", criteo, "--frequency_limit", "3",
                            "--train_ordering", "input"])
    with open(os.path.join(criteo, "preprocess_report.json"), encoding="utf-8") as f:
        cardinalities = json.load(f)["cardinalities"]
    ids_dir = write_id_mappings(work / "ncf", np.array([10, 30, 20], np.int64), np.array([5, 9, 6, 7], np.int64))
    clicks = str(work / "clicks")
    prepare_clicks.prepare([shared_data_path("avazu", "avazu-train-head999.csv")], clicks, "click",
                           AVAZU_CATEGORICAL, AVAZU_NUMERICAL, frequency_limit=3)
    models = {
        # PyTorch DLRM's served inputs: one categorical tensor (its columns share one table here)
        "dlrm": ([("numerical", TensorProto.FLOAT, 13), ("categorical", TensorProto.INT64, 26)],
                 {"categorical": max(cardinalities)}, 13, criteo),
        # TensorFlow2 DLRM/DCNv2's: one input per categorical feature
        "dcnv2": ([("numerical", TensorProto.FLOAT, 13)] + [(f"cat_{t}", TensorProto.INT64, 1) for t in range(26)],
                  {f"cat_{t}": c for t, c in enumerate(cardinalities)}, 13, criteo),
        "ncf": ([("user", TensorProto.INT64, 1), ("item", TensorProto.INT64, 1)],
                {"user": NUM_USERS, "item": NUM_ITEMS}, 0, ids_dir),
        # a click log of prepare_clicks (Avazu's columns), as PyTorch DLRM serves it
        "clicks": ([("numerical", TensorProto.FLOAT, 2), ("categorical", TensorProto.INT64, 10)],
                   {"categorical": 1000}, 2, clicks),
    }
    repo, references = str(work / "repo"), {}
    import onnx
    with model_repository(repo, tool="tests.raw", backend="python") as writer:
        for seed, (name, (inputs, gathers, width, _)) in enumerate(models.items()):
            model, weights, tables = linear_onnx(inputs, gathers, width, seed)
            specs = [TensorSpec(n, "float32" if t == TensorProto.FLOAT else "int64", [w]) for n, t, w in inputs]
            version_dir = writer.add_model(name, model_config_text(
                name, "onnxruntime_onnx", specs, [TensorSpec("probability", "float32", [1])], 256))
            onnx.save(model, os.path.join(version_dir, "model.onnx"))
            references[name] = (weights, tables)
    add_raw_ensemble(repo, "dlrm", criteo)
    assert raw_ensemble_main(["--repository", repo, "--model", "dcnv2", "--raw_features_from", criteo]) == "dcnv2-raw"
    add_raw_ensemble(repo, "ncf", ids_dir)
    add_raw_ensemble(repo, "clicks", clicks)
    with serve_repository(repo, startup_timeout_s=180) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            yield {"client": client, "criteo": criteo, "clicks": clicks, "references": references}
        finally:
            client.close()


def infer(client, model, arrays):
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else "INT64"
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs, outputs=[httpclient.InferRequestedOutput("probability")]).as_numpy(
        "probability")


def criteo_test_rows():
    with open(shared_data_path("criteo", "kaggle-train-head1999.tsv"), encoding="utf-8") as f:
        lines = f.read().split("\n")[TRAIN_END:TEST_END]
    return raw_fields(lines)


@pytest.mark.parametrize("model", ["dlrm", "dcnv2"])
def test_raw_criteo_test_rows_give_the_probabilities_of_the_preprocessed_rows(served, model):
    integers, categorical = criteo_test_rows()
    got = infer(served["client"], f"{model}-raw", {RAW_INTEGER: integers, RAW_CATEGORICAL: categorical})
    numerical, ids = split_rows(served["criteo"], "test")
    weights, tables = served["references"][model]
    if model == "dlrm":
        expected = reference(weights, tables, numerical, {"categorical": ids})
    else:
        expected = reference(weights, tables, numerical, {f"cat_{t}": ids[:, t:t + 1] for t in range(26)})
    assert got.shape == (TEST_END - TRAIN_END, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_raw_ncf_ids_give_the_probabilities_of_their_codes(served):
    got = infer(served["client"], "ncf-raw", {"user": np.array([[20], [10], [30]], np.int64),
                                              "item": np.array([[7], [5], [9]], np.int64)})
    weights, tables = served["references"]["ncf"]
    expected = reference(weights, tables, 0.0, {"user": np.array([[2], [0], [1]]), "item": np.array([[3], [0], [1]])})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_raw_click_log_rows_give_the_probabilities_of_the_rows_prepare_clicks_applies(served, tmp_path):
    import polars as pl
    from recsys_common.datasets import read_columns
    raw_path = shared_data_path("avazu", "avazu-train-head999.csv")
    raw = pl.read_csv(raw_path, infer_schema=False).head(200)
    got = infer(served["client"], "clicks-raw",
                {RAW_CATEGORICAL: np.array([[v.encode() for v in row] for row in raw.select(AVAZU_CATEGORICAL).rows()],
                                           dtype=object),
                 RAW_NUMERICAL: np.array([[v.encode() for v in row] for row in raw.select(AVAZU_NUMERICAL).rows()],
                                         dtype=object)})
    applied = read_columns(prepare_clicks.apply(served["clicks"], [raw_path], str(tmp_path / "applied")), "test")
    numerical = np.stack([applied[c] for c in AVAZU_NUMERICAL], axis=1).astype(np.float32)[:200]
    ids = np.stack([applied[c] for c in AVAZU_CATEGORICAL], axis=1).astype(np.int64)[:200]
    weights, tables = served["references"]["clicks"]
    np.testing.assert_allclose(got, reference(weights, tables, numerical, {"categorical": ids}), rtol=1e-5, atol=1e-6)


def test_bad_raw_values_are_clear_errors_and_the_server_keeps_serving(served):
    from tritonclient.utils import InferenceServerException
    client = served["client"]
    integers, categorical = criteo_test_rows()
    integers, categorical = integers[:2].copy(), categorical[:2].copy()
    integers[1, 4] = "2.5"
    with pytest.raises(InferenceServerException, match=r"raw_integer: row 1, column I5: '2.5' is not an integer"):
        infer(client, "dlrm-raw", {RAW_INTEGER: integers, RAW_CATEGORICAL: categorical})
    with pytest.raises(InferenceServerException, match=r"input 'user': row 1: user id 99 is not in the training"):
        infer(client, "ncf-raw", {"user": np.array([[20], [99]], np.int64), "item": np.array([[7], [5]], np.int64)})
    with pytest.raises(InferenceServerException, match="raw_categorical"):   # Triton's own shape check
        infer(client, "dlrm-raw", {RAW_INTEGER: integers, RAW_CATEGORICAL: categorical[:, :25]})
    # unseen, empty and over-long strings are values like any other: rare/unseen (1) or missing (0), answered
    categorical[0, :3] = [b"never-seen", b"", b"x" * 1000]
    assert infer(client, "dlrm-raw", {RAW_INTEGER: criteo_test_rows()[0][:2], RAW_CATEGORICAL: categorical}).shape \
        == (2, 1)
