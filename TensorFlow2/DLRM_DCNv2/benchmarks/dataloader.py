"""Input pipeline throughput: ``python benchmarks/dataloader.py`` prints samples/s as JSON.

Iterates the batches one rank would get (tf tensors, as training sees them) without a model, so the figure is the
ceiling the input puts on training. ``--world_size N --rank r`` simulates rank ``r`` of ``N`` with table-wise
placement (``--dist_strategy basic``): it reads its own tables for the whole global batch and its slice of the rest.
The first ``--warmup_batches`` (TensorFlow's first ops, page cache) are not timed.

    python benchmarks/dataloader.py --dataset_type tf_raw --dataset_path /data/dlrm \\
        --batch_size 65536 --max_batches 200
"""
from __future__ import annotations

import argparse
import time
from typing import Iterable, Optional

from dlrm_dcnv2.data.dataloader import DATASET_TYPES, create_input, load_spec
from dlrm_dcnv2.data.transcribe import add_synthetic_flags, synthetic_options
from dlrm_dcnv2.distributed.placement import plan_placement
from recsys_common.cli import run_main
from recsys_common.io import check_json_output, report_json
from recsys_common.machine import cpu_model_name as cpu_model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/dataloader.py",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset_type", choices=DATASET_TYPES, default="tf_raw")
    p.add_argument("--dataset_path", default=None)
    p.add_argument("--feature_spec", default="feature_spec.yaml")
    p.add_argument("--mapping", default="train", help="split to read (train / test)")
    p.add_argument("--batch_size", type=int, default=65536, help="global batch size")
    p.add_argument("--max_batches", type=int, default=-1, help="timed batches (-1: the whole split)")
    p.add_argument("--warmup_batches", type=int, default=2)
    p.add_argument("--world_size", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--prefetch", type=int, default=2, help="batches prepared ahead in a background thread")
    add_synthetic_flags(p)
    p.add_argument("--output_json", default=None, help="also write the result here (atomically)")
    return p


def main(argv: Optional[Iterable[str]] = None) -> dict:
    args = build_parser().parse_args(None if argv is None else list(argv))
    check_json_output(args.output_json)
    kw = synthetic_options(args)
    if args.dataset_type != "synthetic" or args.synthetic_dataset_use_feature_spec:
        kw["spec"] = load_spec(args.dataset_path, args.feature_spec, "--feature_spec")  # parsed once
    input_tables = None
    if args.world_size > 1:
        probe = create_input(args.dataset_type, args.dataset_path, args.feature_spec, mapping=args.mapping,
                             global_batch_size=args.batch_size, **kw)
        placement = plan_placement(probe.metadata.table_sizes, 1, args.world_size, strategy="basic")
        input_tables = placement.input_tables(args.rank)
    data = create_input(args.dataset_type, args.dataset_path, args.feature_spec, mapping=args.mapping,
                        global_batch_size=args.batch_size, rank=args.rank, world_size=args.world_size,
                        input_tables=input_tables, prefetch=args.prefetch, **kw)
    total = len(data) if args.max_batches < 0 else min(len(data), args.max_batches + args.warmup_batches)
    batches = samples = 0
    it = data.iterate(0)
    warm = max(0, min(args.warmup_batches, total - 1))
    for _ in range(warm):
        next(it)
    start = time.perf_counter()
    for _, (_, _, labels) in zip(range(total - warm), it):
        batches += 1
        samples += int(labels.shape[0])
    elapsed = time.perf_counter() - start
    result = {"dataset_type": args.dataset_type, "mapping": args.mapping, "global_batch_size": args.batch_size,
              "rank": args.rank, "world_size": args.world_size, "prefetch": args.prefetch,
              "batches": batches, "local_samples": samples, "seconds": round(elapsed, 4),
              "local_samples_per_s": round(samples / max(elapsed, 1e-9), 1),
              "global_samples_per_s": round(samples * args.world_size / max(elapsed, 1e-9), 1),
              "cpu": cpu_model()}
    return report_json(result, args.output_json)


if __name__ == "__main__":
    run_main(main, input_errors=(ValueError, FileExistsError), failures=(OSError,))   # DataError is a ValueError
