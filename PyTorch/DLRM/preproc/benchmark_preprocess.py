#!/usr/bin/env python3
"""Throughput of the Criteo preprocessing on generated raw rows (no download needed).

Writes ``--rows`` rows in Criteo's raw TSV layout (power-law categorical values as 8-digit hex strings, count-like
integers, ~10 % missing fields, a few rows with trailing fields stripped) as a Kaggle ``train.txt``, runs the Spark
job and the split-binary conversion, and prints one JSON line with seconds and rows/s per step.

    python preproc/benchmark_preprocess.py --rows 1000000 --work_dir /tmp/criteo_bench

``main(argv)`` returns the result dict. The figures include Spark's start-up; on small inputs that dominates.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Optional, Sequence

import numpy as np


def write_raw(path: str, rows: int, seed: int, block: int = 100_000) -> None:
    rng = np.random.default_rng(seed)
    vocab = [rng.integers(1, 10 ** (2 + i % 6), dtype=np.int64) + 1 for i in range(26)]  # per-column value ranges
    with open(path, "w", encoding="ascii") as f:
        for start in range(0, rows, block):
            n = min(block, rows - start)
            labels = (rng.random(n) < 0.25).astype(int)
            ints = np.floor(rng.pareto(1.5, (n, 13)) * 3).astype(np.int64)
            ints_missing = rng.random((n, 13)) < 0.1
            cats = np.stack([np.minimum(rng.zipf(1.3, n), vocab[c]) for c in range(26)], axis=1)
            cats_missing = rng.random((n, 26)) < 0.1
            lines = []
            for r in range(n):
                fields = [str(labels[r])]
                fields += ["" if ints_missing[r, c] else str(ints[r, c]) for c in range(13)]
                fields += ["" if cats_missing[r, c] else f"{(cats[r, c] * 2654435761) & 0xFFFFFFFF:08x}"
                           for c in range(26)]
                line = "\t".join(fields)
                lines.append(line.rstrip("\t") if r % 50 == 0 else line)   # some copies strip trailing tabs
            f.write("\n".join(lines) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="generated raw rows")
    parser.add_argument("--work_dir", default=None,
                        help="scratch directory (default: a temporary one, removed); when reused, only the "
                             "benchmark's own earlier outputs in in/, spark/ and binary/ are replaced")
    parser.add_argument("--frequency_limit", type=int, default=3, help="as spark_preprocess")
    parser.add_argument("--master", default="local[*]", help="Spark master")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated rows")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> dict:
    from recsys_common.criteo import spark_preprocess, to_split_binary

    args = build_parser().parse_args(argv)
    from recsys_common.io import atomic_directory
    work = args.work_dir or tempfile.mkdtemp(prefix="criteo_bench_")
    raw = os.path.join(work, "in", "train.txt")
    started = time.perf_counter()
    # A --work_dir may be reused: the benchmark replaces its own generated input, never a train.txt it did not write.
    with atomic_directory(os.path.join(work, "in"), overwrite=True, tool="dlrm.preproc.benchmark_preprocess") as tmp:
        write_raw(os.path.join(tmp, "train.txt"), args.rows, args.seed)
    generate_s = time.perf_counter() - started
    result = {"rows": args.rows, "raw_bytes": os.path.getsize(raw), "generate_s": round(generate_s, 1)}
    try:
        started = time.perf_counter()
        spark_preprocess.main(["--input_path", os.path.join(work, "in"), "--output_path", os.path.join(work, "spark"),
                               "--frequency_limit", str(args.frequency_limit), "--master", args.master, "--overwrite"])
        spark_s = time.perf_counter() - started
        started = time.perf_counter()
        to_split_binary.main(["--input", os.path.join(work, "spark"), "--output", os.path.join(work, "binary"),
                              "--overwrite"])
        convert_s = time.perf_counter() - started
        result.update({"spark_s": round(spark_s, 1), "spark_rows_per_s": round(args.rows / spark_s),
                       "convert_s": round(convert_s, 1), "convert_rows_per_s": round(args.rows / convert_s),
                       "cores": os.cpu_count(), "master": args.master})
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
