"""The model's parts, pooling and shapes; the deep schedule; the flag table; embedding-size errors."""
import json

import numpy as np
import pytest
import tensorflow as tf

from wide_deep.cli import build_parser, parameter_table
from wide_deep.model.config import ModelConfig, load_embedding_sizes
from wide_deep.model.network import WideDeepModel
from wide_deep.model.schedule import DeepLearningRateSchedule


def tiny_config(combiner="sum", hidden=(8, 4)):
    return ModelConfig(onehot={"a": 10, "b": 5}, multihot={"m": 7}, max_hotness={"m": 3}, numerical=["x", "z"],
                       embedding_dims={"a": 4, "b": 2, "m": 3}, hidden_units=hidden, dropout=0.0, combiner=combiner)


def batch():
    return {"a": tf.constant([1, 9, 0], tf.int32), "b": tf.constant([4, 0, 2], tf.int32),
            "m": tf.constant([[1, 2, -1], [-1, -1, -1], [6, 6, 5]], tf.int32),
            "x": tf.constant([0.5, -1.0, 2.0]), "z": tf.constant([0.0, 1.0, 3.0])}


def test_output_shape_and_parts():
    model = WideDeepModel(tiny_config()).build_from_config()
    logits = model(batch())
    assert logits.shape == (3,) and logits.dtype == tf.float32
    wide_names = {v.name for v in model.wide.trainable_variables}
    deep_names = {v.name for v in model.deep.trainable_variables}
    assert not wide_names & deep_names
    assert len(model.trainable_variables) == len(wide_names) + len(deep_names)
    # wide: one (cardinality, 1) table per categorical, numerical weights, bias; deep: 3 tables + 3 dense layers
    assert sorted(v.shape[0] for v in model.wide.trainable_variables if v.shape.rank == 2 and v.shape[1] == 1) \
        == [2, 5, 7, 10]
    assert len(model.deep.trainable_variables) == 3 + 2 * 3


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_multihot_pooling_ignores_padding(combiner):
    model = WideDeepModel(tiny_config(combiner)).build_from_config()
    table = model.deep.tables["m"].numpy()
    # The deep MLP input is the concatenation [a(4) b(2) m(3) x z]; read it through a probe of the first layer.
    probe = {}
    original = model.deep.hidden[0].call

    def capture(x):
        probe["x"] = x
        return original(x)
    model.deep.hidden[0].call = capture
    model(batch())
    pooled = probe["x"].numpy()[:, 6:9]
    expected = np.stack([table[1] + table[2], np.zeros(3), 2 * table[6] + table[5]])
    if combiner == "mean":
        expected = expected / np.array([[2.0], [1.0], [3.0]])
    np.testing.assert_allclose(pooled, expected, rtol=1e-6)
    # wide part: multi-hot ids summed, padding ignored
    model.wide.tables["m"].assign(tf.reshape(tf.range(7, dtype=tf.float32), [7, 1]))
    for name in ("a", "b"):
        model.wide.tables[name].assign(tf.zeros_like(model.wide.tables[name]))
    np.testing.assert_allclose(model.wide(batch()).numpy(), [1 + 2, 0, 6 + 6 + 5])


def test_amp_loss_scaling_guards_both_parts():
    """Under float16 AMP (``loss_scale``) both optimizers are dynamic LossScaleOptimizers, as NVIDIA's: a step whose
    gradients overflowed (here: an inf input) changes neither part and halves both scales; a good step moves both.
    With only the deep optimizer wrapped, FTRL applied the NaN gradients and the wide part's weights became NaN."""
    from wide_deep.model.optimizers import create_optimizers, make_train_step
    model = WideDeepModel(tiny_config()).build_from_config()
    wide_opt, deep_opt = create_optimizers(model, 0.1, 0.01, loss_scale=True)
    assert all(isinstance(o, tf.keras.mixed_precision.LossScaleOptimizer) for o in (wide_opt, deep_opt))
    step = make_train_step(model, wide_opt, deep_opt, xla=False, loss_scale=True)
    labels = tf.constant([1.0, 0.0, 1.0])
    scales = [float(o.loss_scale) for o in (wide_opt, deep_opt)]
    before = [v.numpy() for v in model.trainable_variables]

    overflow = dict(batch(), x=tf.constant([0.5, np.inf, 2.0]))
    step(overflow, labels, tf.constant(0.01))
    for old, var in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(var.numpy(), old, err_msg=var.name)
    assert [float(o.loss_scale) for o in (wide_opt, deep_opt)] == [s / 2 for s in scales]

    step(batch(), labels, tf.constant(0.01))
    for part in (model.wide, model.deep):
        assert any(not np.array_equal(v.numpy(), old) for v, old in zip(model.trainable_variables, before)
                   if any(v is p for p in part.trainable_variables)), part.name
    assert all(np.isfinite(v.numpy()).all() for v in model.trainable_variables)


@pytest.mark.parametrize("shape", [(4096, 256), (999, 33)])   # the even last dimension's path, and the other
def test_dropout16_drops_at_the_rate_and_scales_the_rest(shape):
    """The mask's drop fraction is the rate within 5 standard errors, kept units are scaled by 1 / (1 - rate'), the
    gradient flows through the kept units only, masks differ from call to call, a seed repeats its stream, and
    inference is the identity."""
    from wide_deep.model.network import Dropout16
    x = tf.ones(shape)
    layer = Dropout16(0.1, seed=3)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
    grad = tape.gradient(y, x).numpy()
    y = y.numpy()
    dropped = y == 0
    n = y.size
    rate = 6554 / 65536
    assert abs(dropped.mean() - rate) < 5 * (rate * (1 - rate) / n) ** 0.5, dropped.mean()
    np.testing.assert_allclose(y[~dropped], 1 / (1 - rate), rtol=1e-6)
    np.testing.assert_array_equal(grad, y)            # d(x * m * scale)/dx = m * scale = y for x = 1
    again = layer(x, training=True).numpy()
    assert 0.05 < ((again == 0) != dropped).mean() < 0.3   # another mask (two independent masks differ in ~18 %)
    np.testing.assert_array_equal(Dropout16(0.1, seed=3)(x, training=True).numpy(), y)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    assert Dropout16(0.0, seed=3)(x, training=True) is x
    with pytest.raises(ValueError, match="dropout rate"):
        Dropout16(1.0, seed=3)


def test_dropout16_layers_and_ranks_draw_independent_masks():
    """Consecutive layer seeds are independent Philox keys (a generator made with from_seed(s) and from_seed(s + 1)
    starts one counter block apart on one key: the second repeats the first's numbers shifted by one block, the
    defect this layout avoids); set_stream(rank) gives each rank its own masks, rank 0's being the
    single-process ones; a generator's state put back repeats the masks exactly."""
    from wide_deep.model.network import Dropout16
    shifted = tf.random.Generator.from_seed(200, alg="philox").uniform_full_int([8], dtype=tf.uint32).numpy()
    nxt = tf.random.Generator.from_seed(201, alg="philox").uniform_full_int([4], dtype=tf.uint32).numpy()
    np.testing.assert_array_equal(shifted[4:], nxt)   # the defect, in TensorFlow's from_seed

    x = tf.ones((512, 256))
    masks = [Dropout16(0.5, seed=200 + i)(x, training=True).numpy() == 0 for i in range(2)]
    # Independent masks at rate 0.5 agree on half the units; 0.5 +- 5 standard errors of 131,072 units.
    assert abs((masks[0] == masks[1]).mean() - 0.5) < 5 * (0.25 / x.shape.num_elements()) ** 0.5
    for flat_shift in (1, 8, 16):   # and not as shifted copies of each other (the defect's signature: 8 units)
        a, b = masks[0].ravel()[flat_shift:], masks[1].ravel()[:-flat_shift]
        assert abs((a == b).mean() - 0.5) < 0.02

    single = Dropout16(0.5, seed=7)(x, training=True).numpy()
    rank0, rank1 = Dropout16(0.5, seed=7), Dropout16(0.5, seed=7)
    rank0.set_stream(0)
    rank1.set_stream(1)
    np.testing.assert_array_equal(rank0(x, training=True).numpy(), single)
    rank1_mask = rank1(x, training=True).numpy() == 0
    assert abs(((single == 0) == rank1_mask).mean() - 0.5) < 0.02

    layer = Dropout16(0.5, seed=9)
    layer(x, training=True)
    state = layer.generator.state.numpy()
    expected = layer(x, training=True).numpy()
    resumed = Dropout16(0.5, seed=9)
    resumed.generator.reset(state)
    np.testing.assert_array_equal(resumed(x, training=True).numpy(), expected)


def test_compiled_rmsprop_equals_keras_rmsprop():
    """The deep optimizer's compiled updates compute Keras' legacy RMSprop (rho 0.5), on dense and sparse
    (embedding) gradients alike (duplicate rows summed; rows of the table not in the batch still decay their ``s``),
    over several steps with a changing learning rate: weights and the ``rms`` slots agree."""
    from wide_deep.model.optimizers import compiled_rmsprop
    rng = np.random.default_rng(0)
    start = {"dense": rng.standard_normal((64, 32)).astype(np.float32),
             "table": rng.standard_normal((50, 8)).astype(np.float32)}
    steps = [(rng.standard_normal((64, 32)).astype(np.float32) * (s + 1),
              rng.standard_normal((3, 8)).astype(np.float32), [s, 7, 7 + s], 0.01 / (s + 1)) for s in range(4)]
    results = []
    for opt in (compiled_rmsprop(0.01, rho=0.5), tf.keras.optimizers.legacy.RMSprop(learning_rate=0.01, rho=0.5)):
        dense, table = tf.Variable(start["dense"]), tf.Variable(start["table"])

        @tf.function
        def apply(g, rows_grad, rows, lr):
            opt.learning_rate.assign(lr)
            opt.apply_gradients([(g, dense), (tf.IndexedSlices(rows_grad, rows, tf.shape(table)), table)])
        for g, rows_grad, rows, lr in steps:   # step 0 has row 7 twice
            apply(tf.constant(g), tf.constant(rows_grad), tf.constant(rows), tf.constant(lr))
        results.append([v.numpy() for v in (dense, table, opt.get_slot(dense, "rms"), opt.get_slot(table, "rms"))])
    assert type(opt).__name__ == "RMSprop" and "Compiled" in type(compiled_rmsprop(0.01, 0.5)).__name__
    for name, ours, keras in zip(["dense", "table", "dense rms", "table rms"], *results):
        np.testing.assert_allclose(ours, keras, rtol=1e-6, atol=1e-7, err_msg=name)
    assert not np.allclose(results[0][0], start["dense"]) and not np.allclose(results[0][1], start["table"])
    assert np.count_nonzero(results[0][3].any(axis=1)) == 8          # rows 0-3 and 7-10: those the batches touched


def test_deep_schedule():
    s = DeepLearningRateSchedule(base_lr=1.0, warmup_epochs=2, num_epochs=6, steps_per_epoch=10)
    assert [s(0), s(9), s(19)] == pytest.approx([0.05, 0.5, 1.0])
    # after warm-up: base/4 until the middle of the remaining epochs (epoch 4 = step 40), then base/8
    assert [s(20), s(39), s(40), s(59)] == [0.25, 0.25, 0.125, 0.125]
    with pytest.raises(ValueError, match="--deep_warmup_epochs"):
        DeepLearningRateSchedule(1.0, 7, 6, 10)


def test_seed_flags_and_defaults():
    args = build_parser().parse_args([])
    expected = {"dataset_path": "/outbrain/data", "fspec_file": "feature_spec.yaml",
                "embedding_sizes_file": "data/outbrain/embedding_sizes.json", "use_checkpoint": False,
                "model_dir": "/outbrain/checkpoints", "results_dir": "/results", "log_filename": "log.json",
                "global_batch_size": 131072, "eval_batch_size": 131072, "num_epochs": 20, "cpu": False,
                "amp": False, "xla": False, "linear_learning_rate": 0.02, "deep_learning_rate": 0.00012,
                "deep_warmup_epochs": 6, "deep_hidden_units": [1024] * 5, "deep_dropout": 0.1, "combiner": "sum",
                "evaluate": False, "benchmark": False, "benchmark_warmup_steps": 500, "benchmark_steps": 1000,
                "affinity": "unique_interleaved"}
    assert {k: getattr(args, k) for k in expected} == expected
    table = parameter_table()
    for action in build_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert f"`{action.option_strings[0]}`" in table


@pytest.mark.parametrize("mode, per_rank", [
    ("unique_interleaved", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("unique_contiguous", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("single_unique", [[0], [1]]),
    ("single", [[0], [0]]),
    ("all", [list(range(8))] * 2),
    ("disabled", [list(range(8))] * 2),
])
def test_affinity_splits_the_cores_between_the_ranks_of_a_node(mode, per_rank):
    from wide_deep.distributed import affinity_cores
    assert [affinity_cores(mode, range(8), rank, 2) for rank in (0, 1)] == per_rank
    assert affinity_cores("unique_interleaved", [3, 1], 2, 4) == [1]      # more ranks than cores: one each


def test_affinity_pins_this_process():
    """--affinity reaches the OS: a child pinned to one core by ``single`` reports exactly that core."""
    import os
    import subprocess
    import sys
    code = ("import os, sys; sys.path[:0] = sys.argv[1:]; from wide_deep.distributed import set_affinity; "
            "print(set_affinity('single', 0, 1), sorted(os.sched_getaffinity(0)))")
    from conftest import RECIPE_DIR, REPO_ROOT
    out = subprocess.run([sys.executable, "-c", code, RECIPE_DIR, os.path.join(REPO_ROOT, "common")],
                         capture_output=True, text=True, check=True).stdout.split("] ")
    first = min(os.sched_getaffinity(0))
    assert out == [f"[{first}", f"[{first}]\n"]


def test_embedding_sizes_errors(tmp_path):
    path = tmp_path / "sizes.json"
    path.write_text(json.dumps({"a": 4}))
    with pytest.raises(ValueError, match=r"sizes.json: no embedding size for feature\(s\) b"):
        load_embedding_sizes(str(path), ["a", "b"])
    assert load_embedding_sizes(str(path), ["a"]) == {"a": 4}
