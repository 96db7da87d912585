"""Forward passes without training: the evaluation of a model over a test mapping (:func:`evaluate`: exact AUC, loss
and the click metrics, every process scoring its own rows) and ``--mode inference_benchmark``'s timing
(:func:`inference_benchmark`)."""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from dlrm.data import SplitBinaryBatches, SyntheticBatches
from dlrm.utils.amp import Amp
from dlrm.utils.distributed import all_reduce_sum
from dlrm.utils.metrics import ClickMetrics, binary_cross_entropy_sum, distributed_roc_auc_score
from recsys_common.metrics import plot_reliability

# Evaluation keys that are figures (logged, and in the summary with a ``test_`` prefix), next to auc and loss.
CLICK_METRIC_KEYS = ("log_loss", "normalized_entropy", "calibration", "normalized_entropy_corrected",
                     "calibration_corrected")


def evaluate(trainable, data, amp: Amp, negative_downsampling_rate: float = 1.0) -> Dict[str, Any]:
    """Exact AUC, mean BCE and the click-model metrics over the whole mapping, every process scoring its own rows.

    No process gathers every logit: the AUC all-gathers only the smaller class (``distributed_roc_auc_score``); log
    loss, normalized entropy, calibration and the reliability buckets are sums all-reduced once (``ClickMetrics``).
    ``negative_downsampling_rate`` < 1 also reports ``normalized_entropy_corrected`` / ``calibration_corrected``.
    ``ctr_sums`` and ``reliability_sums`` (lists) are the summed sums, for the log and the reliability diagram."""
    model = trainable.core  # no DDP wrapper: evaluation needs no gradient sync
    model.eval()
    click = ClickMetrics(negative_downsampling_rate)
    logits_parts, label_parts = [], []
    with torch.no_grad():
        for numerical, categorical, label, valid in data:
            with amp.autocast():
                logits = model(numerical, categorical)
            logits_parts.append(logits[:valid].float())
            label_parts.append(label[:valid])
            click.add(label_parts[-1], logits=logits_parts[-1])
    model.train()
    device = data.device if hasattr(data, "device") else torch.device("cpu")
    logits = torch.cat(logits_parts) if logits_parts else torch.zeros(0, device=device)
    labels = torch.cat(label_parts) if label_parts else torch.zeros(0, device=device)
    loss_sum, count = all_reduce_sum([binary_cross_entropy_sum(logits, labels).item(), float(labels.numel())],
                                     logits.device)
    click.all_reduce(logits.device)
    stats: Dict[str, int] = {}
    auc = distributed_roc_auc_score(labels, logits, stats)
    return {"auc": auc, "loss": loss_sum / max(count, 1.0), "samples": int(count),
            "auc_rows_gathered": stats["rows_gathered"], **click.metrics(),
            "ctr_sums": click.ctr_sums.tolist(), "reliability_sums": click.reliability_sums.tolist()}


def click_metric_entries(metrics: Dict[str, Any]) -> Dict[str, float]:
    """``test_<key>`` of the click metrics an evaluation has (``CLICK_METRIC_KEYS``)."""
    return {f"test_{k}": metrics[k] for k in CLICK_METRIC_KEYS if k in metrics}


def final_evaluation_entries(metrics: Dict[str, Any], reliability_plot: Optional[str], ctx) -> Dict[str, Any]:
    """The summary's entries of the final evaluation beyond AUC and loss: the click metrics, the summed
    ``test_ctr_sums`` and ``test_reliability_sums`` (lists; ``recsys_common.plot_log`` draws the reliability diagram
    from them), and the diagram itself at ``reliability_plot`` (rank 0 writes it)."""
    out = {**click_metric_entries(metrics), "test_ctr_sums": metrics["ctr_sums"],
           "test_reliability_sums": metrics["reliability_sums"]}
    if reliability_plot and ctx.is_main and metrics["samples"] > 0:
        os.makedirs(os.path.dirname(os.path.abspath(reliability_plot)), exist_ok=True)
        out["reliability_plot"] = plot_reliability(metrics["reliability_sums"], reliability_plot,
                                                   f"DLRM test, {metrics['samples']} rows:", metrics["ctr_sums"])
    return out


def sync(device) -> None:
    """Wait for the device's queued work (CUDA; nothing to wait for on the CPU), before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def inference_benchmark(batch_sizes: Sequence[int], steps: int, ctx, trainable, amp: Amp, info,
                        synthetic: bool, seed: int, hash_indices: bool) -> Dict[str, Any]:
    """Per batch size: samples/s and mean/p90/p95/p99 latency of forward passes (this process's batches).

    ``latencies_ms`` keeps every timed step's latency, so the figures can be checked against them; it goes into the
    returned results, not into the log's summary.
    """
    model = trainable.core
    model.eval()
    out = {}
    for batch_size in batch_sizes:
        global_batch = batch_size * ctx.world_size
        if synthetic:
            data = SyntheticBatches(info, global_batch * 4, global_batch, ctx.device, ctx.rank, ctx.world_size,
                                    seed=seed, pool_size=4)
        else:
            data = SplitBinaryBatches(info, "test", global_batch, ctx.device, ctx.rank, ctx.world_size,
                                      training=True, hash_indices=hash_indices)
        batches = [b for _, b in zip(range(4), data)]
        latencies = []
        with torch.no_grad():
            for step in range(steps + 10):
                numerical, categorical, _, _ = batches[step % len(batches)]
                sync(ctx.device)
                begin = time.perf_counter()
                with amp.autocast():
                    model(numerical, categorical)
                sync(ctx.device)
                if step >= 10:  # warmup
                    latencies.append(time.perf_counter() - begin)
        lat = np.array(latencies) * 1000.0
        out[str(batch_size)] = {
            "throughput": batch_size / (lat.mean() / 1000.0),
            "latency_mean_ms": float(lat.mean()), "latency_p90_ms": float(np.percentile(lat, 90)),
            "latency_p95_ms": float(np.percentile(lat, 95)), "latency_p99_ms": float(np.percentile(lat, 99)),
            "latencies_ms": lat.tolist(),
        }
    model.train()
    return out
