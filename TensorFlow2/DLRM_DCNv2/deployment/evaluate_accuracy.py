"""AUC of a deployed model through the server (tritonclient, gRPC and HTTP) against the recipe's own evaluation.

    python -m deployment.evaluate_accuracy --dataset_path DIR --checkpoint CKPT --model_name dlrm-onnx \\
        --server_url 127.0.0.1:8001 --http_url 127.0.0.1:8000 [--tolerance 1e-4] [--output_json acc.json]

Both sides score the same rows: the test split (``--test_on_train``: the training split) read by the recipe's
loader in batches of ``--batch_size`` (at most ``--max_steps`` batches). The server gets them as the serving inputs
(``numerical`` float32 [b, n], ``cat_<t>`` int64 [b, hotness_t]) and returns ``probability``; the recipe runs its
``Evaluator`` (the one ``--mode eval`` uses) on the checkpoint's model. Reported for each side: the exact AUC
(``recsys_common.metrics.roc_auc_score``; the recipe's on its logits, the server's on the probabilities) and
NVIDIA's approximate AUC (``tf.keras.metrics.AUC(--auc_thresholds)``), the click-model figures log loss,
normalized entropy and calibration (``dlrm_dcnv2.model.metrics.click_metrics``) with the served side's differences,
plus the largest per-row probability difference. The run fails (exit status 1) when an exact AUC differs from the
recipe's by more than ``--tolerance``. A model deployed from negatively down-sampled data serves
``sigmoid(logit + log w)``; the recipe's logits get the same ``log w`` (``--negative_downsampling_rate``, default the
feature spec's recorded rate, as deploy.py's default: pass the deployed rate if you overrode it), so both sides report
the full data's calibration; ``recipe_uncorrected`` adds the model's own metrics with their ``*_corrected`` forms.

The seed's flags ``--dataset_path --dataset_type --feature_spec --batch_size --auc_thresholds --max_steps
--model_name --test_on_train`` keep their names; its ``--sparse_input_format``/``--fused_embedding`` (HPS inputs)
have no counterpart: every deployment here takes the same inputs.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from dlrm_dcnv2 import serving
from dlrm_dcnv2.data import create_input
from dlrm_dcnv2.data.dataloader import load_spec
from dlrm_dcnv2.model.metrics import CLICK_METRICS, CORRECTED_CLICK_METRICS, click_metrics
from recsys_common.cli import CheckFailedError, exit_status
from recsys_common.feature_spec import negative_downsampling_rate as recorded_rate
from recsys_common.flags import add_flag  # --server-url and --server_url alike
from recsys_common.io import check_json_output, write_json_output
from recsys_common.metrics import roc_auc_score
from recsys_common.serving.client import InferenceClient

# The recipe's Evaluator (TensorFlow) is imported inside the two functions that score rows, on purpose: a flag error
# costs no TensorFlow start-up.
PROTOCOLS = ("grpc", "http")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m deployment.evaluate_accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset_path", required=True, help="dataset directory (its feature spec)")
    p.add_argument("--dataset_type", default="tf_raw", choices=("tf_raw", "split_tfrecords"), help="dataset format")
    p.add_argument("--feature_spec", default="feature_spec.yaml", help="feature spec, relative to --dataset_path")
    p.add_argument("--checkpoint", required=True,
                   help="the checkpoint the deployed model was exported from (the recipe's side of the comparison)")
    add_flag(p, "--model_name", required=True, help="deployed model, e.g. dlrm-onnx or the ensemble dlrm")
    add_flag(p, "--server_url", "--grpc-url", default="127.0.0.1:8001", help="gRPC endpoint host:port")
    add_flag(p, "--http_url", default="127.0.0.1:8000", help="HTTP endpoint host:port")
    p.add_argument("--protocols", default="grpc,http", help="comma-separated: grpc, http")
    p.add_argument("--batch_size", type=int, default=32768, help="rows per request (and per recipe batch)")
    p.add_argument("--max_steps", type=int, default=None, help="at most this many batches (default: the whole split)")
    p.add_argument("--test_on_train", action="store_true", help="score the training split instead of the test split")
    p.add_argument("--auc_thresholds", type=int, default=8000, help="thresholds of the approximate AUC")
    p.add_argument("--negative_downsampling_rate", type=float, default=None,
                   help="w the served model was deployed with (its recsys_serving.json): the recipe's logits get "
                        "the same + log w. Default: the feature spec's recorded rate, as deploy.py's default")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest accepted |served exact AUC - recipe exact AUC|")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds allowed per request (and for readiness)")
    add_flag(p, "--output_json", default=None, help="write the report here (atomically)")
    return p


def load_rows(dataset_type: str, dataset_path: str, spec, mapping: str, batch_size: int,
              max_steps: Optional[int]) -> List[tuple]:
    """The batches both sides score: ``(numerical, categorical tuple, labels)`` tensors of the recipe's loader
    (``spec``: the dataset's feature spec, parsed once)."""
    data = create_input(dataset_type, dataset_path, mapping=mapping, global_batch_size=batch_size, spec=spec)
    batches = []
    for i, batch in enumerate(data):
        if max_steps is not None and i >= max_steps:
            break
        batches.append(batch)
    if not batches:
        raise ValueError(f"{dataset_path}: split {mapping!r} gave no batch of --batch_size {batch_size}")
    return batches


def served_probabilities(url: str, protocol: str, model: str, requests: List[Dict[str, np.ndarray]],
                         timeout_s: float) -> np.ndarray:
    """Every request through ``model`` at ``url``; the probabilities in row order (float32 [rows])."""
    probability = serving.PROBABILITY
    out = []
    with InferenceClient(url, protocol, timeout_s=timeout_s) as client:
        client.wait_until_ready(model, timeout_s=timeout_s)
        for i, inputs in enumerate(requests):
            out.append(np.asarray(client.infer(model, inputs, [probability])[probability], np.float32).reshape(-1))
            if (i + 1) % 50 == 0:
                print(f"[{protocol}] {i + 1}/{len(requests)} requests", file=sys.stderr, flush=True)
    return np.concatenate(out)


def metrics(labels: np.ndarray, scores: np.ndarray, probabilities: np.ndarray, thresholds: int) -> Dict[str, float]:
    """Exact AUC of ``scores`` (logits or probabilities rank the rows alike) and approximate AUC of the
    probabilities."""
    from dlrm_dcnv2.model.evaluator import approximate_auc
    return {"auc_exact": float(roc_auc_score(labels, scores)),
            "auc": approximate_auc(labels, probabilities, thresholds)}


def evaluate_accuracy(dataset_path: str, checkpoint: str, model_name: str, urls: Dict[str, str], *,
                      dataset_type: str = "tf_raw", feature_spec: str = "feature_spec.yaml", batch_size: int = 32768,
                      max_steps: Optional[int] = None, test_on_train: bool = False, auc_thresholds: int = 8000,
                      tolerance: float = 1e-4, timeout_s: float = 60.0,
                      negative_downsampling_rate: Optional[float] = None) -> Dict[str, Any]:
    """The report (see the module docstring); ``urls``: {protocol: host:port}. ``report["passed"]`` tells whether
    every protocol's exact AUC is within ``tolerance`` of the recipe's. Each side also has ``log_loss``,
    ``normalized_entropy`` and ``calibration`` (``dlrm_dcnv2.model.metrics.click_metrics``: the recipe's from its
    logits, the server's from the probabilities) and each served entry their ``*_difference``.

    ``negative_downsampling_rate``: the w the served model was deployed with (``None``: the feature spec's recorded
    rate, deploy.py's default). With w < 1 the served model returns ``sigmoid(logit + log w)``; the recipe's side
    adds the same ``log w`` to its logits, so both report the full data's (corrected) metrics, and
    ``recipe_uncorrected`` holds the down-sampled model's own metrics with their ``*_corrected`` forms."""
    from dlrm_dcnv2.model.evaluator import Evaluator
    mapping = "train" if test_on_train else "test"
    spec = load_spec(dataset_path, feature_spec, "--feature_spec")
    rate = recorded_rate(spec) if negative_downsampling_rate is None else float(negative_downsampling_rate)
    if not 0.0 < rate <= 1.0:   # also refuses NaN
        raise ValueError(f"--negative_downsampling_rate must lie in (0, 1], got {negative_downsampling_rate}")
    loaded = serving.load_checkpoint_model(checkpoint, spec)
    batches = load_rows(dataset_type, dataset_path, spec, mapping, batch_size, max_steps)
    labels = np.concatenate([np.asarray(b[2], np.float32).reshape(-1) for b in batches])

    begin = time.perf_counter()
    raw_logits = Evaluator(loaded.model, auc_thresholds=auc_thresholds).predict(batches)["logits"].astype(np.float64)
    logits = raw_logits + np.log(rate) if rate < 1.0 else raw_logits   # as served (serving.LoadedModel.served_logits)
    recipe_probabilities = 1.0 / (1.0 + np.exp(-logits))
    report: Dict[str, Any] = {
        "model_name": model_name, "checkpoint": loaded.path, "dataset_path": dataset_path, "split": mapping,
        "rows": int(labels.size), "tolerance": tolerance, "negative_downsampling_rate": rate,
        "recipe": dict(metrics(labels, logits, recipe_probabilities, auc_thresholds),
                       **click_metrics(labels, logits=logits), seconds=time.perf_counter() - begin),
        "served": {}}
    if rate < 1.0:
        report["recipe_uncorrected"] = click_metrics(labels, logits=raw_logits, negative_downsampling_rate=rate)
    requests = [serving.serving_inputs(b, loaded.hotness, loaded.num_numerical) for b in batches]
    passed = True
    for protocol, url in urls.items():
        begin = time.perf_counter()
        probabilities = served_probabilities(url, protocol, model_name, requests, timeout_s)
        if probabilities.size != labels.size:
            raise ValueError(f"{model_name} at {url}: {probabilities.size} probabilities for {labels.size} rows")
        entry = dict(metrics(labels, probabilities, probabilities, auc_thresholds),
                     **click_metrics(labels, probabilities=probabilities),
                     url=url, seconds=time.perf_counter() - begin)
        entry["auc_exact_difference"] = entry["auc_exact"] - report["recipe"]["auc_exact"]
        entry["auc_difference"] = entry["auc"] - report["recipe"]["auc"]
        for key in CLICK_METRICS + CORRECTED_CLICK_METRICS:   # reported; the pass/fail check stays the exact AUC
            if key in entry:
                entry[f"{key}_difference"] = entry[key] - report["recipe"][key]
        entry["max_abs_probability_difference"] = float(np.abs(probabilities - recipe_probabilities).max())
        entry["passed"] = abs(entry["auc_exact_difference"]) <= tolerance
        passed = passed and entry["passed"]
        report["served"][protocol] = entry
    report["passed"] = passed
    return report


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Parse ``argv``, evaluate, print and (``--output_json``) write the report; returns it."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    if not protocols or any(p not in PROTOCOLS for p in protocols):
        raise ValueError(f"--protocols {args.protocols!r}: expected a comma-separated list of grpc, http")
    if args.batch_size < 1 or (args.max_steps is not None and args.max_steps < 1) or not args.tolerance >= 0:
        raise ValueError("--batch_size and --max_steps must be at least 1 and --tolerance at least 0")
    check_json_output(args.output_json)
    urls = {p: args.server_url if p == "grpc" else args.http_url for p in protocols}
    report = evaluate_accuracy(args.dataset_path, args.checkpoint, args.model_name, urls,
                               dataset_type=args.dataset_type, feature_spec=args.feature_spec,
                               batch_size=args.batch_size, max_steps=args.max_steps, test_on_train=args.test_on_train,
                               auc_thresholds=args.auc_thresholds, tolerance=args.tolerance, timeout_s=args.timeout,
                               negative_downsampling_rate=args.negative_downsampling_rate)
    recipe = report["recipe"]
    print(f"recipe ({report['rows']} rows): exact AUC {recipe['auc_exact']:.6f}, AUC {recipe['auc']:.6f}, log loss "
          f"{recipe['log_loss']:.6f}, NE {recipe['normalized_entropy']:.6f}, calibration {recipe['calibration']:.6f}")
    for protocol, entry in report["served"].items():
        print(f"served {args.model_name} over {protocol}: exact AUC {entry['auc_exact']:.6f} (difference "
              f"{entry['auc_exact_difference']:+.2e}), AUC {entry['auc']:.6f}, log loss {entry['log_loss']:.6f} "
              f"({entry['log_loss_difference']:+.2e}), NE {entry['normalized_entropy']:.6f} "
              f"({entry['normalized_entropy_difference']:+.2e}), calibration {entry['calibration']:.6f} "
              f"({entry['calibration_difference']:+.2e}), max |probability difference| "
              f"{entry['max_abs_probability_difference']:.2e} -> {'ok' if entry['passed'] else 'ABOVE TOLERANCE'}")
    if args.output_json:
        write_json_output(args.output_json, report)
    return report


def cli(argv: Optional[Sequence[str]] = None) -> int:
    """Exit status 0 when within tolerance, 1 when not or on an error (printed as one line)."""

    def checked(argv: Optional[Sequence[str]]) -> Dict[str, Any]:
        report = main(argv)
        if not report["passed"]:
            raise CheckFailedError(f"the served AUC differs from the recipe's by more than --tolerance "
                                   f"{report['tolerance']}", report)
        return report
    return exit_status(checked, argv, failures=(ValueError, OSError, RuntimeError), with_type=True)


if __name__ == "__main__":
    sys.exit(cli())
