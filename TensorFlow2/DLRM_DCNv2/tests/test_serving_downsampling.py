"""Serving a model trained on negatively down-sampled data: deploy.py's SavedModel, ONNX and ensemble (dense part)
return the full data's probability ``sigmoid(logit + log w)`` (w from --negative_downsampling_rate or the dataset's
feature spec), record w in recsys_serving.json, and with w = 1 export the graph without the correction."""
import json
import math
import os

import numpy as np
import pytest
import yaml

from serving_fixtures import write_checkpoint, write_feature_spec

TOLERANCE = 1e-6   # as tests/test_serving_export.py (measured below 2e-7)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("downsampled_ckpt") / "dlrm", "dlrm")


def _logits(loaded, inputs):
    """The Keras model's float64 logits ``[b]`` for serving ``inputs``, without any correction."""
    import tensorflow as tf
    from dlrm_dcnv2 import serving
    ids = serving.model_ids([tf.constant(inputs[serving.categorical_input(t)]) for t in range(len(loaded.hotness))],
                            loaded.hotness)
    logits = loaded.model((tf.constant(inputs[serving.NUMERICAL]), ids), training=False)
    return np.asarray(logits, np.float64).reshape(-1)


def _deploy(checkpoint, repo, *extra):
    from deployment import deploy
    return deploy.main(["--checkpoint-dir", checkpoint, "--model-repository-path", str(repo), "--cpu", *extra])


def _onnx(path, inputs):
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: inputs[i.name] for i in session.get_inputs()})[0]


def test_flag_rate_corrects_savedmodel_onnx_and_the_ensembles_dense_part(checkpoint, tmp_path):
    import tensorflow as tf
    from dlrm_dcnv2 import serving
    result = _deploy(checkpoint, tmp_path / "w025", "--layout", "both", "--negative_downsampling_rate", "0.25")
    assert result["negative_downsampling_rate"] == 0.25
    loaded = serving.load_checkpoint_model(checkpoint)
    batch = serving.random_inputs(loaded, 64, seed=4)
    logits = _logits(loaded, batch)
    expected = 1.0 / (1.0 + np.exp(-(logits + math.log(0.25))))
    assert np.abs(expected - 1.0 / (1.0 + np.exp(-logits))).max() > 1e-3   # the correction is visible
    repo = tmp_path / "w025"
    onnx_out = _onnx(repo / "dlrm-onnx" / "1" / "model.onnx", batch).reshape(-1)
    signature = tf.saved_model.load(str(repo / "dlrm-savedmodel" / "1" / "model.savedmodel")).signatures[
        "serving_default"]
    saved = signature(**{k: tf.constant(v) for k, v in batch.items()})["probability"].numpy().reshape(-1)
    sparse = tf.saved_model.load(str(repo / "dlrm-sparse" / "1" / "model.savedmodel")).signatures["serving_default"]
    embeddings = sparse(**{k: tf.constant(v) for k, v in batch.items() if k.startswith("cat_")})["embeddings"]
    chained = _onnx(repo / "dlrm-dense" / "1" / "model.onnx",
                    {"numerical": batch["numerical"], "embeddings": embeddings.numpy()}).reshape(-1)
    for name, got in (("onnx", onnx_out), ("savedmodel", saved), ("ensemble", chained)):
        assert np.abs(got - expected).max() <= TOLERANCE, name
    for model in ("dlrm-onnx", "dlrm-savedmodel", "dlrm-dense", "dlrm"):
        with open(repo / model / "recsys_serving.json") as f:
            assert json.load(f)["negative_downsampling_rate"] == 0.25, model


def test_rate_one_adds_no_op(checkpoint, tmp_path):
    import onnx
    graphs = {}
    for name, extra in (("default", []), ("w1", ["--negative_downsampling_rate", "1"]),
                        ("w025", ["--negative_downsampling_rate", "0.25"])):
        result = _deploy(checkpoint, tmp_path / name, "--formats", "onnx", *extra)
        assert result["negative_downsampling_rate"] == (0.25 if name == "w025" else 1.0)
        graphs[name] = onnx.load(str(tmp_path / name / "dlrm-onnx" / "1" / "model.onnx")).graph
    ops = {name: sorted(n.op_type for n in g.node) for name, g in graphs.items()}
    assert ops["default"] == ops["w1"]
    assert sorted(ops["w1"] + ["Add"]) == ops["w025"]   # the one Add of log w


def test_rate_defaults_to_the_feature_specs_and_the_flag_overrides_it(checkpoint, tmp_path):
    spec_path = write_feature_spec(tmp_path / "data", "dlrm")
    with open(spec_path) as f:
        spec = yaml.safe_load(f)
    spec["metadata"] = dict(spec.get("metadata") or {}, negative_downsampling_rate=0.25)
    with open(spec_path, "w") as f:
        yaml.safe_dump(spec, f)
    data = ["--formats", "onnx", "--dataset_path", str(tmp_path / "data")]
    assert _deploy(checkpoint, tmp_path / "recorded", *data)["negative_downsampling_rate"] == 0.25
    assert _deploy(checkpoint, tmp_path / "flag", *data,
                   "--negative_downsampling_rate", "1.0")["negative_downsampling_rate"] == 1.0


@pytest.mark.parametrize("rate", ["0", "1.5", "nan"])
def test_bad_rate_is_an_error_naming_the_flag(checkpoint, tmp_path, capsys, rate):
    from deployment import deploy
    assert deploy.cli(["--checkpoint-dir", checkpoint, "--model-repository-path", str(tmp_path / "repo"),
                       "--negative_downsampling_rate", rate]) != 0
    assert "--negative_downsampling_rate must lie in (0, 1]" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "repo")


def test_evaluate_accuracy_corrects_the_recipes_side_as_the_served_model(checkpoint, tmp_path, monkeypatch):
    """The served side is the deployed ONNX model run by onnxruntime in this process (what the CPU repository's
    model.py runs; the server round trip is tests/test_serving.py's): recipe and served agree on the corrected
    probabilities."""
    from deployment import evaluate_accuracy
    spec_path = write_feature_spec(tmp_path / "data", "dlrm", rows=200)
    with open(spec_path) as f:
        spec = yaml.safe_load(f)
    spec["metadata"] = dict(spec.get("metadata") or {}, negative_downsampling_rate=0.25)
    with open(spec_path, "w") as f:
        yaml.safe_dump(spec, f)
    data = str(tmp_path / "data")
    assert _deploy(checkpoint, tmp_path / "repo", "--formats", "onnx",
                   "--dataset_path", data)["negative_downsampling_rate"] == 0.25
    model_file = tmp_path / "repo" / "dlrm-onnx" / "1" / "model.onnx"

    def served(url, protocol, model, requests, timeout_s):
        return np.concatenate([_onnx(model_file, r).reshape(-1) for r in requests])
    monkeypatch.setattr(evaluate_accuracy, "served_probabilities", served)
    argv = ["--dataset_path", data, "--checkpoint", checkpoint, "--model_name", "dlrm-onnx", "--protocols", "grpc",
            "--batch_size", "64", "--tolerance", "1e-6"]
    report = evaluate_accuracy.main(argv)
    assert report["negative_downsampling_rate"] == 0.25 and report["passed"]
    entry = report["served"]["grpc"]
    assert entry["max_abs_probability_difference"] <= TOLERANCE
    for key in ("log_loss", "normalized_entropy", "calibration"):
        assert abs(entry[f"{key}_difference"]) <= 1e-5, key
    uncorrected = report["recipe_uncorrected"]   # the down-sampled model's own figures, and their corrected forms
    assert abs(uncorrected["calibration_corrected"] - report["recipe"]["calibration"]) <= 1e-9
    assert abs(uncorrected["calibration"] - report["recipe"]["calibration"]) > 1e-3
    # against an uncorrected served model (--negative_downsampling_rate 1): the recipe's side is uncorrected too
    plain = evaluate_accuracy.main(argv + ["--negative_downsampling_rate", "1"])
    assert "recipe_uncorrected" not in plain
    assert abs(plain["recipe"]["calibration"] - uncorrected["calibration"]) <= 1e-9
