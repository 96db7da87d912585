"""``--mode inference``: forward-pass throughput and latency per batch size (NVIDIA's inference benchmark).

``benchmark_inference(model, open_batches, batch_sizes, ctx, steps, warmup_steps, xla) -> {str(batch): {...}}``
with, per global batch size: ``throughput`` (samples/s = rows of one global batch / mean latency),
``latency_mean_ms``, ``latency_p90_ms``, ``latency_p95_ms``, ``latency_p99_ms``, ``steps`` (timed steps) and
``latencies_ms`` (every timed step, so the figures can be checked).

The first ``warmup_steps`` steps are run and dropped, as NVIDIA drops its first 10 (tracing, XLA compilation,
allocator and cache warm-up would otherwise dominate the tail percentiles). A few batches of the test split are read
before timing and cycled, so the latencies are the model's, not the disk's. Each step's result is fetched to the
host before the clock stops (on a GPU a dispatch returns before the work is done). With several ranks every rank
runs its share of each global batch; the figures are rank 0's view of the collective step.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Dict, Iterable, Optional, Sequence

import numpy as np
import tensorflow as tf

from dlrm_dcnv2.distributed import hvd_utils

PRELOADED_BATCHES = 4


def latency_summary(latencies_s: Sequence[float], global_batch: int) -> Dict[str, Any]:
    """Throughput and mean/p90/p95/p99 latency (milliseconds) of per-step latencies in seconds."""
    lat = np.asarray(latencies_s, np.float64) * 1000.0
    if lat.size == 0:
        raise ValueError("no timed inference steps (--inference_steps must be at least 1)")
    mean = float(lat.mean())
    return {"throughput": global_batch / (mean / 1000.0) if mean > 0 else float("inf"),
            "latency_mean_ms": mean, "latency_p90_ms": float(np.percentile(lat, 90)),
            "latency_p95_ms": float(np.percentile(lat, 95)), "latency_p99_ms": float(np.percentile(lat, 99)),
            "steps": int(lat.size), "batch_size": int(global_batch), "latencies_ms": lat.tolist()}


def benchmark_inference(model, open_batches: Callable[[int], Iterable], batch_sizes: Sequence[int],
                        ctx: Optional[hvd_utils.Context] = None, steps: int = 100, warmup_steps: int = 10,
                        xla: bool = False, run_eagerly: bool = False) -> Dict[str, Dict[str, Any]]:
    """See the module docstring. ``open_batches(global_batch_size)`` returns this rank's batches of the test split."""
    ctx = ctx if ctx is not None else hvd_utils.context()
    if steps < 1:
        raise ValueError(f"--inference_steps must be at least 1, got {steps}")

    def forward(numerical, categorical):
        return model((numerical, categorical), training=False)

    predict = forward if run_eagerly else hvd_utils.compile_step(forward, xla)
    results: Dict[str, Dict[str, Any]] = {}
    for size in batch_sizes:
        batches = list(itertools.islice(iter(open_batches(int(size))), PRELOADED_BATCHES))
        if not batches:
            raise ValueError(f"--inference_batch_sizes {size}: the test split has no batch of that size")
        # Keep only full batches when there are any: a short last batch would retrace and skew the figures.
        full = [b for b in batches if int(b[2].shape[0]) == int(batches[0][2].shape[0])]
        rows = int(full[0][2].shape[0]) * ctx.world_size
        latencies = []
        for step in range(warmup_steps + steps):
            numerical, categorical, _ = full[step % len(full)]
            begin = time.perf_counter()
            output = predict(numerical, tuple(categorical))
            _ = output.numpy()  # wait for the result
            if step >= warmup_steps:
                latencies.append(time.perf_counter() - begin)
        results[str(size)] = latency_summary(latencies, rows)
    return results
