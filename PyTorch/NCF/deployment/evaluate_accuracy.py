"""HR@K / NDCG@K of the served NCF model (tritonclient, gRPC and/or HTTP) against the recipe's own evaluation.

    python deployment/evaluate_accuracy.py --data /tmp/ncf_quickstart/cache/synthetic \
        --load_checkpoint_path /tmp/ncf_quickstart/checkpoints/model.pth \
        --grpc-url 127.0.0.1:8001 --http-url 127.0.0.1:8000 --model-name ncf-onnx --output-json accuracy.json

Every test user's candidates (its held-out positive, then its negatives: the test mapping of ``--data``, exactly
the rows ``ncf.py`` evaluates) are sent through the server as ``(user, item)`` rows; the returned probabilities
are ranked with the recipe's rule (``neumf.evaluation.evaluate``: a candidate repeating an earlier one is ignored, ties count
against the positive, a NaN score is a miss). The same rows are evaluated by ``neumf.evaluation.evaluate`` on the checkpoint
(on the logits, in PyTorch). Prints and writes (JSON) both, their differences and the largest per-row probability
difference; exits 1 if a metric differs by more than ``--tolerance``, 2 on bad input or an unreachable server.

Why a tolerance at all: the server returns ``sigmoid(logit)`` in float32, where two different large logits can
round to the same probability (a tie, counted against the positive), and onnxruntime's float arithmetic differs
from PyTorch's in the last bits.
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext
from dataclasses import replace
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.dirname(HERE)
for _path in (HERE, RECIPE, os.path.join(os.path.dirname(os.path.dirname(RECIPE)), "common")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from neumf.checkpointing import CheckpointError  # noqa: E402
from neumf.cli import ConfigurationError  # noqa: E402
from neumf.data import DatasetError, EvalSet, duplicate_mask, load_dataset  # noqa: E402
from neumf.evaluation import check_topk, evaluate, rank_positives  # noqa: E402
from neumf.recommend import load_model  # noqa: E402
from neumf.serving import OUTPUT_NAME  # noqa: E402
from recsys_common.cli import run_main  # noqa: E402
from recsys_common.cli import CheckFailedError  # noqa: E402
from recsys_common.serving.client import InferenceClient, ServingError, infer_in_batches  # noqa: E402
from recsys_common.feature_spec import FeatureSpecError  # noqa: E402
from recsys_common.flags import add_flag  # noqa: E402
from recsys_common.io import check_json_output, write_json_output  # noqa: E402


def ranking_metrics(scores: np.ndarray, candidates: np.ndarray, topk: int) -> Dict[str, float]:
    """HR@K and NDCG@K of ``scores [U, S]`` (positive in column 0) with ``neumf.evaluation.evaluate``'s rule
    (``neumf.evaluation.rank_positives``, the one function both use).

    >>> ranking_metrics(np.array([[0.9, 0.1, 0.2], [0.2, 0.5, 0.1]]), np.array([[1, 2, 3], [1, 2, 3]]), topk=1)
    {'hr': 0.5, 'ndcg': 0.5, 'users': 2, 'nan_users': 0}
    """
    hits, ndcg, unrankable = rank_positives(torch.as_tensor(scores, dtype=torch.float64),
                                                duplicate_mask(torch.as_tensor(candidates)), topk)
    users = scores.shape[0]
    return {"hr": float(hits.sum()) / users, "ndcg": float(ndcg.sum()) / users, "users": users,
            "nan_users": int(unrankable.sum())}


def served_scores(url: str, protocol: str, model_name: str, users: np.ndarray, items: np.ndarray,
                  batch_size: int, timeout_s: float) -> np.ndarray:
    """Probabilities of the rows ``(users[i], items[i])`` from the server at ``url``, ``batch_size`` rows per
    request; raises ``recsys_common.serving.client.ServingError`` naming the url and model on any failure."""
    with InferenceClient(url, protocol=protocol, timeout_s=timeout_s) as client:
        client.wait_until_ready(model_name, timeout_s)
        out = infer_in_batches(client, model_name, {"user": users.reshape(-1, 1), "item": items.reshape(-1, 1)},
                               [OUTPUT_NAME], batch_size, progress=True)
    return np.asarray(out[OUTPUT_NAME], dtype=np.float32).reshape(-1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Served NCF HR@K/NDCG@K vs the recipe's own evaluation")
    p.add_argument("--data", required=True, help="dataset directory (feature_spec.yaml; its test mapping is used)")
    p.add_argument("--feature_spec_file", default="feature_spec.yaml")
    p.add_argument("--load_checkpoint_path", required=True, help="the checkpoint the served model was exported from")
    add_flag(p, "--grpc-url", "--server-url", default=None, help="host:port of the server's gRPC endpoint")
    add_flag(p, "--http-url", default=None, help="host:port of the server's HTTP endpoint")
    add_flag(p, "--model-name", default="ncf-onnx", help="served model (deployer.py: <name>-onnx / <name>-ts)")
    p.add_argument("-k", "--topk", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16384, help="rows per request (<= the model's max_batch_size)")
    p.add_argument("--max_users", type=int, default=None, help="evaluate the first N test users only")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="largest allowed |served - framework| of HR@K and of NDCG@K")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request (and to wait for the model)")
    add_flag(p, "--output-json", default=None, help="write the results here (atomically)")
    return p


def main(argv: Optional[List[str]] = None) -> Dict:
    """Returns ``{"framework": {...}, "grpc"/"http": {..., "hr_diff", "ndcg_diff", "max_abs_prob_diff"},
    "passed": bool, ...}``. Raises :data:`INPUT_ERRORS` for bad input or an unreachable server, and
    ``CheckFailedError`` (holding the result) when a difference exceeds the tolerance."""
    p = build_parser()
    args = p.parse_args(argv)
    protocols = {name: url for name, url in (("grpc", args.grpc_url), ("http", args.http_url)) if url}
    if not protocols:
        p.error("give --grpc-url and/or --http-url")
    if args.batch_size <= 0 or args.topk <= 0 or args.tolerance < 0:
        p.error("--batch-size and -k must be > 0, --tolerance >= 0")
    check_json_output(args.output_json)  # before the work: an existing non-JSON file is refused
    data = load_dataset(args.data, args.feature_spec_file)
    check_topk(args.topk, data.samples_per_series, args.data)
    model, config = load_model(args.load_checkpoint_path)
    if (config["num_users"], config["num_items"]) != (data.num_users, data.num_items):
        raise DatasetError(f"--data {args.data}: {data.num_users} users / {data.num_items} items, the checkpoint "
                           f"has {config['num_users']} / {config['num_items']}: not its dataset")
    samples = data.samples_per_series
    if args.max_users is not None:
        if args.max_users <= 0:
            raise DatasetError("--max_users must be > 0")
        rows = min(args.max_users * samples, len(data.test_users))
        data = replace(data, test_users=data.test_users[:rows], test_items=data.test_items[:rows],
                       test_labels=data.test_labels[:rows])
    test = EvalSet(data, 0, 1, torch.device("cpu"))
    framework = evaluate(model, test, args.topk, 1 << 20, nullcontext)
    framework = {"hr": framework["hr"], "ndcg": framework["ndcg"], "users": int(test.users.shape[0])}
    with torch.no_grad():
        framework_probs = torch.sigmoid(model(torch.as_tensor(data.test_users),
                                              torch.as_tensor(data.test_items))).numpy()
    result = {"data": os.path.abspath(args.data), "checkpoint": os.path.abspath(args.load_checkpoint_path),
              "model_name": args.model_name, "topk": args.topk, "rows": int(len(data.test_users)),
              "tolerance": args.tolerance, "framework": framework}
    passed = True
    for protocol, url in protocols.items():
        probs = served_scores(url, protocol, args.model_name, data.test_users, data.test_items,
                              args.batch_size, args.timeout)
        served = ranking_metrics(probs.reshape(-1, samples), data.test_items.reshape(-1, samples), args.topk)
        served.update(url=url, hr_diff=abs(served["hr"] - framework["hr"]),
                      ndcg_diff=abs(served["ndcg"] - framework["ndcg"]),
                      max_abs_prob_diff=float(np.abs(probs - framework_probs).max()))
        served["passed"] = served["hr_diff"] <= args.tolerance and served["ndcg_diff"] <= args.tolerance
        passed = passed and served["passed"]
        result[protocol] = served
        print(f"evaluate_accuracy: {protocol} {url} {args.model_name}: hr@{args.topk} {served['hr']:.6f} "
              f"ndcg@{args.topk} {served['ndcg']:.6f} | framework {framework['hr']:.6f} {framework['ndcg']:.6f}"
              f" | diff {served['hr_diff']:.2e} {served['ndcg_diff']:.2e} | max |prob diff| "
              f"{served['max_abs_prob_diff']:.2e}")
    result["passed"] = passed
    if args.output_json:
        write_json_output(args.output_json, result)
    if not passed:
        raise CheckFailedError(f"a metric differs by more than --tolerance {args.tolerance}", result)
    return result


def input_errors():
    return (ServingError, FileExistsError, DatasetError, FeatureSpecError, CheckpointError,
            ConfigurationError)


if __name__ == "__main__":
    run_main(main, prog="evaluate_accuracy.py", input_errors=input_errors())
