"""Evaluation over a split: binary cross-entropy, NVIDIA's approximate AUC and the exact AUC, gathered over ranks.

``Evaluator(model, ctx, auc_thresholds=8000, xla=False)``; ``evaluate(batches) -> {"auc", "auc_exact", "loss",
"log_loss", "normalized_entropy", "calibration", "samples", "throughput", "seconds"}`` where ``batches`` yields
``(numerical, categorical, labels)`` of this rank.

* Every rank predicts its own batch slices; the logits and labels are then allgathered (``hvd_utils.allgather``,
  rank order), so every rank holds the whole split's predictions and computes the same metrics (NVIDIA gathers to
  rank 0 only; gathering to all keeps every rank's return value meaningful and costs one collective).
* ``auc``: ``tf.keras.metrics.AUC(num_thresholds=--auc_thresholds)`` on the sigmoid probabilities, NVIDIA's metric
  (an approximation: scores are bucketed into that many thresholds).
* ``auc_exact``: ``recsys_common.metrics.roc_auc_score`` (tie-aware Mann-Whitney AUC, the one every recipe uses) on
  the float32 logits, which rank the rows as the probabilities do without sigmoid's saturation to exact ties.
* ``loss``: mean binary cross-entropy over the whole split, computed from the logits (numerically stable).
* ``log_loss``, ``normalized_entropy``, ``calibration`` (issue 33, :func:`dlrm_dcnv2.model.metrics.click_metrics`):
  the click-model figures of ``recsys_common.metrics.ctr_metrics_from_sums``. Each rank adds up ``ctr_sums`` of its
  rows (four float64 sums: rows, positives, sum of p, sum of row losses) and the sums are added over ranks with the
  allreduce that already sums the BCE; no prediction is gathered for them. ``log_loss`` equals ``loss`` (up to float64
  rounding order); NE = log loss / entropy of the observed CTR (< 1: better than predicting the base rate),
  calibration = sum p / positives (1: as many clicks predicted as observed). With ``negative_downsampling_rate`` w < 1
  (a model trained on data whose negatives were kept with probability w), ``calibration_corrected`` and
  ``normalized_entropy_corrected`` are the same figures of the logits corrected by ``log w``
  (``correct_downsampled_logits``).
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, Optional

import numpy as np
import tensorflow as tf

from dlrm_dcnv2.distributed import hvd_utils
from dlrm_dcnv2.model.metrics import bce_sum_from_logits_np, click_metrics_from_sums, click_sums
from recsys_common.metrics import distributed_roc_auc_score, reliability_sums


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
                 xla: bool = False, run_eagerly: bool = False, negative_downsampling_rate: float = 1.0):
        if auc_thresholds < 2:
            raise ValueError(f"--auc_thresholds must be at least 2, got {auc_thresholds}")
        if not 0.0 < float(negative_downsampling_rate) <= 1.0:
            raise ValueError(f"a negative down-sampling rate must lie in (0, 1], got {negative_downsampling_rate!r}")
        self.negative_downsampling_rate = float(negative_downsampling_rate)
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
        the scores this rank received for the exact AUC (the smaller class of the whole split), ``ctr_sums`` and
        ``reliability_sums`` (every rank's, added: what ``plot_reliability`` draws)."""
        begin = time.perf_counter()
        local = self.predict_local(batches)
        seconds = time.perf_counter() - begin
        logits, labels = local["logits"].numpy(), local["labels"].numpy()
        # One allreduce of float64 sums: [rows, BCE sum], the click-model sums, the reliability buckets.
        clicks = click_sums(labels, logits, negative_downsampling_rate=self.negative_downsampling_rate)
        buckets = reliability_sums(labels, logits=logits)
        local_sums = np.concatenate([[float(labels.size), bce_sum_from_logits_np(labels, logits)], clicks,
                                     buckets.reshape(-1)])
        sums = hvd_utils.allreduce(tf.constant(local_sums, tf.float64), average=False, name="eval_bce_sum").numpy()
        clicks = sums[2:2 + clicks.size]
        buckets = sums[2 + clicks.size:].reshape(buckets.shape)
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
            stats["ctr_sums"], stats["reliability_sums"] = clicks[:4], buckets
        probabilities = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
        return {"auc": approximate_auc(labels, probabilities, self.auc_thresholds, sum_over_ranks=True),
                "auc_exact": float(auc_exact),
                "loss": float(sums[1] / samples),
                **click_metrics_from_sums(clicks),
                "samples": samples, "seconds": seconds,
                "throughput": samples / seconds if seconds > 0 else float("nan")}
