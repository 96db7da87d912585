"""``deployment/evaluate_accuracy.py`` (NVIDIA's ``triton/evaluate_accuracy.py`` runs it): the validation split through a KServe-v2 server (Triton; here the CPU repository on ``triton_server``) with
tritonclient, compared with the recipe's own evaluation of the same checkpoint on the same rows.

    python deployment/evaluate_accuracy.py --checkpoint-dir /tmp/wide_deep_quickstart/model \\
        --dataset_path /tmp/wide_deep_quickstart/data --embedding_sizes_file /tmp/wide_deep_quickstart/embedding_sizes.json \\
        --deep_hidden_units 32 32 --server-url 127.0.0.1:8001 --protocol grpc --model-name widedeep-onnx

Wide & Deep: the ``test`` mapping read by the recipe's loader (``ParquetBatches``); the framework side is the recipe's
``wide_deep.train.evaluate`` (exact BCE, AUC, MAP@12 per ``display_id``, normalized entropy and calibration,
:mod:`wide_deep.evaluation`); the server side
sends the same rows and computes the same metrics on the returned probabilities. MovieLens (``--model movielens``):
AUC on its ``test`` mapping. Prints both, the differences and the largest per-row probability difference; writes them
as JSON (``--output-json``); exits 1 when a metric differs by more than ``--tolerance``, 2 on bad flags or an
unreachable server (every call has ``--timeout``).
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys_common.cli import CheckFailedError, InputError, exit_status
from recsys_common.flags import add_flag  # --server-url and --server_url alike
from recsys_common.io import check_json_output, write_json_output
from recsys_common.metrics import roc_auc_score
from recsys_common.serving import client as serving_client   # (module attribute: tests stand in for the server)
from recsys_common.serving.client import InferenceClient, ServingError
from wide_deep.data.loader import ParquetBatches
from wide_deep.data.movielens import load_split, model_feature_names
from wide_deep.distributed import Dist
from wide_deep.evaluation import compute_metrics
from wide_deep.movielens.etl import LABEL
from wide_deep.movielens.evaluation import evaluate_auc, predict
from wide_deep.serving import MOVIELENS, OUTPUT_NAME, ServingInput, model_from_args, model_parser, serving_inputs
from wide_deep.train import evaluate


def to_request_arrays(features: Dict[str, np.ndarray], inputs: Sequence[ServingInput]) -> Dict[str, np.ndarray]:
    """The model's input arrays (``[B]`` ids / numericals, ``[B, H]`` lists) -> the served inputs (``[B, 1]`` /
    ``[B, H]``, the exported dtypes)."""
    out = {}
    for s in inputs:
        a = np.asarray(features[s.name])
        out[s.name] = (a.reshape(-1, 1) if s.kind != "multihot" else a).astype(s.dtype)
    return out


def _concat(parts: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def framework_wide_deep(model, config, spec, batch_size: int) -> Tuple[Dict[str, float], Dict[str, np.ndarray],
                                                                        np.ndarray, np.ndarray, np.ndarray, bool]:
    """The recipe's evaluation of ``model`` on the test mapping; returns ``(metrics, request arrays, display ids,
    labels, framework probabilities, with_map)``. The predict function also records each batch's inputs, so both
    sides see exactly the rows (and row order) ``wide_deep.train.evaluate`` saw."""
    inputs = serving_inputs(config, spec)
    batches = ParquetBatches(spec, "test", batch_size)
    with_map = batches.description["map"] is not None
    model_fn = tf.function(lambda f: tf.sigmoid(model(f, training=False)), reduce_retracing=True)
    seen_inputs, seen_probs, seen_labels, seen_ids = [], [], [], []

    def predict_fn(features):
        probs = model_fn(features)
        seen_inputs.append(to_request_arrays({k: v.numpy() for k, v in features.items()}, inputs))
        seen_probs.append(probs.numpy())
        return probs

    def recorded():
        for features, labels, display in batches:
            seen_labels.append(labels.numpy())
            seen_ids.append(display.numpy())
            yield features, labels, display
    metrics = evaluate(model, recorded(), Dist(), predict_fn, with_map)
    return (metrics, _concat(seen_inputs), np.concatenate(seen_ids), np.concatenate(seen_labels),
            np.concatenate(seen_probs).astype(np.float64), with_map)


def framework_movielens(model, config, spec, batch_size: int):
    """``({"auc": ...}, request arrays, labels, framework probabilities)`` on the MovieLens test mapping, the AUC
    computed by ``wide_deep.movielens.evaluation.evaluate_auc`` (the example's own evaluation)."""
    data = load_split(spec, "test")
    names = model_feature_names(spec)
    auc = evaluate_auc(model, data, names, batch_size)
    probs = 1.0 / (1.0 + np.exp(-predict(model, data, names, batch_size)))
    return {"auc": auc}, to_request_arrays(data, serving_inputs(config, spec)), data[LABEL], probs


def build_parser() -> argparse.ArgumentParser:
    p = model_parser("triton/evaluate_accuracy.py", __doc__)
    s = p.add_argument_group("server")
    add_flag(s, "--server-url", default="127.0.0.1:8001", help="host:port of the server's --protocol endpoint")
    s.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    add_flag(s, "--model-name", default=None, help="served model (default widedeep-onnx / movielens-onnx)")
    s.add_argument("--batch-size", type=int, default=4096, help="rows per request (and per framework batch)")
    s.add_argument("--timeout", type=float, default=60.0, help="seconds per call (connect, ready, infer)")
    s.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest allowed |server - framework| of each metric (AUC, MAP@12, BCE, NE, "
                        "calibration)")
    add_flag(s, "--output-json", default=None, help="write the comparison here (atomically)")
    return p


def compare(framework: Dict[str, float], served: Dict[str, float], tolerance: float) -> Dict[str, float]:
    """``{metric: served - framework}``; 0 where both are NaN (an undefined metric, e.g. NE of a split without
    clicks, is undefined on both sides alike)."""
    return {k: 0.0 if np.isnan(served[k]) and np.isnan(framework[k]) else float(served[k] - framework[k])
            for k in framework}


def evaluate_served(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Framework vs served metrics; returns the report (also ``--output_json``). Raises ``InputError`` (flags),
    ``ServingError``, ``FileNotFoundError``, ``ValueError``; ``CheckFailedError`` (with the report) when a metric
    differs by more than ``--tolerance``."""
    args = build_parser().parse_args(argv)
    if args.batch_size < 1 or args.timeout <= 0 or args.tolerance < 0:
        raise InputError("--batch-size must be >= 1, --timeout > 0 and --tolerance >= 0")
    model_name = args.model_name or ("movielens-onnx" if args.model == MOVIELENS else "widedeep-onnx")
    check_json_output(args.output_json)
    # Fail fast on an unreachable server, before the (slower) framework evaluation.
    client = InferenceClient(args.server_url, args.protocol, timeout_s=args.timeout)
    with client:
        client.wait_until_ready(model_name, timeout_s=args.timeout)
        model, config, spec = model_from_args(args)
        if args.model == MOVIELENS:
            framework, requests, labels, fw_probs = framework_movielens(model, config, spec, args.batch_size)
            display_ids, with_map = None, False
        else:
            framework, requests, display_ids, labels, fw_probs, with_map = framework_wide_deep(
                model, config, spec, args.batch_size)
        served_probs = serving_client.infer_in_batches(client, model_name, requests, [OUTPUT_NAME],
                                        args.batch_size)[OUTPUT_NAME].reshape(-1).astype(np.float64)
    if args.model == MOVIELENS:
        served = {"auc": float(roc_auc_score(labels, served_probs))}
    else:
        served = compute_metrics(display_ids, served_probs, labels, with_map=with_map)
    difference = compare(framework, served, args.tolerance)
    passed = all(abs(d) <= args.tolerance for d in difference.values())
    result = {"model": args.model, "model_name": model_name, "server_url": args.server_url,
              "protocol": args.protocol, "rows": int(len(labels)), "framework": framework, "server": served,
              "difference": difference, "max_abs_probability_difference": float(np.max(np.abs(served_probs - fw_probs))),
              "tolerance": args.tolerance, "passed": passed}
    names = {"loss": "BCE", "auc": "AUC", "map12": "MAP@12", "normalized_entropy": "NE",
             "calibration": "calibration"}
    for k in framework:
        print(f"[evaluate_accuracy] {names.get(k, k)}: framework {framework[k]:.6f} server {served[k]:.6f} "
              f"difference {difference[k]:+.2e}")
    print(f"[evaluate_accuracy] {result['rows']} rows, max |probability difference| "
          f"{result['max_abs_probability_difference']:.2e}, tolerance {args.tolerance:g}: "
          f"{'PASSED' if passed else 'FAILED'}")
    if args.output_json:
        write_json_output(args.output_json, result)
    if not passed:
        raise CheckFailedError(f"a served metric differs from the framework's by more than --tolerance "
                               f"{args.tolerance:g}", result)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line's exit status (recsys_common.cli): 0 within tolerance, 1 beyond it, 2 for bad input or an
    unreachable server."""
    return exit_status(evaluate_served, argv, prog="evaluate_accuracy.py",
                       input_errors=(ServingError, FileNotFoundError, ValueError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
