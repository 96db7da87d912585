"""Popularity baseline of the MovieLens example: score a rating by its movie's training statistics.

Two scores, both fitted on ``train`` only and evaluated by AUC on ``test`` (valid/):
    positive_rate   (positives of the movie + PRIOR_STRENGTH * global rate) / (ratings of the movie + PRIOR_STRENGTH):
                    the movie's smoothed share of ratings > 3 (an unseen movie gets the global rate)
    count           the movie's number of training ratings (how popular it is)

    python -m wide_deep.movielens.baseline --dataset_path /data/movielens

``popularity_aucs(spec)`` returns ``{"positive_rate": auc, "count": auc}``.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Dict, Optional, Sequence

import numpy as np
import pyarrow.parquet as pq

from recsys_common.cli import run_main
from recsys_common.feature_spec import FeatureSpec
from recsys_common.metrics import roc_auc_score

from ..data.movielens import part_files
from .etl import ITEM, LABEL, SPEC_NAME

# Pseudo-ratings at the global rate added to every movie: keeps a movie rated once from scoring 0 or 1.
PRIOR_STRENGTH = 5.0


def fit_popularity(items: np.ndarray, labels: np.ndarray, num_items: int) -> Dict[str, np.ndarray]:
    """Per-item tables from training ids and 0/1 labels: ``{"positive_rate": [num_items], "count": [num_items]}``."""
    counts = np.bincount(items, minlength=num_items).astype(np.float64)
    positives = np.bincount(items, weights=labels.astype(np.float64), minlength=num_items)
    prior = float(labels.mean())
    return {"positive_rate": (positives + PRIOR_STRENGTH * prior) / (counts + PRIOR_STRENGTH), "count": counts}


def _item_label_parts(spec: FeatureSpec, mapping: str):
    """``(items, labels)`` of each parquet part of a split, reading those two columns only (not the genre lists)."""
    for path in part_files(spec, mapping):
        table = pq.read_table(path, columns=[ITEM, LABEL])
        yield table.column(ITEM).to_numpy().astype(np.int64), table.column(LABEL).to_numpy()


def popularity_aucs(spec: FeatureSpec) -> Dict[str, float]:
    """AUC on ``test`` of each popularity score fitted on ``train`` (streamed a part at a time: the training counts
    are per-movie sums, and only the test movies and labels are kept)."""
    num_items = spec.cardinality(ITEM)
    counts, positives, rows = np.zeros(num_items), np.zeros(num_items), 0
    for items, labels in _item_label_parts(spec, "train"):
        counts += np.bincount(items, minlength=num_items)
        positives += np.bincount(items, weights=labels.astype(np.float64), minlength=num_items)
        rows += len(items)
    prior = positives.sum() / max(rows, 1)
    tables = {"positive_rate": (positives + PRIOR_STRENGTH * prior) / (counts + PRIOR_STRENGTH), "count": counts}
    test = list(_item_label_parts(spec, "test"))
    items, labels = np.concatenate([t[0] for t in test]), np.concatenate([t[1] for t in test])
    return {name: float(roc_auc_score(labels, table[items])) for name, table in tables.items()}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    p = argparse.ArgumentParser(prog="python -m wide_deep.movielens.baseline", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset_path", required=True, help="output directory of wide_deep.movielens.etl")
    args = p.parse_args(argv)
    aucs = popularity_aucs(FeatureSpec.from_yaml(os.path.join(args.dataset_path, SPEC_NAME)))
    print(json.dumps({"popularity_auc": aucs}))
    return aucs


if __name__ == "__main__":
    run_main(main, input_errors=(FileNotFoundError, ValueError))   # a missing or malformed --dataset_path
