"""The inference benchmark's arithmetic: warm-up steps dropped, percentiles ordered, throughput = batch / mean."""
import time

import numpy as np
import pytest
import tensorflow as tf

from dlrm_dcnv2.distributed.hvd_utils import Context
from dlrm_dcnv2.model.inference import benchmark_inference, latency_summary


def test_latency_summary():
    latencies = [0.001 * (i + 1) for i in range(100)]  # 1..100 ms
    r = latency_summary(latencies, 512)
    assert r["latency_mean_ms"] == pytest.approx(50.5)
    assert r["latency_p90_ms"] == pytest.approx(np.percentile(np.arange(1, 101), 90))
    assert r["latency_p90_ms"] < r["latency_p95_ms"] < r["latency_p99_ms"] < 100.0
    assert r["throughput"] == pytest.approx(512 / 0.0505)
    with pytest.raises(ValueError, match="--inference_steps"):
        latency_summary([], 512)


class _SlowStart:
    """A 'model' whose first ``slow`` calls take 50 ms (tracing/compilation stand-in), the rest nothing."""

    def __init__(self, slow):
        self.calls, self.slow = 0, slow

    def __call__(self, inputs, training=None):
        self.calls += 1
        if self.calls <= self.slow:
            time.sleep(0.05)
        numerical, _ = inputs
        return tf.zeros([tf.shape(numerical)[0], 1])


def _batches(size):
    return [(tf.zeros([size, 3]), (tf.zeros([size], tf.int32),), tf.zeros([size])) for _ in range(5)]


def test_warmup_steps_are_dropped():
    model = _SlowStart(slow=4)
    r = benchmark_inference(model, _batches, [8], Context(), steps=30, warmup_steps=4, run_eagerly=True)["8"]
    assert model.calls == 34 and r["steps"] == 30
    assert r["latency_p99_ms"] < 40.0  # none of the four 50 ms steps was timed


def test_without_warmup_the_slow_steps_show_in_the_tail():
    model = _SlowStart(slow=4)
    r = benchmark_inference(model, _batches, [8], Context(), steps=30, warmup_steps=0, run_eagerly=True)["8"]
    assert r["latency_p99_ms"] >= 45.0


def test_global_batch_counts_every_rank():
    # open_batches(global size) gives this rank its slice: 32 rows over 4 ranks -> 8 rows here.
    r = benchmark_inference(_SlowStart(0), lambda size: _batches(size // 4), [32], Context(rank=0, world_size=4),
                            steps=5, warmup_steps=0, run_eagerly=True)["32"]
    assert r["batch_size"] == 32
