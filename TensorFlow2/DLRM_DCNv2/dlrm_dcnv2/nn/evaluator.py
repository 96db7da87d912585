"""Evaluation over a split: binary cross-entropy, NVIDIA's approximate AUC and the exact AUC, gathered over ranks.

``Evaluator(model, ctx, auc_thresholds=8000, xla=False)``; ``evaluate(batches) -> {"auc", "auc_exact", "loss",
"samples", "throughput", "seconds"}`` where ``batches`` yields ``(numerical, categorical, labels)`` of this rank.

* Every rank predicts its own batch slices; the logits and labels are then allgathered (``hvd_utils.allgather``,
  rank order), so every rank holds the whole split's predictions and computes the same metrics (NVIDIA gathers to
  rank 0 only; gathering to all keeps every rank's return value meaningful and costs one collective).
* ``auc``: ``tf.keras.metrics.AUC(num_thresholds=--auc_thresholds)`` on the sigmoid probabilities, NVIDIA's metric
  (an approximation: scores are bucketed into that many thresholds).
* ``auc_exact``: ``recsys_common.metrics.roc_auc_score`` (tie-aware Mann-Whitney AUC, the one every recipe uses) on
  the float32 logits, which rank the rows as the probabilities do without sigmoid's saturation to exact ties.
* ``loss``: mean binary cross-entropy over the whole split, computed from the logits (numerically stable).
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, Optional

import numpy as np
import tensorflow as tf

from dlrm_dcnv2.distributed import hvd_utils


def bce_from_logits_np(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean BCE of float logits (stable form ``max(x, 0) - x y + log(1 + exp(-|x|))``), in float64."""
    x = np.asarray(logits, np.float64).reshape(-1)
    y = np.asarray(labels, np.float64).reshape(-1)
    if x.size == 0:
        return float("nan")
    return float(np.mean(np.maximum(x, 0.0) - x * y + np.log1p(np.exp(-np.abs(x)))))


def bce_sum_from_logits_np(labels: np.ndarray, logits: np.ndarray) -> float:
    """Sum (not mean) of BCE of float logits, in float64, so the ranks' partial sums add up."""
    x = np.asarray(logits, np.float64).reshape(-1)
    y = np.asarray(labels, np.float64).reshape(-1)
    return float(np.sum(np.maximum(x, 0.0) - x * y + np.log1p(np.exp(-np.abs(x)))))


def approximate_auc(labels: np.ndarray, probabilities: np.ndarray, num_thresholds: int,
                    sum_over_ranks: bool = False) -> float:
    """NVIDIA's metric: ``tf.keras.metrics.AUC(num_thresholds)`` (ROC, interpolation) of one set of predictions.

    ``sum_over_ranks`` (collective): each rank passes its own rows; the per-threshold confusion counts are summed
    over ranks before the AUC is read, which is the metric of all rows together."""
    metric = tf.keras.metrics.AUC(num_thresholds=num_thresholds, curve="ROC", summation_method="interpolation")
    metric.update_state(np.asarray(labels, np.float32).reshape(-1), np.asarray(probabilities, np.float32).reshape(-1))
    if sum_over_ranks:
        for i, variable in enumerate(metric.variables):
            variable.assign(hvd_utils.allreduce(tf.convert_to_tensor(variable), average=False,
                                                name=f"eval_auc_thresholds_{i}"))
    return float(metric.result().numpy())


class Evaluator:
    """Predicts a split with ``model`` (``RecModel``) and scores it; see the module docstring."""

    def __init__(self, model, ctx: Optional[hvd_utils.Context] = None, auc_thresholds: int = 8000,
                 xla: bool = False, run_eagerly: bool = False):
        if auc_thresholds < 2:
            raise ValueError(f"--auc_thresholds must be at least 2, got {auc_thresholds}")
        self.model = model
        self.ctx = ctx if ctx is not None else hvd_utils.context()
        self.auc_thresholds = int(auc_thresholds)
        self._predict = self._forward if run_eagerly else hvd_utils.compile_step(self._forward, xla)

    def _forward(self, numerical, categorical):
        return tf.reshape(tf.cast(self.model((numerical, categorical), training=False), tf.float32), [-1])

    def predict_local(self, batches: Iterable) -> Dict[str, tf.Tensor]:
        """``{"logits", "labels"}`` of this rank's rows, 1-D float32 tensors."""
        logits, labels = [], []
        for numerical, categorical, label in batches:
            logits.append(self._predict(numerical, tuple(categorical)))
            labels.append(tf.reshape(tf.cast(label, tf.float32), [-1]))
        return {"logits": tf.concat(logits, 0) if logits else tf.zeros([0], tf.float32),
                "labels": tf.concat(labels, 0) if labels else tf.zeros([0], tf.float32)}

    def predict(self, batches: Iterable) -> Dict[str, np.ndarray]:
        """``{"logits", "labels"}`` of the whole split (every rank's rows, rank order), float32 numpy arrays."""
        local = self.predict_local(batches)
        return {"logits": hvd_utils.allgather(local["logits"], name="eval_logits").numpy(),
                "labels": hvd_utils.allgather(local["labels"], name="eval_labels").numpy()}

    def evaluate(self, batches: Iterable, stats: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
        """Metrics of every rank's rows (collective). ``stats`` (a dict), when given, receives ``rows_gathered``:
        the scores this rank received for the exact AUC (the smaller class of the whole split)."""
        from recsys_common.metrics import distributed_roc_auc_score
        begin = time.perf_counter()
        local = self.predict_local(batches)
        seconds = time.perf_counter() - begin
        logits, labels = local["logits"].numpy(), local["labels"].numpy()
        sums = hvd_utils.allreduce(tf.constant([float(labels.size), bce_sum_from_logits_np(labels, logits)],
                                               tf.float64), average=False, name="eval_bce_sum").numpy()
        samples = int(sums[0])
        if samples == 0:
            raise ValueError("the evaluation split produced no rows (is the test split empty, or smaller than "
                             "one --valid_batch_size batch?)")
        gathered = {"rows": 0}
        calls = {"reduce": 0}

        def all_gather(array: np.ndarray) -> np.ndarray:
            out = hvd_utils.allgather(tf.constant(array), name="eval_auc_smaller_class").numpy()
            gathered["rows"] += int(out.size)
            return out

        def all_reduce_sum(array: np.ndarray) -> np.ndarray:
            calls["reduce"] += 1   # one name per call: Horovod pairs the ranks' collectives by name
            return hvd_utils.allreduce(tf.constant(array, tf.int64), average=False,
                                       name=f"eval_auc_counts_{calls['reduce']}").numpy()

        auc_exact = distributed_roc_auc_score(labels, logits, all_gather, all_reduce_sum)
        if stats is not None:
            stats["rows_gathered"] = gathered["rows"] if self.ctx.world_size > 1 else 0
        probabilities = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
        return {"auc": approximate_auc(labels, probabilities, self.auc_thresholds, sum_over_ranks=True),
                "auc_exact": float(auc_exact),
                "loss": float(sums[1] / samples),
                "samples": samples, "seconds": seconds,
                "throughput": samples / seconds if seconds > 0 else float("nan")}
