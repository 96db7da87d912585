"""Export parity without a server: eager PyTorch vs TorchScript (script, trace) vs onnxruntime on the same batch.

Tolerance, measured here on the NeuMF below (probabilities in [0, 1]): TorchScript is bit-identical to eager
(0.0); onnxruntime differs by at most ~6e-8 (float32 rounding of its Gemm/Sigmoid kernels). The test allows 1e-6.
"""
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch

NCF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(NCF_DIR, "deployment"))

from neumf import serving as ncf_export  # noqa: E402
from neumf import build_model  # noqa: E402
from recsys_common.serving import torch_export  # noqa: E402

USERS, ITEMS = 60, 80
SAMPLE = ncf_export.example_inputs(USERS, ITEMS, rows=4)   # the batch torch.onnx.export / torch.jit.trace run
OUTPUT = [ncf_export.OUTPUT_NAME]


@pytest.fixture(scope="module", params=["neumf", "gmf", "mlp"])
def model(request):
    torch.manual_seed(3)
    net = build_model(request.param, USERS, ITEMS, factors=8, layers=[16, 8], dropout=0.5)
    with torch.no_grad():  # N(0, 1) embeddings instead of N(0, 0.01), so that scores spread over (0, 1)
        for name, p in net.named_parameters():
            if "embedding" in name:
                p.normal_(0.0, 1.0)
    return net.eval()


def test_eager_torchscript_onnx_agree(model, tmp_path):
    batch = ncf_export.example_inputs(USERS, ITEMS, rows=257, seed=5)
    batch["user"][:2, 0], batch["item"][:2, 0] = [0, USERS - 1], [0, ITEMS - 1]  # both ends of each table
    module = ncf_export.serving_module(model)
    with torch.no_grad():
        eager = module(torch.from_numpy(batch["user"]), torch.from_numpy(batch["item"])).numpy()
        logits = model(torch.from_numpy(batch["user"][:, 0]), torch.from_numpy(batch["item"][:, 0])).numpy()
    assert eager.shape == (257, 1) and eager.dtype == np.float32
    np.testing.assert_allclose(eager[:, 0], 1 / (1 + np.exp(-logits.astype(np.float64))), atol=1e-6)
    assert eager.std() > 0.05  # spread out: a constant output would hide a broken export

    results = {}
    for method in ("script", "trace"):
        path = str(tmp_path / f"{method}.pt")
        torch_export.export_torchscript(module, path, method, SAMPLE)
        loaded = torch.jit.load(path)
        with torch.no_grad():
            results[method] = loaded(torch.from_numpy(batch["user"]), torch.from_numpy(batch["item"])).numpy()
    onnx_path = str(tmp_path / "model.onnx")
    torch_export.export_onnx(module, onnx_path, SAMPLE, OUTPUT)
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in session.get_inputs()] == [("user", "tensor(int64)"), ("item", "tensor(int64)")]
    assert [o.name for o in session.get_outputs()] == ["probability"]
    results["onnx"] = session.run(["probability"], batch)[0]
    # a batch size other than the export's (dynamic batch dimension)
    one = session.run(["probability"], {"user": batch["user"][:1], "item": batch["item"][:1]})[0]
    np.testing.assert_allclose(one, eager[:1], atol=1e-6)

    assert np.array_equal(results["script"], eager) and np.array_equal(results["trace"], eager)
    assert np.abs(results["onnx"] - eager).max() <= 1e-6


def test_export_sees_eval_mode_not_dropout(tmp_path):
    """Dropout is active in training mode; the exported model must be the deterministic eval-mode model."""
    torch.manual_seed(0)
    net = build_model("mlp", USERS, ITEMS, factors=8, layers=[16, 8], dropout=0.5)
    net.train()  # as a caller might leave it
    module = ncf_export.serving_module(net)
    batch = ncf_export.example_inputs(USERS, ITEMS, rows=64)
    path = str(tmp_path / "m.onnx")
    torch_export.export_onnx(module, path, SAMPLE, OUTPUT)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    first = session.run(["probability"], batch)[0]
    np.testing.assert_array_equal(first, session.run(["probability"], batch)[0])
    with torch.no_grad():
        eval_out = ncf_export.ServingNCF(net.eval())(torch.from_numpy(batch["user"]),
                                                     torch.from_numpy(batch["item"])).numpy()
    np.testing.assert_allclose(first, eval_out, atol=1e-6)


def test_readme_deployer_flag_table_matches_the_parser():
    """Every row of the README's deployer.py table names a real option with the parser's default, and vice versa."""
    import re

    import deploy as deployer
    with open(os.path.join(NCF_DIR, "README.md")) as f:
        text = f.read()
    table = text.split("<!-- ncf-deployer-flags-start -->")[1].split("<!-- ncf-deployer-flags-end -->")[0]
    documented = dict(re.findall(r"^\| `([^`]+)` \| `([^`]*)` \|", table, flags=re.M))
    actions = {", ".join(a.option_strings): a for a in deployer.build_parser()._actions if a.dest != "help"}
    assert set(documented) == set(actions), set(documented) ^ set(actions)
    for flags, default in documented.items():
        expected = actions[flags].default
        expected = " ".join(map(str, expected)) if isinstance(expected, list) else expected
        assert default == ("" if expected is None else str(expected)), (flags, default, expected)


def test_out_of_range_ids_are_flagged_inside_every_exported_format(model, tmp_path):
    """The range check is in the graphs themselves: onnxruntime, TorchScript (script and trace) and eager, used
    directly (no server), score a row with an id outside the tables NaN; ONNX's Gather would otherwise wrap -1 to
    the last row and a GPU gather would read zeros. Valid rows in the same batch keep their scores."""
    batch = ncf_export.example_inputs(USERS, ITEMS, rows=8, seed=2)
    bad_rows = {1: ("user", USERS), 3: ("item", -1), 5: ("user", -USERS), 6: ("item", ITEMS + 7)}
    for row, (name, value) in bad_rows.items():
        batch[name][row, 0] = value
    good = [r for r in range(8) if r not in bad_rows]
    module = ncf_export.serving_module(model)
    with torch.no_grad():
        clean = model(torch.from_numpy(batch["user"][good, 0]), torch.from_numpy(batch["item"][good, 0]))
        clean = torch.sigmoid(clean).numpy()
    outputs = {}
    with torch.no_grad():
        outputs["eager"] = module(torch.from_numpy(batch["user"]), torch.from_numpy(batch["item"])).numpy()
    for method in ("script", "trace"):
        path = str(tmp_path / f"{method}.pt")
        torch_export.export_torchscript(module, path, method, SAMPLE)
        with torch.no_grad():
            outputs[method] = torch.jit.load(path)(torch.from_numpy(batch["user"]),
                                                   torch.from_numpy(batch["item"])).numpy()
    onnx_path = str(tmp_path / "model.onnx")
    torch_export.export_onnx(module, onnx_path, SAMPLE, OUTPUT)
    outputs["onnxruntime"] = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"]).run(
        ["probability"], batch)[0]
    for name, out in outputs.items():
        assert out.shape == (8, 1), name
        assert np.isnan(out[sorted(bad_rows), 0]).all(), (name, out[:, 0])
        np.testing.assert_allclose(out[good, 0], clean, atol=1e-6, err_msg=name)


def test_latency_requests_without_data_are_valid_ids():
    """``evaluate_latency`` without ``--data`` draws the served model's inputs from its sidecar description: int64
    ``[B, 1]``, every id in range, both ends of each table reached."""
    import evaluate_latency
    batch = evaluate_latency.input_maker(None, USERS, ITEMS)(4000)
    for name, rows in (("user", USERS), ("item", ITEMS)):
        assert batch[name].shape == (4000, 1) and batch[name].dtype == np.int64
        assert (batch[name].min(), batch[name].max()) == (0, rows - 1), name
    with pytest.raises(ValueError, match="give --data, or --n_users and --n_items"):
        evaluate_latency.input_maker(None, USERS, None)
