"""The MovieLens example's evaluation: logits of the model (:func:`predict`) and the exact AUC of a split held in
memory (:func:`evaluate_auc`) or streamed a part at a time (:func:`evaluate_auc_parts`, what training reports)."""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
import tensorflow as tf

from recsys_common.feature_spec import FeatureSpec
from recsys_common.metrics import roc_auc_score

from ..data.movielens import load_part, part_files
from .etl import LABEL


def predict(model, data: Dict[str, np.ndarray], names: Sequence[str], batch_size: int,
            max_batches: int = 0) -> np.ndarray:
    """Logits for the rows of ``data`` (the first ``max_batches`` batches if > 0), as float64."""
    n = len(data[LABEL]) if not max_batches else min(len(data[LABEL]), max_batches * batch_size)
    step = _predict_fn(model)
    out = [step({k: tf.constant(data[k][i:i + batch_size]) for k in names}).numpy()
           for i in range(0, n, batch_size)]
    return np.concatenate(out).astype(np.float64)


def _predict_fn(model):
    if not hasattr(model, "_movielens_predict"):
        model._movielens_predict = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    return model._movielens_predict


def evaluate_auc(model, data, names, batch_size: int, max_batches: int = 0) -> float:
    logits = predict(model, data, names, batch_size, max_batches)
    return float(roc_auc_score(data[LABEL][:len(logits)], logits))


def evaluate_auc_parts(model, spec: FeatureSpec, names, batch_size: int, max_batches: int = 0) -> float:
    """Exact AUC over the ``test`` split (or its first ``max_batches`` batches), predicted a part at a time: only the
    logits and labels (12 bytes a row) are kept, not the inputs."""
    logits, labels, budget = [], [], max_batches * batch_size if max_batches else None
    for path in part_files(spec, "test"):
        part = load_part(spec, path)
        if budget is not None:
            part = {k: v[:budget - sum(len(l) for l in labels)] for k, v in part.items()}
        logits.append(predict(model, part, names, batch_size))
        labels.append(part[LABEL])
        if budget is not None and sum(len(l) for l in labels) >= budget:
            break
    return float(roc_auc_score(np.concatenate(labels), np.concatenate(logits)))
