"""Latency and throughput of a served DLRM against batch size and concurrency (JSON + PNG).

    python -m deployment.evaluate_latency --server-url 127.0.0.1:8001 --protocol grpc --model-name dlrm-onnx \
        --model-repository /tmp/dlrm_triton --batch-sizes 1 64 4096 --concurrency 1 2 \
        --output-json /tmp/dlrm_latency.json --output-png /tmp/dlrm_latency.png

A thin wrapper over ``recsys_common.serving.latency`` (threads with one tritonclient each; p50/p90/p95/p99 and
samples/s per batch size and concurrency). Requests hold valid rows: with ``--dataset`` the first rows of its
``--mapping`` split (repeated when the split is shorter than a batch), otherwise random rows drawn from the served
model's ``recsys_serving.json`` in ``--model-repository`` (numericals standard normal, ids uniform in each table).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

TOOL = "deployment.evaluate_latency"


def build_parser() -> argparse.ArgumentParser:
    from recsys_common.serving.latency import add_latency_arguments
    p = argparse.ArgumentParser(prog=f"python -m {TOOL}", description=__doc__.split("\n\n")[0])
    add_latency_arguments(p, default_model_name="dlrm-onnx", default_batch_sizes=(1, 64, 4096),
                          default_concurrency=(1, 2))
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-repository", help="the deployer's repository (rows drawn from the sidecar)")
    source.add_argument("--dataset", help="dataset directory: requests hold its --mapping rows")
    p.add_argument("--feature_spec", default="feature_spec.yaml")
    p.add_argument("--mapping", default="test")
    return p


def sidecar_inputs(model_repository: str, model_name: str) -> Callable[[int], Dict[str, np.ndarray]]:
    """``make_inputs(batch)`` drawing random valid rows from the model's sidecar (dims and id bounds)."""
    from recsys_common.serving.repository import read_sidecar
    inputs = read_sidecar(os.path.join(model_repository, model_name))["inputs"]
    numerical_width = int(inputs["numerical"]["dims"][-1])
    bounds = inputs["categorical"].get("max_id")
    if bounds is None:  # --hash_indices: any id is valid; draw from a large range
        bounds = [1 << 20] * int(inputs["categorical"]["dims"][-1])
    rng = np.random.default_rng(0)

    def make_inputs(batch: int) -> Dict[str, np.ndarray]:
        return {"numerical": rng.standard_normal((batch, numerical_width)).astype(np.float32),
                "categorical": np.stack([rng.integers(0, b, size=batch, dtype=np.int64) for b in bounds], axis=1)}
    return make_inputs


def dataset_inputs(dataset: str, feature_spec: str, mapping: str,
                   max_rows: int) -> Callable[[int], Dict[str, np.ndarray]]:
    """``make_inputs(batch)`` returning the first ``batch`` rows of the split (read once, up to ``max_rows``)."""
    from recsys_common.datasets import open_reader
    from recsys_common.feature_spec import FeatureSpec
    spec_path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset, feature_spec)
    reader = open_reader(FeatureSpec.from_yaml(spec_path), mapping, max_rows, channels=["numerical", "categorical"])
    if reader.num_batches_total == 0:
        raise ValueError(f"{spec_path}: mapping {mapping!r} has no rows")
    first = reader.read_batch(0)
    numerical = np.ascontiguousarray(first["numerical"], np.float32)
    categorical = np.ascontiguousarray(first["categorical"], np.int64)

    def make_inputs(batch: int) -> Dict[str, np.ndarray]:
        index = np.arange(batch) % len(numerical)
        return {"numerical": numerical[index], "categorical": categorical[index]}
    return make_inputs


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    """Measure and write the report; returns the records (see ``recsys_common.serving.latency``)."""
    from recsys_common.serving.latency import perf_analyzer_options, run_latency
    args = build_parser().parse_args(argv)
    if args.model_repository:
        make_inputs = sidecar_inputs(args.model_repository, args.model_name)
    else:
        make_inputs = dataset_inputs(args.dataset, args.feature_spec, args.mapping, max(args.batch_sizes))
    return run_latency(server_url=args.server_url, protocol=args.protocol, model_name=args.model_name,
                       batch_sizes=args.batch_sizes, concurrency=args.concurrency, num_requests=args.num_requests,
                       warmup_requests=args.warmup_requests, timeout_s=args.timeout,
                       output_json=args.output_json, output_png=args.output_png, make_inputs=make_inputs,
                       output_names=["probability"], **perf_analyzer_options(args))


if __name__ == "__main__":
    from recsys_common.cli import run_main
    from recsys_common.serving.client import ServingError
    run_main(main, prog=TOOL, input_errors=(ServingError, ValueError, OSError))
