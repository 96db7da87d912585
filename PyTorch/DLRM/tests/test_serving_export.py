"""Export for serving: eager DLRM vs its TorchScript (script, trace) vs ONNX in onnxruntime on the same batch; ids
beyond a table; a checkpoint that does not match the flags."""
import numpy as np
import pytest
import torch

from conftest import train_args
from recsys_common.serving import torch_export

# Measured (2026-11-24, this model and 512 rows): TorchScript equals eager exactly (0.0); onnxruntime differs by at
# most 1.2e-7 in probability (float32 rounding of the reordered MLP sums; 1.8e-7 on the quickstart's model).
ONNX_TOLERANCE = 1e-6
TS_TOLERANCE = 1e-6
OUTPUT = ["probability"]


@pytest.fixture(scope="module")
def checkpoint(small_dataset, tmp_path_factory):
    """A briefly trained checkpoint of the tests' small model (default embedding type: TorchRec where installed)."""
    from dlrm.train import main
    out = tmp_path_factory.mktemp("serving_ckpt")
    main(train_args(small_dataset, out / "log.json", "--max_steps", "32", "--save_checkpoint_path",
                    str(out / "ck")))
    return str(out / "ck")


@pytest.fixture(scope="module")
def loaded(checkpoint):
    from dlrm import serving
    return serving.load_model(checkpoint)


def _sample(config):
    """The example batch that torch.onnx.export / torch.jit.trace run (``recsys_common.serving.torch_export``)."""
    from dlrm import serving
    return serving.example_inputs(config, 4)


def _eager_probabilities(model, inputs):
    with torch.no_grad():
        return torch.sigmoid(model(torch.from_numpy(inputs["numerical"]),
                                   torch.from_numpy(inputs["categorical"]))).numpy()


def test_eager_torchscript_onnx_agree(loaded, tmp_path):
    import onnxruntime as ort
    from dlrm import serving
    model, config, _ = loaded
    inputs = serving.example_inputs(config, 512, seed=5)
    eager = _eager_probabilities(model, inputs)
    assert eager.std() > 1e-3  # a trained model, not a constant: the comparisons below can fail
    module = serving.serving_module(model)
    np.testing.assert_array_equal(serving.predict_probabilities(module, inputs["numerical"], inputs["categorical"]),
                                  eager)
    for method in ("script", "trace"):
        path = str(tmp_path / f"{method}.pt")
        torch_export.export_torchscript(module, path, method, _sample(config))
        got = serving.predict_probabilities(torch.jit.load(path), inputs["numerical"], inputs["categorical"])
        assert np.abs(got - eager).max() <= TS_TOLERANCE, method
    torch_export.export_onnx(module, str(tmp_path / "m.onnx"), _sample(config), OUTPUT)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["numerical", "categorical"]
    got = session.run(["probability"], inputs)[0]
    assert got.shape == (512, 1) and got.dtype == np.float32
    assert np.abs(got.reshape(-1) - eager).max() <= ONNX_TOLERANCE
    one = session.run(["probability"], {k: v[:1] for k, v in inputs.items()})[0]  # dynamic batch dimension
    assert abs(float(one[0, 0]) - float(eager[0])) <= ONNX_TOLERANCE


def test_hash_indices_model_exports_modulo_lookup(tmp_path):
    import onnxruntime as ort
    from dlrm import serving
    from dlrm.model.parallel import ModelConfig
    torch.manual_seed(0)
    config = ModelConfig(3, [7, 5], ["a", "b"], 4, [8, 4], [8, 1], hash_indices=True)
    model = serving.build_eager_model(config)
    inputs = {"numerical": np.ones((3, 3), np.float32), "categorical": np.array([[9, 6], [2, 1], [16, 11]])}
    wrapped = {"numerical": inputs["numerical"], "categorical": inputs["categorical"] % np.array([7, 5])}
    expected = _eager_probabilities(model, wrapped)
    torch_export.export_onnx(serving.serving_module(model), str(tmp_path / "h.onnx"), _sample(config), OUTPUT)
    got = ort.InferenceSession(str(tmp_path / "h.onnx")).run(["probability"], inputs)[0].reshape(-1)
    np.testing.assert_allclose(got, expected, atol=ONNX_TOLERANCE)
    np.testing.assert_allclose(got[0], got[2], atol=ONNX_TOLERANCE)  # 9 % 7 == 16 % 7, 6 % 5 == 11 % 5


def test_exported_models_flag_ids_outside_their_table(loaded, tmp_path):
    """On a real Triton server nothing checks id ranges before the model, ONNX's Gather wraps a negative id to the end
    of the table and a GPU gather reads zeros past it: the check is in the graph. Used directly (no server),
    onnxruntime, TorchScript (script and trace) and the eager module score a row with an id outside its table (at
    or above the table's size, or negative) NaN; the valid rows of the same batch keep their scores."""
    import onnxruntime as ort
    from dlrm import serving
    model, config, _ = loaded
    module = serving.serving_module(model)
    inputs = serving.example_inputs(config, 6, seed=3)
    clean = _eager_probabilities(model, {k: v[[0, 2, 4]] for k, v in inputs.items()})
    inputs["categorical"][1, 3] = config.table_sizes[3]
    inputs["categorical"][3, 0] = -1
    inputs["categorical"][5, 7] = -config.table_sizes[7]
    outputs = {"eager": serving.predict_probabilities(module, inputs["numerical"], inputs["categorical"])}
    torch_export.export_onnx(module, str(tmp_path / "m.onnx"), _sample(config), OUTPUT)
    outputs["onnxruntime"] = ort.InferenceSession(str(tmp_path / "m.onnx")).run(["probability"], inputs)[0]
    for method in ("script", "trace"):
        path = str(tmp_path / f"{method}.pt")
        torch_export.export_torchscript(module, path, method, _sample(config))
        outputs[method] = serving.predict_probabilities(torch.jit.load(path), inputs["numerical"],
                                                        inputs["categorical"])
    for name, out in outputs.items():
        out = np.asarray(out).reshape(-1)
        assert np.isnan(out[[1, 3, 5]]).all(), (name, out)
        np.testing.assert_allclose(out[[0, 2, 4]], clean, atol=ONNX_TOLERANCE, err_msg=name)


def test_checkpoint_flag_mismatch_names_the_layer(checkpoint):
    from dlrm import serving
    with pytest.raises(serving.ModelMismatchError, match=r"bottom MLP layer 1 has 16 units .* gives 8"):
        serving.load_model(checkpoint, bottom_mlp_sizes=[32, 8])
    with pytest.raises(serving.ModelMismatchError, match=r"top MLP has 3 layers"):
        serving.load_model(checkpoint, top_mlp_sizes=[64, 32])
    with pytest.raises(serving.ModelMismatchError, match=r"embedding table 2 \(cat_2.bin\) has 200 rows .* 300"):
        serving.load_model(checkpoint, table_sizes=[1000, 500, 300, 100, 50, 20, 10, 5])
    with pytest.raises(serving.ModelMismatchError, match="--embedding_dim 16, the flags give 32"):
        serving.load_model(checkpoint, embedding_dim=32)
