"""``python benchmarks/train_step.py``: both sides train on the same batches and the JSON result has its fields."""
import json
import math
import os

import numpy as np
import pytest

from conftest import RECIPE_DIR
from recsys_testing import import_script

train_step = import_script(os.path.join(RECIPE_DIR, "benchmarks", "train_step.py"), "train_step")

TINY = ["--global_batch_size", "64", "--benchmark_warmup_steps", "2", "--benchmark_steps", "3", "--num_batches", "2", "--rounds", "2",
        "--cardinality_scale", "0.0005", "--deep_hidden_units", "8", "8"]


def test_benchmark_json_fields(tmp_path):
    main = train_step.main
    out = tmp_path / "bench.json"
    result = main(TINY + ["--output_json", str(out)])
    with open(out) as f:
        written = json.load(f)
    assert written == json.loads(json.dumps(result))
    for key in ("ours_samples_per_s", "keras_samples_per_s", "speedup", "ours_seconds", "keras_seconds"):
        assert math.isfinite(written[key]) and written[key] > 0, key
    # the speedup pairs the two sides of each round (run back to back), then takes the median over rounds
    pairs = [o / k for o, k in zip(written["ours_rounds_samples_per_s"], written["keras_rounds_samples_per_s"])]
    assert written["speedup_rounds"] == pytest.approx(pairs)
    assert written["speedup"] == pytest.approx(float(np.median(pairs)))
    spread = written["speedup_spread"]
    assert spread["min"] <= spread["q1"] <= written["speedup"] <= spread["q3"] <= spread["max"]
    of_medians = written["ours_samples_per_s"] / written["keras_samples_per_s"]
    assert written["speedup_of_medians"] == pytest.approx(of_medians)
    assert len(written["ours_rounds_samples_per_s"]) == len(written["keras_rounds_samples_per_s"]) == 2
    assert written["ours_samples_per_s"] == pytest.approx(float(np.median(written["ours_rounds_samples_per_s"])))
    for side in ("ours", "keras"):   # each round's rate is its 3 steps of 64 over its time; the times add up
        assert sum(3 * 64 / r for r in written[f"{side}_rounds_samples_per_s"]) == \
            pytest.approx(written[f"{side}_seconds"])
    assert (written["global_batch_size"], written["steps"], written["warmup_steps"], written["rounds"]) == (64, 3, 2, 2)
    assert written["device"] == "CPU" and written["cpu_model"] and written["deep_hidden_units"] == [8, 8]


def test_both_sides_are_the_same_model():
    """Same layout -> the same parameter count and the same kind of output for the recipe's and the Keras model."""
    import tensorflow as tf
    build_keras, build_ours = train_step.build_keras, train_step.build_ours
    feature_layout, synthetic_batches = train_step.feature_layout, train_step.synthetic_batches
    layout = feature_layout(0.0005)
    args = (layout, [8, 8], 0.0, "sum", 0.02, 0.001, False, 0)
    ours, _ = build_ours(*args)
    keras = build_keras(*args)
    data = synthetic_batches(layout, 16, 1, seed=0)
    x = {k: tf.constant(v) for k, v in data.items() if k != "label"}
    p = keras(x).numpy().reshape(-1)
    assert p.shape == (16,) and np.all((p > 0) & (p < 1))
    assert ours(x).shape == (16,)
    # The Keras multi-hot tables hold one extra row each (0 pads), times width + 1 (deep + linear).
    extra = sum(layout["embedding_dims"][n] + 1 for n in layout["multihot"])
    assert keras.count_params() == ours.count_params() + extra


def test_bad_output_json_refused_before_work(tmp_path):
    main = train_step.main
    with pytest.raises(FileExistsError, match="--output_json"):
        main(TINY + ["--output_json", str(tmp_path)])
