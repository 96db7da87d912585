"""``deployment/evaluate_latency.py`` (NVIDIA's ``triton/evaluate_latency.py`` runs it): throughput and p50/p90/p95/p99 latency of a served W&D (or MovieLens) model against
batch size and concurrency, as JSON and a PNG (``recsys_common.serving.latency``).

    python deployment/evaluate_latency.py --model-repository /tmp/wd_repo --model-name widedeep-onnx \\
        --server-url 127.0.0.1:8001 --protocol grpc --batch-sizes 1 64 1024 4096 --concurrency 1 2 \\
        --dataset_path /tmp/wide_deep_quickstart/data

Requests carry the model's inputs as its sidecar (``<repository>/<model>/recsys_serving.json``) describes them:
rows of the ``test`` mapping of ``--dataset_path`` (cycled to fill a batch), or, without it, random valid rows
(``recsys_common.serving.rows``: ids in each input's range, multi-hot lists padded after at least one id,
standard-normal numericals; seeded).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from recsys_common.cli import exit_status
from recsys_common.datasets import read_columns
from recsys_common.serving.client import ServingError
from recsys_common.serving.latency import add_latency_arguments, perf_analyzer_options, run_latency
from recsys_common.serving.repository import SidecarError, read_sidecar
from recsys_common.serving.rows import cycling_rows, random_row_maker
from wide_deep.data.loader import read_feature_spec
from wide_deep.serving import OUTPUT_NAME


def dataset_rows(entries: Mapping[str, dict], dataset_path: str, fspec_file: str) -> Callable[[int], Dict[str, np.ndarray]]:
    """``make_inputs(batch)`` taking the next ``batch`` rows of the ``test`` mapping (cycling, so a short mapping
    fills any batch)."""
    spec = read_feature_spec(dataset_path, fspec_file)
    columns = read_columns(spec, "test", list(entries))
    rows = {}
    for name, e in entries.items():
        a = np.asarray(columns[name])
        rows[name] = a.reshape([len(a)] + list(e["dims"])).astype(e["dtype"])
    return cycling_rows(rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triton/evaluate_latency.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_latency_arguments(p, default_model_name="widedeep-onnx")
    p.add_argument("--model-repository", required=True, help="the exported repository (for the model's sidecar)")
    p.add_argument("--dataset_path", default=None, help="send rows of this dataset's test mapping (default: random)")
    p.add_argument("--fspec_file", default="feature_spec.yaml", help="feature spec, relative to --dataset_path")
    p.add_argument("--seed", type=int, default=0, help="seed of the random rows")
    return p


def measure(argv: Optional[Sequence[str]] = None) -> List[Dict[str, object]]:
    """Measure and write the report; returns the records (``recsys_common.serving.latency.run_latency``)."""
    args = build_parser().parse_args(argv)
    entries = read_sidecar(os.path.join(args.model_repository, args.model_name))["inputs"]
    make_inputs = (dataset_rows(entries, args.dataset_path, args.fspec_file) if args.dataset_path
                   else random_row_maker(entries, args.seed))
    return run_latency(server_url=args.server_url, protocol=args.protocol, model_name=args.model_name,
                       batch_sizes=args.batch_sizes, concurrency=args.concurrency, num_requests=args.num_requests,
                       warmup_requests=args.warmup_requests, timeout_s=args.timeout, output_json=args.output_json,
                       output_png=args.output_png, make_inputs=make_inputs, output_names=[OUTPUT_NAME],
                       **perf_analyzer_options(args))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line's exit status (recsys_common.cli): 0, or 2 with one ``error:`` line (a missing sidecar, an
    unreachable server, a bad flag)."""
    return exit_status(measure, argv, prog="evaluate_latency.py",
                       input_errors=(SidecarError, ServingError, FileNotFoundError, ValueError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
