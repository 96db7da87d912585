"""Serving a model trained on negatively down-sampled data: the deployer's ONNX and TorchScript models return the full
data's probability ``sigmoid(logit + log w)`` (w from --negative_downsampling_rate or the dataset's FeatureSpec), record
w in recsys_serving.json, and with w = 1 export exactly today's graph."""
import math
import os

import numpy as np
import pytest
import torch
import yaml

from test_serving_export import checkpoint  # noqa: F401  (module-scoped fixture)

TOLERANCE = 1e-6   # float32 rounding of the reordered MLP sums (test_serving_export: at most 1.2e-7 measured)


def _deploy(checkpoint, repo, *extra):
    from deployment import deploy as deployer
    return deployer.deploy(["--onnx", "--ts-script", "--save-dir", str(repo), "--model_checkpoint", checkpoint,
                            "--check_rows", "64", *extra])


def _expected(checkpoint, inputs, rate):
    """sigmoid(logit + log rate) of the eager PyTorch model's logits, in float64."""
    from dlrm import serving
    model, _, _ = serving.load_model(checkpoint)
    with torch.no_grad():
        logits = model(torch.from_numpy(inputs["numerical"]), torch.from_numpy(inputs["categorical"]))
    logits = logits.double().numpy().reshape(-1)
    return 1.0 / (1.0 + np.exp(-(logits + math.log(rate))))


def test_flag_rate_corrects_onnx_and_torchscript(checkpoint, tmp_path):
    import onnx
    from dlrm import serving
    from recsys_common.serving import torch_export
    from recsys_common.serving.repository import read_sidecar
    result = _deploy(checkpoint, tmp_path / "w025", "--negative_downsampling_rate", "0.25")
    assert result["negative_downsampling_rate"] == 0.25
    _, config, _ = serving.load_model(checkpoint)
    inputs = serving.example_inputs(config, 512, seed=3)
    expected = _expected(checkpoint, inputs, 0.25)
    uncorrected = _expected(checkpoint, inputs, 1.0)
    assert np.abs(expected - uncorrected).max() > 1e-3   # the correction is visible: the check below can fail
    for model in ("dlrm-onnx", "dlrm-ts"):
        got = torch_export.run_exported(str(tmp_path / "w025" / model), 1, inputs, serving.OUTPUT_NAME).reshape(-1)
        assert np.abs(got - expected).max() <= TOLERANCE, model
        assert read_sidecar(str(tmp_path / "w025" / model))["negative_downsampling_rate"] == 0.25

    # rate 1.0 (explicit, or the default without a dataset): no correction and no extra op in the graph
    plain = _deploy(checkpoint, tmp_path / "w1", "--negative_downsampling_rate", "1")
    assert plain["negative_downsampling_rate"] == 1.0
    default = _deploy(checkpoint, tmp_path / "default")
    assert default["negative_downsampling_rate"] == 1.0
    got = torch_export.run_exported(str(tmp_path / "w1" / "dlrm-onnx"), 1, inputs, serving.OUTPUT_NAME).reshape(-1)
    assert np.abs(got - uncorrected).max() <= TOLERANCE
    graphs = {name: onnx.load(str(tmp_path / name / "dlrm-onnx" / "1" / "model.onnx")).graph
              for name in ("w025", "w1", "default")}
    assert graphs["w1"].SerializeToString() == graphs["default"].SerializeToString()
    ops = {name: sorted(n.op_type for n in g.node if n.op_type != "Constant") for name, g in graphs.items()}
    assert sorted(ops["w1"] + ["Add"]) == ops["w025"]   # the one Add of log w (and its Constant)
    assert read_sidecar(str(tmp_path / "w1" / "dlrm-onnx"))["negative_downsampling_rate"] == 1.0


def _downsampled_spec(dataset):
    """A FeatureSpec beside ``dataset``'s own, recording negative down-sampling rate 0.25; returns its file name."""
    with open(os.path.join(dataset, "feature_spec.yaml")) as f:
        spec = yaml.safe_load(f)
    spec["metadata"] = dict(spec.get("metadata") or {}, negative_downsampling_rate=0.25)
    with open(os.path.join(dataset, "feature_spec_w025.yaml"), "w") as f:
        yaml.safe_dump(spec, f)
    return "feature_spec_w025.yaml"


def test_rate_defaults_to_the_datasets_and_the_flag_overrides_it(checkpoint, small_dataset, tmp_path):
    dataset = ["--dataset", small_dataset, "--feature_spec", _downsampled_spec(small_dataset)]
    assert _deploy(checkpoint, tmp_path / "recorded", *dataset)["negative_downsampling_rate"] == 0.25
    assert _deploy(checkpoint, tmp_path / "flag", *dataset,
                   "--negative_downsampling_rate", "1.0")["negative_downsampling_rate"] == 1.0


@pytest.mark.parametrize("rate", ["0", "1.5", "-0.1", "nan"])
def test_bad_rate_is_an_error_naming_the_flag(checkpoint, tmp_path, capsys, rate):
    from deployment import deploy as deployer
    assert deployer.main(["--onnx", "--save-dir", str(tmp_path / "repo"), "--model_checkpoint", checkpoint,
                          "--negative_downsampling_rate", rate]) == 2
    assert "--negative_downsampling_rate must lie in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


def test_evaluate_accuracy_corrects_pytorchs_side_as_the_served_model(checkpoint, small_dataset, tmp_path,
                                                                     monkeypatch):
    """The served side is the deployed ONNX model run by onnxruntime in this process (what the CPU repository's
    model.py runs; the server round trip is tests/test_serving.py's): PyTorch's side gets the same log w, so the two
    agree."""
    from deployment import evaluate_accuracy
    from recsys_common.serving import client as serving_client
    from recsys_common.serving import torch_export
    spec = _downsampled_spec(small_dataset)
    _deploy(checkpoint, tmp_path / "repo", "--dataset", small_dataset, "--feature_spec", spec)
    model_dir = str(tmp_path / "repo" / "dlrm-onnx")

    class OnnxruntimeClient:
        def __init__(self, url, protocol="grpc", timeout_s=30.0):
            pass

        def wait_until_ready(self, model, timeout_s=60.0):
            pass

        def infer(self, model, inputs, output_names):
            return {name: torch_export.run_exported(model_dir, 1, inputs, name) for name in output_names}

        def close(self):
            pass
    monkeypatch.setattr(serving_client, "InferenceClient", OnnxruntimeClient)
    argv = ["--grpc-url", "local", "--dataset", small_dataset, "--feature_spec", spec, "--model_checkpoint",
            checkpoint, "--batch_size", "1000", "--max_rows", "1500"]
    result = evaluate_accuracy.evaluate({"grpc": "local"}, "dlrm-onnx", small_dataset, checkpoint, spec,
                                        batch_size=1000, max_rows=1500)
    assert result["negative_downsampling_rate"] == 0.25
    assert result["grpc"]["max_abs_probability_difference"] <= TOLERANCE
    for name in ("log_loss", "normalized_entropy", "calibration"):
        assert result["grpc"][f"{name}_difference"] <= 1e-6, name
    uncorrected = result["framework_uncorrected"]   # the down-sampled model's own figures and their corrected forms
    assert uncorrected["calibration_corrected"] == pytest.approx(result["framework"]["calibration"], rel=1e-6)
    assert abs(uncorrected["calibration"] - result["framework"]["calibration"]) > 1e-3
    assert evaluate_accuracy.main(argv) == 0
    # --negative_downsampling_rate 1 (a model deployed uncorrected): PyTorch's side is the uncorrected model
    plain = evaluate_accuracy.evaluate({"grpc": "local"}, "dlrm-onnx", small_dataset, checkpoint, spec,
                                       batch_size=1000, max_rows=1500, negative_downsampling_rate=1.0)
    assert "framework_uncorrected" not in plain
    assert plain["framework"]["calibration"] == pytest.approx(uncorrected["calibration"], rel=1e-6)
    assert evaluate_accuracy.main(argv + ["--negative_downsampling_rate", "1.5"]) == 2
