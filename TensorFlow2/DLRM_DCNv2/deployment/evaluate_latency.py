"""Throughput and p50/p90/p95/p99 latency of a deployed model against batch size and concurrency (JSON + PNG).

    python -m deployment.evaluate_latency --model-name dlrm-onnx --server-url 127.0.0.1:8001 \\
        --dataset_path DIR --batch-sizes 1 64 1024 8192 --concurrency 1 2 --output-json lat.json --output-png lat.png

A thin wrapper over ``recsys_common.serving.latency`` (flags ``--server-url --protocol --model-name --batch-sizes
--concurrency --num-requests --warmup-requests --timeout --output-json --output-png``, as the seed's
``evaluate_latency.py``). Requests are real rows: the first ``max(--batch-sizes)`` rows of the test split of
``--dataset_path`` (``--feature_spec``; any split-binary / CSV / parquet spec), each request the next rows,
cycling; or, with ``--model-repository-path`` instead, random valid rows drawn from the model's
``recsys_serving.json`` (ids uniform in each table, N(0, 1) numericals).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from dlrm_dcnv2.serving import PROBABILITY, rows_from_dataset
from recsys_common.cli import exit_status
from recsys_common.serving.latency import add_latency_arguments, perf_analyzer_options, run_latency
from recsys_common.serving.repository import read_sidecar
from recsys_common.serving.rows import cycling_rows, random_rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m deployment.evaluate_latency", description=__doc__.split("\n\n")[0])
    add_latency_arguments(p, default_batch_sizes=(1, 64, 1024, 8192), default_concurrency=(1, 2))
    p.add_argument("--dataset_path", default=None, help="rows of this dataset's test split make the requests")
    p.add_argument("--feature_spec", default="feature_spec.yaml", help="feature spec, relative to --dataset_path")
    p.add_argument("--model-repository-path", default=None,
                   help="instead of --dataset_path: random rows from <repo>/<model>/recsys_serving.json")
    return p


def main(argv: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    """Parse ``argv``, measure, write the report; returns the records (one per batch size x concurrency)."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    if bool(args.dataset_path) == bool(args.model_repository_path):
        raise ValueError("give exactly one of --dataset_path (real rows) and --model-repository-path (random rows)")
    if min(args.batch_sizes) < 1 or min(args.concurrency) < 1:
        raise ValueError("--batch-sizes and --concurrency must be at least 1")
    largest = max(args.batch_sizes)
    if args.dataset_path:
        pool = rows_from_dataset(args.dataset_path, args.feature_spec, largest)
    else:
        pool = random_rows(read_sidecar(os.path.join(args.model_repository_path, args.model_name))["inputs"], largest)
    return run_latency(server_url=args.server_url, protocol=args.protocol, model_name=args.model_name,
                       batch_sizes=args.batch_sizes, concurrency=args.concurrency, num_requests=args.num_requests,
                       warmup_requests=args.warmup_requests, timeout_s=args.timeout, output_json=args.output_json,
                       output_png=args.output_png, make_inputs=cycling_rows(pool), output_names=[PROBABILITY],
                       **perf_analyzer_options(args))


def cli(argv: Optional[Sequence[str]] = None) -> int:
    return exit_status(main, argv, failures=(ValueError, OSError, RuntimeError), with_type=True)


if __name__ == "__main__":
    sys.exit(cli())
