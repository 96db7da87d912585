"""One-hot logistic regression: the floor a CTR model on the same dataset has to beat (framework-free).

Reads any dataset described by a FeatureSpec with ``categorical``, ``numerical`` and ``label`` channels (the
MovieLens CTR dataset of ``recsys_common.movielens_ctr``, a preprocessed Criteo split-binary dataset, synthetic data)
through ``recsys_common.datasets``, one-hot encodes every single-hot categorical feature (ids never seen in training
are ignored) and multi-hot encodes every multi-hot one (one column per id of its cardinality, 1 for each id a row
holds), standardizes the numerical features, fits scikit-learn's L2-regularized ``LogisticRegression`` on the
training mapping and prints the ROC AUC, log loss, normalized entropy and calibration (``recsys_common.metrics``)
on the test mapping. Needs scikit-learn and
scipy (not dependencies of recsys_common itself; imported only when run).

    python -m recsys_common.logistic_baseline --dataset /data/ml-1m-ctr

``main(argv)`` returns the test AUC.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, Optional, Sequence

import numpy as np

from .datasets import PAD, read_columns
from .feature_spec import FeatureSpec
from .io import check_json_output, write_json_output
from .metrics import ctr_metrics, log_loss, roc_auc_score


def load_mapping(spec: FeatureSpec, mapping: str, max_rows: Optional[int]) -> Dict[str, np.ndarray]:
    """Whole mapping in memory as ``categorical`` int64 [N, C] (single-hot features), ``multi_hot`` (feature ->
    int64 [N, max_hotness] padded with -1), ``numerical`` float32 [N, D], ``label`` [N]."""
    all_categorical = spec.channel_spec.get("categorical", [])
    categorical = [f for f in all_categorical if spec.max_hotness(f) == 1]
    multi_hot = [f for f in all_categorical if spec.max_hotness(f) > 1]
    numerical = spec.channel_spec.get("numerical", [])
    label = spec.channel_spec["label"]
    if len(label) != 1:
        raise ValueError(f"{spec.origin}: the baseline needs exactly one label feature, channel_spec.label is {label}")
    columns = read_columns(spec, mapping, features=list(all_categorical) + list(numerical) + label)
    rows = len(columns[label[0]]) if max_rows is None else min(max_rows, len(columns[label[0]]))
    n = rows
    return {
        "categorical": (np.stack([columns[f][:n].astype(np.int64) for f in categorical], axis=1)
                        if categorical else np.zeros((n, 0), np.int64)),
        "numerical": (np.stack([columns[f][:n].astype(np.float32) for f in numerical], axis=1)
                      if numerical else np.zeros((n, 0), np.float32)),
        "multi_hot": {f: columns[f][:n].astype(np.int64).reshape(n, -1) for f in multi_hot},
        "label": columns[label[0]][:n].astype(np.float32),
    }


def multi_hot_matrix(ids: np.ndarray, cardinality: int):
    """int64 ``[N, h]`` padded with -1 -> scipy CSR ``[N, cardinality]`` with a 1 for every id of a row."""
    from scipy import sparse
    rows, slots = np.nonzero(ids != PAD)
    values = ids[rows, slots]
    return sparse.csr_matrix((np.ones(len(rows), np.float32), (rows, values)), shape=(ids.shape[0], cardinality))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", required=True, help="dataset directory")
    parser.add_argument("--feature_spec", default="feature_spec.yaml", help="feature spec file, relative to --dataset")
    parser.add_argument("--train_mapping", default="train", help="source_spec mapping to fit on")
    parser.add_argument("--test_mapping", default="test", help="source_spec mapping to evaluate on")
    parser.add_argument("--C", type=float, default=1.0, help="inverse L2 regularization strength")
    parser.add_argument("--max_iter", type=int, default=1000, help="solver iterations")
    parser.add_argument("--max_train_rows", type=int, default=None, help="use only the first N training rows")
    parser.add_argument("--max_test_rows", type=int, default=None, help="use only the first N test rows")
    parser.add_argument("--output_json", default=None,
                        help="also write the result here (atomically; an existing JSON result is replaced, any other "
                             "file is refused)")
    return parser


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> float:
    """Fit on the train mapping, return the ROC AUC on the test mapping."""
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    args = parse_args(argv)
    check_json_output(args.output_json)   # refuse a path that is not a JSON result before the work, not after
    spec = FeatureSpec.from_yaml(os.path.join(args.dataset, args.feature_spec))
    train = load_mapping(spec, args.train_mapping, args.max_train_rows)
    test = load_mapping(spec, args.test_mapping, args.max_test_rows)
    for name, part in (("train", train), ("test", test)):
        if len(np.unique(part["label"])) < 2:
            raise ValueError(f"{args.dataset}: the {name} mapping has only one label value; AUC is undefined")

    start = time.perf_counter()
    blocks_train, blocks_test = [], []
    if train["categorical"].shape[1]:
        encoder = OneHotEncoder(handle_unknown="ignore", dtype=np.float32)
        blocks_train.append(encoder.fit_transform(train["categorical"]))
        blocks_test.append(encoder.transform(test["categorical"]))
    for name in train["multi_hot"]:
        blocks_train.append(multi_hot_matrix(train["multi_hot"][name], spec.cardinality(name)))
        blocks_test.append(multi_hot_matrix(test["multi_hot"][name], spec.cardinality(name)))
    if train["numerical"].shape[1]:
        scaler = StandardScaler()
        blocks_train.append(sparse.csr_matrix(scaler.fit_transform(train["numerical"])))
        blocks_test.append(sparse.csr_matrix(scaler.transform(test["numerical"])))
    x_train = sparse.hstack(blocks_train, format="csr")
    x_test = sparse.hstack(blocks_test, format="csr")

    model = LogisticRegression(C=args.C, max_iter=args.max_iter, solver="lbfgs")
    model.fit(x_train, train["label"])
    fit_seconds = time.perf_counter() - start
    probability = model.predict_proba(x_test)[:, 1]
    auc = roc_auc_score(test["label"], probability)
    click = ctr_metrics(test["label"], probabilities=probability)   # NE < 1 beats the background rate; 1 = calibrated
    result = {
        "test_auc": round(auc, 6),
        "test_logloss": round(log_loss(test["label"], probability), 6),
        "test_normalized_entropy": round(click["normalized_entropy"], 6),
        "test_calibration": round(click["calibration"], 6),
        "train_rows": int(len(train["label"])), "test_rows": int(len(test["label"])),
        "one_hot_columns": int(x_train.shape[1]), "fit_seconds": round(fit_seconds, 2),
        "C": args.C, "iterations": int(np.max(model.n_iter_)),
    }
    print(json.dumps(result))
    if args.output_json:
        write_json_output(args.output_json, result)
    return auc


if __name__ == "__main__":
    main(sys.argv[1:])
