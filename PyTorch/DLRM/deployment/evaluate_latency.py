"""Latency and throughput of a served DLRM against batch size and concurrency (JSON + PNG).

    python -m deployment.evaluate_latency --server-url 127.0.0.1:8001 --protocol grpc --model-name dlrm-onnx \
        --model-repository /tmp/dlrm_triton --batch-sizes 1 64 4096 --concurrency 1 2 \
        --output-json /tmp/dlrm_latency.json --output-png /tmp/dlrm_latency.png

A thin wrapper over ``recsys_common.serving.latency`` (threads with one tritonclient each; p50/p90/p95/p99 and
samples/s per batch size and concurrency). Requests hold valid rows: with ``--dataset`` the first rows of its
``--mapping`` split (cycled, so a short split fills any batch), otherwise random rows drawn from the served model's
``recsys_serving.json`` in ``--model-repository`` (``recsys_common.serving.rows``: numericals standard normal, ids
uniform in each table).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from recsys_common.cli import run_main
from recsys_common.datasets import open_reader
from recsys_common.feature_spec import FeatureSpec
from recsys_common.serving.client import ServingError
from recsys_common.serving.latency import add_latency_arguments, perf_analyzer_options, run_latency
from recsys_common.serving.rows import cycling_rows, sidecar_row_maker

TOOL = "deployment.evaluate_latency"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {TOOL}", description=__doc__.split("\n\n")[0])
    add_latency_arguments(p, default_model_name="dlrm-onnx", default_batch_sizes=(1, 64, 4096),
                          default_concurrency=(1, 2))
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-repository", help="the deployer's repository (rows drawn from the sidecar)")
    source.add_argument("--dataset", help="dataset directory: requests hold its --mapping rows")
    p.add_argument("--feature_spec", default="feature_spec.yaml")
    p.add_argument("--mapping", default="test")
    return p


def dataset_inputs(dataset: str, feature_spec: str, mapping: str,
                   max_rows: int) -> Callable[[int], Dict[str, np.ndarray]]:
    """``make_inputs(batch)`` returning the next ``batch`` rows of the split's first ``max_rows`` (read once),
    cycling."""
    spec_path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset, feature_spec)
    reader = open_reader(FeatureSpec.from_yaml(spec_path), mapping, max_rows, channels=["numerical", "categorical"])
    if reader.num_batches_total == 0:
        raise ValueError(f"{spec_path}: mapping {mapping!r} has no rows")
    first = reader.read_batch(0)
    return cycling_rows({"numerical": np.ascontiguousarray(first["numerical"], np.float32),
                         "categorical": np.ascontiguousarray(first["categorical"], np.int64)})


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    """Measure and write the report; returns the records (see ``recsys_common.serving.latency``)."""
    args = build_parser().parse_args(argv)
    if args.model_repository:
        make_inputs = sidecar_row_maker(args.model_repository, args.model_name)
    else:
        make_inputs = dataset_inputs(args.dataset, args.feature_spec, args.mapping, max(args.batch_sizes))
    return run_latency(server_url=args.server_url, protocol=args.protocol, model_name=args.model_name,
                       batch_sizes=args.batch_sizes, concurrency=args.concurrency, num_requests=args.num_requests,
                       warmup_requests=args.warmup_requests, timeout_s=args.timeout,
                       output_json=args.output_json, output_png=args.output_png, make_inputs=make_inputs,
                       output_names=["probability"], **perf_analyzer_options(args))


if __name__ == "__main__":
    run_main(main, prog=TOOL, input_errors=(ServingError, ValueError, OSError))
