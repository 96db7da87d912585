"""benchmarks/throughput.py at a tiny shape: JSON fields, both sides trained on the same data and the same number of
samples."""
import json

import numpy as np
import pytest

import throughput


def test_tiny_benchmark_json(tmp_path):
    out = tmp_path / "bench.json"
    result = throughput.main(["--shapes", "tiny", "--models", "dlrm,dcnv2", "--in_process", "--repeats", "1",
                             "--train_steps", "3", "--warmup_steps", "2", "--inference_steps", "2",
                             "--distinct_batches", "3", "--output_json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["machine"]["cpu_model"] and result["precision"] == "float32"
    assert [(e["model"], e["shape"]) for e in result["results"]] == [("dlrm", "tiny"), ("dcnv2", "tiny")]
    for entry in result["results"]:
        ours, plain = entry["runs"]["ours"][0], entry["runs"]["plain_keras"][0]
        # Steps are read back from the optimizers' iteration counters, not assumed.
        assert ours["train_steps"] == plain["train_steps"] == 3
        assert ours["train_samples"] == plain["train_samples"] == 3 * 64
        assert ours["inference_samples"] == plain["inference_samples"] == 2 * 64
        assert ours["data_fingerprint"] == plain["data_fingerprint"]
        for record in (ours, plain):
            assert np.isfinite(record["final_train_loss"])
        assert set(entry["ratio_ours_over_plain"]) == {"train_samples_per_s", "inference_samples_per_s"}
        assert "Cross" in entry["plain_keras_layers"]
    assert result["results"][0]["runs"]["plain_keras"][0]["plain_keras_optimizer"].endswith("SGD")
    assert result["results"][1]["runs"]["plain_keras"][0]["plain_keras_optimizer"].endswith("Adam")


def test_same_batches_and_fingerprint_depends_on_data():
    shape = throughput.SHAPES["tiny"]
    a = throughput.make_batches(shape, 2, seed=1)
    b = throughput.make_batches(shape, 2, seed=1)
    assert throughput.fingerprint(a, 5) == throughput.fingerprint(b, 5)
    assert throughput.fingerprint(a, 5) != throughput.fingerprint(throughput.make_batches(shape, 2, seed=2), 5)
    assert throughput.fingerprint(a, 5) != throughput.fingerprint(a, 4)
    cats = a[0]["categorical"]
    assert cats.shape == (4, 64) and cats.dtype == np.int32
    assert all(0 <= cats[t].min() and cats[t].max() < n for t, n in enumerate(shape["table_sizes"]))


def test_plain_keras_model_matches_our_shapes():
    model, _ = throughput.build_plain_keras_model("dlrm", throughput.SHAPES["tiny"])
    embeddings = [layer for layer in model.layers if layer.__class__.__name__ == "Embedding"]
    assert [layer.input_dim for layer in embeddings] == throughput.SHAPES["tiny"]["table_sizes"]
    assert model.output_shape == (None, 1)


def test_bad_arguments(tmp_path):
    with pytest.raises(throughput.InputError, match="--models"):
        throughput.main(["--models", "wide_deep", "--in_process"])
    not_json = tmp_path / "notes.txt"
    not_json.write_text("mine")
    with pytest.raises(FileExistsError, match="--output_json"):
        throughput.main(["--shapes", "tiny", "--in_process", "--output_json", str(not_json)])
    assert not_json.read_text() == "mine"
