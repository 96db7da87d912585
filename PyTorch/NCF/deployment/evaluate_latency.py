"""Latency and throughput of the served NCF model against batch size and concurrency (JSON + PNG).

    python deployment/evaluate_latency.py --server-url 127.0.0.1:8001 --protocol grpc --model-name ncf-onnx \
        --data /tmp/ncf_quickstart/cache/synthetic --batch-sizes 1 64 1024 16384 --concurrency 1 2 \
        --output-json latency.json --output-png latency.png

A thin wrapper over ``recsys_common.serving.latency`` (threads, one tritonclient client each, p50/p90/p95/p99
latency and samples/s per (batch size, concurrency)). Requests hold real ``(user, item)`` rows: drawn at random
from the test mapping of ``--data`` (a user's candidates, as ``evaluate_accuracy`` sends them), or, without
``--data``, uniform ids below ``--n_users`` / ``--n_items``.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.dirname(HERE)
for _path in (HERE, RECIPE, os.path.join(os.path.dirname(os.path.dirname(RECIPE)), "common")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402

from neumf.serving import OUTPUT_NAME, sidecar  # noqa: E402
from neumf.data import DatasetError, load_dataset  # noqa: E402
from recsys_common.feature_spec import FeatureSpecError  # noqa: E402
from recsys_common.serving.client import ServingError  # noqa: E402
from recsys_common.cli import run_main  # noqa: E402
from recsys_common.serving import latency  # noqa: E402
from recsys_common.serving.rows import random_row_maker  # noqa: E402


def input_maker(data_dir: Optional[str], n_users: Optional[int], n_items: Optional[int],
                seed: int = 0) -> Callable[[int], Dict[str, np.ndarray]]:
    """``make_inputs(batch_size) -> {"user": int64 [B, 1], "item": int64 [B, 1]}`` from the dataset's test rows, or
    uniform ids below ``n_users`` / ``n_items``."""
    rng = np.random.default_rng(seed)
    if data_dir:
        data = load_dataset(data_dir)
        users, items = data.test_users, data.test_items

        def make_inputs(batch_size: int) -> Dict[str, np.ndarray]:
            rows = rng.integers(0, len(users), size=batch_size)
            return {"user": users[rows].reshape(-1, 1), "item": items[rows].reshape(-1, 1)}
        return make_inputs
    if not n_users or not n_items:
        raise ValueError("give --data, or --n_users and --n_items")
    # the served model's inputs as its sidecar describes them (ids below --n_users / --n_items)
    return random_row_maker(sidecar({"num_users": n_users, "num_items": n_items}, None)["inputs"], seed)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Latency/throughput of the served NCF model")
    latency.add_latency_arguments(p, default_model_name="ncf-onnx", default_batch_sizes=(1, 64, 1024, 16384))
    p.add_argument("--data", default=None, help="dataset directory: requests hold its test rows")
    p.add_argument("--n_users", type=int, default=None, help="without --data: user ids drawn below this")
    p.add_argument("--n_items", type=int, default=None, help="without --data: item ids drawn below this")
    return p


def main(argv: Optional[List[str]] = None) -> List[dict]:
    """Measure and write the report; returns ``recsys_common.serving.latency``'s records (one per batch size and
    concurrency). Raises :func:`input_errors`' classes for bad input or an unreachable server."""
    args = build_parser().parse_args(argv)
    make_inputs = input_maker(args.data, args.n_users, args.n_items)
    return latency.run_latency(server_url=args.server_url, protocol=args.protocol, model_name=args.model_name,
                               batch_sizes=args.batch_sizes, concurrency=args.concurrency,
                               num_requests=args.num_requests, warmup_requests=args.warmup_requests,
                               timeout_s=args.timeout, output_json=args.output_json, output_png=args.output_png,
                               make_inputs=make_inputs, output_names=[OUTPUT_NAME],
                               **latency.perf_analyzer_options(args))


def input_errors():
    """The errors the command line reports in one line with exit status 2."""
    return (ValueError, ServingError, DatasetError, FeatureSpecError, FileExistsError)


if __name__ == "__main__":
    run_main(main, prog="evaluate_latency.py", input_errors=input_errors())
