"""Served predictions: send a user's rows (a FeatureSpec mapping) to a Triton / KServe-v2 server, write probabilities.

    python -m deployment.client --server-url 127.0.0.1:8001 --protocol grpc --model-name dlrm-onnx \
        --dataset /tmp/dlrm_quickstart/data --mapping test --output /tmp/dlrm_served.csv

NVIDIA's ``triton/client.py`` sends a dataset to the server; this one does the same with
``recsys_common.serving.client`` (tritonclient, a timeout on every call) and writes what it gets back exactly as
``python -m dlrm.scripts.predict`` writes the offline predictions (``.csv`` with a header ``probability``, or
``.npy``; atomically; ``--overwrite`` to replace), so the two files can be compared. The server checks each request
(shapes, dtypes, id ranges) and its error, naming the input, stops the run before anything is written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, Optional, Sequence

import numpy as np

from dlrm.scripts.predict import PredictError, check_output
from recsys_common.cli import exit_status
from recsys_common.datasets import DatasetError, open_reader
from recsys_common.feature_spec import FeatureSpec, FeatureSpecError
from recsys_common.flags import add_flag  # --server-url and --server_url alike
from recsys_common.io import write_predictions
from recsys_common.serving.client import InferenceClient, ServingError

TOOL = "deployment.client"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {TOOL}", description=__doc__.split("\n\n")[0])
    add_flag(p, "--server-url", required=True, help="host:port (Triton: 8000 HTTP, 8001 gRPC)")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    add_flag(p, "--model-name", default="dlrm-onnx")
    p.add_argument("--dataset", required=True, help="directory of the FeatureSpec describing the rows")
    p.add_argument("--feature_spec", default="feature_spec.yaml")
    p.add_argument("--mapping", default="test")
    p.add_argument("--output", required=True, help=".csv (header 'probability') or .npy")
    p.add_argument("--batch_size", type=int, default=4096, help="rows per request")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    return p


def served_predictions(server_url: str, protocol: str, model_name: str, dataset: str, output: str,
                       feature_spec: str = "feature_spec.yaml", mapping: str = "test", batch_size: int = 4096,
                       timeout_s: float = 60.0, overwrite: bool = False) -> Dict[str, Any]:
    """Score mapping ``mapping`` through the server, write ``output``; returns a summary. Raises ``ServingError``
    (unreachable server, a refused request), ``PredictError`` / FeatureSpec / dataset errors on bad input."""

    check_output(output, overwrite, batch_size)   # the rules of dlrm.scripts.predict, before any request
    spec_path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset, feature_spec)
    spec = FeatureSpec.from_yaml(spec_path)
    if mapping not in spec.source_spec:
        raise PredictError(f"{spec_path}: no mapping {mapping!r} (has {sorted(spec.source_spec)})")
    reader = open_reader(spec, mapping, batch_size, channels=["numerical", "categorical"])
    parts = []
    with InferenceClient(server_url, protocol, timeout_s=timeout_s) as client:
        client.wait_until_ready(model_name, timeout_s)
        for index in range(reader.num_batches_total):
            batch = reader.read_batch(index)
            inputs = {"numerical": np.ascontiguousarray(batch["numerical"], np.float32),
                      "categorical": np.ascontiguousarray(batch["categorical"], np.int64)}
            parts.append(client.infer(model_name, inputs, ["probability"])["probability"].reshape(-1))
    probabilities = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    write_predictions(output, probabilities)
    return {"rows": int(len(probabilities)), "output": os.path.abspath(output), "server": server_url,
            "protocol": protocol, "model_name": model_name}


def main(argv: Optional[Sequence[str]] = None) -> int:

    def predictions(argv):
        args = build_parser().parse_args(argv)
        return served_predictions(args.server_url, args.protocol, args.model_name, args.dataset, args.output,
                                  args.feature_spec, args.mapping, args.batch_size, args.timeout, args.overwrite)
    return exit_status(predictions, argv, prog=TOOL, report=lambda summary: print(json.dumps(summary, indent=1)),
                       input_errors=(ServingError, DatasetError, FeatureSpecError, ValueError, OSError))


if __name__ == "__main__":
    sys.exit(main())
