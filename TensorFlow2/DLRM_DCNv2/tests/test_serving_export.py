"""Export parity without a server: a checkpoint's Keras model vs its SavedModel vs onnxruntime on the same batch, for
DLRM (one-hot) and DCNv2 (multi-hot tables); the sparse -> dense split equals the monolithic model.

Measured 2026-11-24 (TF 2.21 CPU, onnxruntime 1.32): max |difference| of the probabilities 0 (SavedModel) and
below 2e-7 (ONNX); asserted within 1e-6.
"""
import numpy as np
import pytest

from serving_fixtures import SHAPES, write_checkpoint, write_feature_spec

TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving_ckpt")
    return {m: write_checkpoint(root / m, m) for m in SHAPES}


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_keras_savedmodel_onnx_parity(checkpoints, tmp_path, model):
    import onnxruntime as ort
    import tensorflow as tf
    from dlrm_dcnv2 import serving
    loaded = serving.load_checkpoint_model(checkpoints[model])
    assert loaded.hotness == SHAPES[model]["hotness"] and loaded.step == 7
    batch = serving.random_inputs(loaded, 33, seed=1)
    if model == "dcnv2":
        assert (batch["cat_1"] == -1).any() and (batch["cat_1"][:, 0] >= 0).all()  # padded multi-hot rows
    reference = serving.keras_probabilities(loaded, batch)
    assert reference.shape == (33, 1) and reference.std() > 1e-4  # not a constant model

    serving.export_savedmodel(loaded, "monolithic", str(tmp_path / "model.savedmodel"))
    signature = tf.saved_model.load(str(tmp_path / "model.savedmodel")).signatures["serving_default"]
    saved = signature(**{k: tf.constant(v) for k, v in batch.items()})["probability"].numpy()

    serving.export_onnx(loaded, "monolithic", str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in session.get_inputs()) == sorted(batch)
    onnx_out = session.run(["probability"], batch)[0]

    assert np.abs(saved - reference).max() <= TOLERANCE
    assert np.abs(onnx_out - reference).max() <= TOLERANCE


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_sparse_then_dense_equals_monolithic(checkpoints, tmp_path, model):
    import onnxruntime as ort
    from dlrm_dcnv2 import serving
    loaded = serving.load_checkpoint_model(checkpoints[model])
    batch = serving.random_inputs(loaded, 17, seed=2)
    for part in ("sparse", "dense"):
        serving.export_onnx(loaded, part, str(tmp_path / f"{part}.onnx"))
    sparse = ort.InferenceSession(str(tmp_path / "sparse.onnx"), providers=["CPUExecutionProvider"])
    dense = ort.InferenceSession(str(tmp_path / "dense.onnx"), providers=["CPUExecutionProvider"])
    embeddings = sparse.run(["embeddings"], {k: v for k, v in batch.items() if k.startswith("cat_")})[0]
    assert embeddings.shape == (17, sum(SHAPES[model]["embedding_dims"]))
    chained = dense.run(["probability"], {"numerical": batch["numerical"], "embeddings": embeddings})[0]
    assert np.abs(chained - serving.keras_probabilities(loaded, batch)).max() <= TOLERANCE
    # deploy.py's default sparse format: the same lookups as a SavedModel (what an HPS model would replace)
    import tensorflow as tf
    serving.export_savedmodel(loaded, "sparse", str(tmp_path / "sparse.savedmodel"))
    signature = tf.saved_model.load(str(tmp_path / "sparse.savedmodel")).signatures["serving_default"]
    saved = signature(**{k: tf.constant(v) for k, v in batch.items() if k.startswith("cat_")})["embeddings"]
    assert np.abs(saved.numpy() - embeddings).max() <= TOLERANCE


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_ids_outside_a_table_are_flagged_inside_every_exported_graph(checkpoints, tmp_path, model):
    """The id range check is in the exported graphs, used directly (no server): the SavedModel (TF) and ONNX
    (onnxruntime) monolithic models and the sparse part (SavedModel and ONNX) flag a row holding an id at or past
    its table's end, or below its lowest id (0; -1 is multi-hot padding), as NaN; TF's GPU gather would read zeros
    and ONNX's Gather wrap a negative id. The valid rows of the same batch keep their scores."""
    import onnxruntime as ort
    import tensorflow as tf
    from dlrm_dcnv2 import serving
    loaded = serving.load_checkpoint_model(checkpoints[model])
    batch = serving.random_inputs(loaded, 6, seed=4)
    good, bad = [0, 2, 4], [1, 3, 5]
    reference = serving.keras_probabilities(loaded, {k: v[good] for k, v in batch.items()})
    last = len(loaded.table_sizes) - 1
    batch["cat_0"][1, 0] = loaded.table_sizes[0]
    batch[f"cat_{last}"][3, 0] = -1 if loaded.hotness[last] == 1 else -2   # -1 is padding only in multi-hot tables
    batch["cat_0"][5, 0] = -loaded.table_sizes[0]
    categorical = {k: v for k, v in batch.items() if k.startswith("cat_")}
    out = {}
    for part, inputs, name in (("monolithic", batch, "probability"), ("sparse", categorical, "embeddings")):
        serving.export_savedmodel(loaded, part, str(tmp_path / f"{part}.savedmodel"))
        signature = tf.saved_model.load(str(tmp_path / f"{part}.savedmodel")).signatures["serving_default"]
        out[part, "savedmodel"] = signature(**{k: tf.constant(v) for k, v in inputs.items()})[name].numpy()
        serving.export_onnx(loaded, part, str(tmp_path / f"{part}.onnx"))
        out[part, "onnx"] = ort.InferenceSession(str(tmp_path / f"{part}.onnx"),
                                                 providers=["CPUExecutionProvider"]).run([name], inputs)[0]
    for key, value in out.items():
        assert np.isnan(value[bad]).all(axis=1).all(), (key, value)
        assert not np.isnan(value[good]).any(), key
        if key[0] == "monolithic":
            assert np.abs(value[good] - reference).max() <= TOLERANCE, key


def test_feature_spec_that_does_not_fit_the_checkpoint_is_refused(checkpoints, tmp_path):
    from recsys_common.feature_spec import FeatureSpec
    from dlrm_dcnv2 import serving
    from dlrm_dcnv2.checkpointing import CheckpointError
    spec = FeatureSpec.from_yaml(write_feature_spec(tmp_path, "dlrm"))
    assert serving.check_feature_spec(serving.checkpoint_config(checkpoints["dlrm"])[2], spec, "x")[0] == "cat_0.bin"
    spec.feature_spec["cat_2.bin"]["cardinality"] = 11  # the checkpoint's table 2 has 10 rows
    with pytest.raises(CheckpointError, match=r"feature 'cat_2.bin' \(table 2\) has cardinality 11, the "
                                              r"checkpoint's table has 10 rows"):
        serving.load_checkpoint_model(checkpoints["dlrm"], spec)
    with pytest.raises(CheckpointError, match="nothing_here: checkpoint not found"):
        serving.load_checkpoint_model(str(tmp_path / "nothing_here"))


def test_tables_too_large_for_one_onnx_protobuf_are_refused(checkpoints, tmp_path, monkeypatch):
    from dlrm_dcnv2 import serving
    loaded = serving.load_checkpoint_model(checkpoints["dlrm"])
    monkeypatch.setattr(serving, "ONNX_MAX_WEIGHT_BYTES", loaded.table_bytes() - 1)
    with pytest.raises(ValueError, match="an ONNX model is one protobuf of at most 2 GiB: deploy the tables as a "
                                         "TensorFlow SavedModel"):
        serving.export_onnx(loaded, "sparse", str(tmp_path / "sparse.onnx"))
    assert not (tmp_path / "sparse.onnx").exists()
    serving.export_onnx(loaded, "dense", str(tmp_path / "dense.onnx"))  # the dense half holds no table


def test_readme_deployment_flags_exist():
    """Every flag the README's Deployment section names is a flag of one of the tools it runs."""
    import os
    import re
    from deployment import deploy, evaluate_accuracy, evaluate_latency
    from dlrm_dcnv2.cli import build_parser as recipe_parser
    from dlrm_dcnv2 import predict
    from recsys_common.serving import triton_server
    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    section = readme.split("\n## Deployment\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", section))
    known = set()
    for parser in (deploy.build_parser(), evaluate_accuracy.build_parser(), evaluate_latency.build_parser(),
                   predict.build_parser(), triton_server.build_parser(), recipe_parser("dlrm")):
        known |= {s for action in parser._actions for s in action.option_strings}
    assert len(named) > 20 and named - known == set(), named - known


@pytest.mark.parametrize("spelling", ["--server_url", "--server-url", "--grpc-url"])
def test_server_address_flags_take_both_spellings(spelling):
    """The seed spells the address ``--server_url`` in evaluate_accuracy and ``--server-url`` in evaluate_latency:
    both tools take either (``recsys_common.flags``), and the delay flags of deploy hold one unit (microseconds)."""
    from deployment import deploy, evaluate_accuracy, evaluate_latency
    accuracy = evaluate_accuracy.build_parser().parse_args(["--dataset_path", "d", "--checkpoint", "c",
                                                            "--model-name", "m", spelling, "h:1"])
    assert (accuracy.server_url, accuracy.model_name) == ("h:1", "m")
    if spelling != "--grpc-url":
        assert evaluate_latency.build_parser().parse_args([spelling, "h:2", "--model_name", "m"]).server_url == "h:2"
    base = ["--checkpoint-dir", "c", "--model-repository-path", "r"]
    assert deploy.parse_args(base + ["--dynamic-batching-delay-us", "200"]).dynamic_batching_delay_us == 200
    assert deploy.parse_args(base + ["--triton-dyn-batching-delay", "0.2"]).dynamic_batching_delay_us == 200
    assert deploy.parse_args(base).dynamic_batching_delay_us is None
