"""Exact AUC of a served DLRM over a dataset split, through the server (HTTP and/or gRPC), against PyTorch's own.

    python -m deployment.evaluate_accuracy --http-url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 \
        --model-name dlrm-onnx --dataset /tmp/dlrm_quickstart/data \
        --model_checkpoint /tmp/dlrm_quickstart/checkpoint --output_json /tmp/dlrm_accuracy.json

Reads mapping ``--mapping`` (default ``test``) of the dataset's FeatureSpec in batches of ``--batch_size`` rows, sends
each batch to the server with tritonclient (``recsys_common.serving.client``: a Triton server; here the CPU
repository on ``recsys_common.serving.triton_server``), and scores the same batch with the checkpoint's eager PyTorch
model (float32, the recipe's model code: the framework's own evaluation).
Exact ROC AUC (``recsys_common.metrics``) and the click-model metrics
``log_loss``, ``normalized_entropy`` and ``calibration`` (summed batch by batch, ``dlrm.utils.metrics.ClickMetrics``)
of both over all rows, their differences and the largest probability difference per protocol are printed as JSON
(and written atomically to ``--output_json``). A model deployed from negatively down-sampled data serves
``sigmoid(logit + log w)``; PyTorch's side gets the same correction (``--negative_downsampling_rate``, default the
FeatureSpec's recorded rate, as the deployer's default), and ``framework_uncorrected`` adds the uncorrected model's
metrics with their ``*_corrected`` forms. Exits 1 when an AUC differs from PyTorch's by more than ``--tolerance``
(default 1e-4; measured: ~1e-7 in probability and 5e-7 in AUC on 2,048 rows, where one flipped pair moves the AUC
by ~1e-6), 2 on bad input or an unreachable server (every request has a ``--timeout``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from dlrm import serving
from dlrm.checkpointing import CheckpointError
from dlrm.utils.metrics import ClickMetrics
from recsys_common.cli import CheckFailedError, InputError, exit_status
from recsys_common.datasets import DatasetError, open_reader
from recsys_common.feature_spec import FeatureSpec, FeatureSpecError, negative_downsampling_rate as recorded_rate
from recsys_common.flags import add_flag  # --server-url and --server_url alike
from recsys_common.io import check_json_output, write_json_output
from recsys_common.metrics import roc_auc_score
from recsys_common.serving import client as serving_client
from recsys_common.serving.client import ServingError

TOOL = "deployment.evaluate_accuracy"


class EvaluationError(InputError):
    """Flags or data that cannot be evaluated; the message names the flag or file."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {TOOL}", description=__doc__.split("\n\n")[0])
    add_flag(p, "--http-url", default=None, help="HTTP endpoint host:port (Triton's default port 8000)")
    add_flag(p, "--grpc-url", "--server-url", default=None,
             help="gRPC endpoint host:port (Triton's default port 8001)")
    add_flag(p, "--model-name", default="dlrm-onnx", help="served model (deployer: <name>-onnx / <name>-ts)")
    p.add_argument("--dataset", required=True, help="dataset directory with its FeatureSpec")
    p.add_argument("--feature_spec", default="feature_spec.yaml", help="FeatureSpec file name in --dataset")
    p.add_argument("--mapping", default="test", help="split to evaluate")
    p.add_argument("--model_checkpoint", "--load_checkpoint_path", dest="model_checkpoint", required=True,
                   help="the checkpoint the served model was deployed from (PyTorch's own evaluation)")
    p.add_argument("--negative_downsampling_rate", type=float, default=None,
                   help="the rate w the served model was deployed with (its recsys_serving.json): PyTorch's side "
                        "gets the same sigmoid(logit + log w). Default: the rate recorded in the dataset's "
                        "FeatureSpec, as the deployer's default (1.0: no correction)")
    p.add_argument("--batch_size", type=int, default=4096, help="rows per request")
    p.add_argument("--max_rows", type=int, default=None, help="evaluate only the first this many rows")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest accepted |AUC served - AUC PyTorch|")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request (and to wait for the model)")
    p.add_argument("--output_json", default=None, help="also write the result here (atomically)")
    return p


def evaluate(urls: Dict[str, str], model_name: str, dataset: str, model_checkpoint: str,
             feature_spec: str = "feature_spec.yaml", mapping: str = "test", batch_size: int = 4096,
             max_rows: Optional[int] = None, timeout_s: float = 60.0,
             negative_downsampling_rate: Optional[float] = None) -> Dict[str, Any]:
    """``urls``: protocol (``"http"`` / ``"grpc"``) -> ``host:port``. Returns the result dict (see the module
    docstring); raises ``ServingError`` naming the url when a server is unreachable or refuses a request.
    ``negative_downsampling_rate``: the served model's ``w`` (``None``: the FeatureSpec's recorded rate)."""
    if not urls:
        raise EvaluationError("give --http-url and/or --grpc-url")
    if batch_size < 1:
        raise EvaluationError(f"--batch_size must be >= 1, got {batch_size}")
    if max_rows is not None and max_rows < 1:
        raise EvaluationError(f"--max_rows must be >= 1, got {max_rows}")
    spec, spec_path, rate = _checked_spec(dataset, feature_spec, mapping, negative_downsampling_rate)
    model, config, path = serving.load_model(
        model_checkpoint, num_numerical_features=len(spec.channel_spec["numerical"]),
        table_sizes=[spec.cardinality(f) for f in spec.channel_spec["categorical"]],
        table_source=f"{spec_path} (cardinality)")
    reader = open_reader(spec, mapping, batch_size, channels=["numerical", "categorical", "label"])
    clients = {protocol: serving_client.InferenceClient(url, protocol=protocol, timeout_s=timeout_s)
               for protocol, url in urls.items()}
    try:
        for client in clients.values():
            client.wait_until_ready(model_name, timeout_s)
        scores = _Scores(model, rate, clients, model_name)
        for index in range(reader.num_batches_total):
            if max_rows is not None and scores.rows >= max_rows:
                break
            scores.add(reader.read_batch(index), max_rows)
    finally:
        for client in clients.values():
            client.close()
    if scores.rows == 0:
        raise EvaluationError(f"{spec_path}: mapping {mapping!r} has no rows")
    return {"model_name": model_name, "rows": scores.rows, "checkpoint": path, "dataset": dataset,
            "mapping": mapping, "negative_downsampling_rate": rate, **scores.result(urls)}


def _checked_spec(dataset: str, feature_spec: str, mapping: str, negative_downsampling_rate: Optional[float]):
    """``(FeatureSpec, its path, the rate w of the served model)``, the spec checked for the channels and mapping."""
    spec_path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset, feature_spec)
    if negative_downsampling_rate is not None:
        rate = serving.check_negative_downsampling_rate(negative_downsampling_rate)
    spec = FeatureSpec.from_yaml(spec_path)
    if negative_downsampling_rate is None:
        rate = recorded_rate(spec)
    for channel in ("numerical", "categorical", "label"):
        if channel not in spec.channel_spec:
            raise EvaluationError(f"{spec_path}: no {channel!r} channel (has {sorted(spec.channel_spec)})")
    if mapping not in spec.source_spec:
        raise EvaluationError(f"{spec_path}: no mapping {mapping!r} (has {sorted(spec.source_spec)})")
    return spec, spec_path, rate


class _Scores:
    """The probabilities of PyTorch (the framework) and of each protocol's server, batch by batch, with their click
    metrics; :meth:`result` compares them."""

    def __init__(self, model, rate: float, clients: Dict[str, Any], model_name: str):
        # the served model's probabilities: sigmoid(logit + log w) when deployed from down-sampled data (w < 1)
        self.module = serving.serving_module(model, rate)
        self.uncorrected = serving.serving_module(model) if rate < 1.0 else None
        self.rate, self.clients, self.model_name = rate, clients, model_name
        self.served: Dict[str, List[np.ndarray]] = {protocol: [] for protocol in clients}
        self.seconds = {protocol: 0.0 for protocol in clients}
        self.framework: List[np.ndarray] = []
        self.labels: List[np.ndarray] = []
        self.click = {name: ClickMetrics() for name in ("framework", *clients)}
        if rate < 1.0:   # the uncorrected model's metrics, next to the corrected ones (ClickMetrics' *_corrected)
            self.click["framework_uncorrected"] = ClickMetrics(negative_downsampling_rate=rate)
        self.rows = 0

    def add(self, batch: Dict[str, np.ndarray], max_rows: Optional[int]) -> None:
        keep = len(batch["label"]) if max_rows is None else min(len(batch["label"]), max_rows - self.rows)
        inputs = {serving.NUMERICAL: np.ascontiguousarray(batch["numerical"][:keep], np.float32),
                  serving.CATEGORICAL: np.ascontiguousarray(batch["categorical"][:keep], np.int64)}
        numerical, categorical = inputs[serving.NUMERICAL], inputs[serving.CATEGORICAL]
        self.framework.append(serving.predict_probabilities(self.module, numerical, categorical))
        self.labels.append(np.asarray(batch["label"][:keep], np.float64).reshape(-1))
        self.click["framework"].add(self.labels[-1], probabilities=self.framework[-1])
        if self.uncorrected is not None:
            self.click["framework_uncorrected"].add(self.labels[-1], probabilities=serving.predict_probabilities(
                self.uncorrected, numerical, categorical))
        for protocol, client in self.clients.items():
            begin = time.perf_counter()
            out = client.infer(self.model_name, inputs, [serving.OUTPUT_NAME])[serving.OUTPUT_NAME]
            self.seconds[protocol] += time.perf_counter() - begin
            self.served[protocol].append(np.asarray(out, np.float32).reshape(-1))
            self.click[protocol].add(self.labels[-1], probabilities=self.served[protocol][-1])
        self.rows += keep

    def result(self, urls: Dict[str, str]) -> Dict[str, Any]:
        """The framework's AUC and metrics, and per protocol the same with their differences from the framework's."""
        y = np.concatenate(self.labels)
        reference = np.concatenate(self.framework).astype(np.float64)
        result: Dict[str, Any] = {"framework": {"auc": roc_auc_score(y, reference),
                                                **self.click["framework"].metrics(),
                                                "engine": "PyTorch eager float32"}}
        if self.rate < 1.0:   # the down-sampled model's own metrics and their corrected forms (equal to the served)
            result["framework_uncorrected"] = self.click["framework_uncorrected"].metrics()
        for protocol, parts in self.served.items():
            got = np.concatenate(parts).astype(np.float64)
            auc = roc_auc_score(y, got)
            result[protocol] = {"url": urls[protocol], "auc": auc,
                                "auc_difference": abs(auc - result["framework"]["auc"]),
                                **self.click[protocol].metrics()}
            for name in ("log_loss", "normalized_entropy", "calibration"):
                result[protocol][f"{name}_difference"] = abs(result[protocol][name] - result["framework"][name])
            result[protocol]["max_abs_probability_difference"] = float(np.abs(got - reference).max())
            result[protocol]["seconds_in_requests"] = self.seconds[protocol]
        return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI; returns 0 (within tolerance), 1 (an AUC outside it), 2 (bad input, unreachable server)."""
    def compare(argv) -> Dict[str, Any]:
        args = build_parser().parse_args(argv)
        urls = {p: u for p, u in (("http", args.http_url), ("grpc", args.grpc_url)) if u}
        check_json_output(args.output_json)
        result = evaluate(urls, args.model_name, args.dataset, args.model_checkpoint, args.feature_spec,
                          args.mapping, args.batch_size, args.max_rows, args.timeout,
                          args.negative_downsampling_rate)
        result["tolerance"] = args.tolerance
        result["passed"] = all(result[p]["auc_difference"] <= args.tolerance for p in urls)
        if args.output_json:
            write_json_output(args.output_json, result)
        print(json.dumps(result, indent=1))
        if not result["passed"]:
            raise CheckFailedError(f"AUC through the server differs from PyTorch's by more than --tolerance "
                                   f"{args.tolerance}", result)
        return result
    return exit_status(compare, argv, prog=TOOL, input_errors=(EvaluationError, ServingError, CheckpointError,
                                                                DatasetError, FeatureSpecError, ValueError, OSError))


if __name__ == "__main__":
    sys.exit(main())
