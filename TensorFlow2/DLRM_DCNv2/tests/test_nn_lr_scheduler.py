"""The learning-rate schedule: boundary steps, TensorFlow vs the pure-python twin, the optimizer integration."""
import numpy as np
import pytest
import tensorflow as tf

from dlrm_dcnv2.model.lr_scheduler import WarmupPolyDecay, learning_rate_at

BASE, WARMUP, START, DECAY = 24.0, 8, 20, 10


@pytest.mark.parametrize("step,expected", [
    (0, 0.0),                          # warmup starts at 0 (NVIDIA: factor 1 - (W - s)/W)
    (1, 24.0 / 8),
    (7, 24.0 * 7 / 8),
    (8, 24.0),                         # first constant step
    (19, 24.0),                        # last constant step
    (20, 24.0),                        # decay starts at factor ((S+D-S)/D)^2 = 1
    (21, 24.0 * 0.9 ** 2),
    (25, 24.0 * 0.5 ** 2),
    (29, 24.0 * 0.1 ** 2),
    (30, 0.0),                         # end of decay
    (31, 0.0),                         # stays 0 (NVIDIA's formula would rise again: (-0.1)^2)
    (10_000, 0.0),
])
def test_boundaries(step, expected):
    schedule = WarmupPolyDecay(BASE, WARMUP, START, DECAY)
    assert learning_rate_at(step, BASE, WARMUP, START, DECAY) == pytest.approx(expected, abs=1e-12)
    assert float(schedule(step)) == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert schedule.learning_rate_at(step) == pytest.approx(expected, abs=1e-12)


def test_tensorflow_equals_python_everywhere_and_edge_configs():
    for config in [(BASE, WARMUP, START, DECAY), (1e-4, 100, 48000, 24000), (2.0, 0, 5, 3), (2.0, 4, 2, 3),
                   (2.0, 3, 10, 0)]:
        schedule = WarmupPolyDecay(*config)
        steps = sorted({0, 1, 2, 3, 4, 5, 9, 10, 11, 99, 100, 101, 47999, 48000, 48001, 71999, 72000, 72001})
        got = tf.function(lambda s: schedule(s), jit_compile=True)(tf.constant(steps, tf.int64)).numpy()
        want = np.array([learning_rate_at(s, *config) for s in steps])
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    no_warmup = WarmupPolyDecay(2.0, 0, 5, 3)
    assert float(no_warmup(0)) == 2.0
    warmup_wins = WarmupPolyDecay(2.0, 4, 2, 3)       # warmup longer than decay start: warmup first, as NVIDIA
    assert float(warmup_wins(3)) == pytest.approx(1.5)
    assert float(warmup_wins(4)) == pytest.approx(2.0 * (1 / 3) ** 2)
    no_decay = WarmupPolyDecay(2.0, 3, 10, 0)
    assert float(no_decay(10 ** 6)) == 2.0
    for bad in [(2.0, -1, 5, 3), (2.0, 1, -5, 3), (2.0, 1, 5, -3), (0.0, 1, 5, 3)]:
        with pytest.raises(ValueError, match="--"):
            WarmupPolyDecay(*bad)


def test_drives_keras_optimizer_by_iterations():
    schedule = WarmupPolyDecay(1.0, 4, 6, 2)
    optimizer = tf.keras.optimizers.legacy.SGD(learning_rate=schedule)
    var = tf.Variable(0.0)
    seen = []
    for _ in range(9):
        before = float(var.numpy())
        optimizer.apply_gradients([(tf.constant(-1.0), var)])
        seen.append(float(var.numpy()) - before)          # = the rate of this step (gradient -1)
    np.testing.assert_allclose(seen, [0, 0.25, 0.5, 0.75, 1, 1, 1, 0.25, 0], atol=1e-6)
    assert WarmupPolyDecay.from_config(schedule.get_config()).get_config() == schedule.get_config()
