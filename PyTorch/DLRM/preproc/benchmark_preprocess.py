#!/usr/bin/env python3
"""Throughput and peak memory of the Criteo preprocessing on generated raw rows (no download needed).

Writes ``--rows`` rows in Criteo's raw TSV layout (power-law categorical values as 8-digit hex strings, count-like
integers, ~10 % missing fields, a few rows with trailing fields stripped) as a Kaggle ``train.txt``, or with
``--days N`` as Terabyte day files ``day_0 .. day_<N-1>`` (the rows split evenly; the last day is the test day), runs
the Spark job and the split-binary conversion, and prints one JSON line with seconds, rows/s and peak memory per step.

    python preproc/benchmark_preprocess.py --rows 1000000 --work_dir /tmp/criteo_bench
    python preproc/benchmark_preprocess.py --rows 2000000 --days 2 --master 'local[2]'

Peak memory is the largest sum of the resident set sizes (RSS) of this process and all its descendants, sampled
every ``--memory_interval`` seconds with psutil while each step runs: the Python driver and the JVM it starts, which
with a ``local[...]`` master also runs the executors (with a cluster master the executors live on the workers and
are not counted). Shared pages are counted once per process, so the sum is an upper bound.

``main(argv)`` returns the result dict. The figures include Spark's start-up; on small inputs that dominates.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Dict, Optional, Sequence

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


class PeakTreeRSS:
    """Samples the summed RSS of this process and its descendants on a thread while used as a context manager.

    ``peak_bytes`` is the largest sum seen, ``peak_by_name`` the largest RSS per process name (e.g. ``python3``,
    ``java``), ``samples`` how many samples were taken (at least one, taken on entry and on exit).
    """

    def __init__(self, interval_s: float = 0.2):
        import psutil
        self._psutil = psutil
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.peak_by_name: Dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peak-rss-sampler", daemon=True)

    def sample(self) -> int:
        """One sample: the summed RSS now (processes that end while being read are skipped)."""
        root = self._psutil.Process()
        total, by_name = 0, {}
        for proc in [root] + root.children(recursive=True):
            try:
                rss = proc.memory_info().rss
                name = proc.name()
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied, self._psutil.ZombieProcess):
                continue
            total += rss
            by_name[name] = by_name.get(name, 0) + rss
        self.peak_bytes = max(self.peak_bytes, total)
        for name, rss in by_name.items():
            self.peak_by_name[name] = max(self.peak_by_name.get(name, 0), rss)
        self.samples += 1
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> "PeakTreeRSS":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        self._thread.join()
        self.sample()
        return False

    def as_json(self, prefix: str) -> Dict[str, object]:
        mib = 1 << 20
        return {f"{prefix}_peak_rss_mib": round(self.peak_bytes / mib, 1),
                f"{prefix}_peak_rss_mib_by_process": {k: round(v / mib, 1) for k, v in sorted(self.peak_by_name.items())},
                f"{prefix}_rss_samples": self.samples}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000, help="generated raw rows")
    parser.add_argument("--work_dir", default=None,
                        help="scratch directory (default: a temporary one, removed); when reused, only the "
                             "benchmark's own earlier outputs in in/, spark/ and binary/ are replaced")
    parser.add_argument("--frequency_limit", type=int, default=3, help="as spark_preprocess")
    parser.add_argument("--master", default="local[*]", help="Spark master")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated rows")
    parser.add_argument("--days", type=int, default=0,
                        help="0: one Kaggle train.txt; N >= 2: Terabyte day_0 .. day_<N-1> with --rows split over them")
    parser.add_argument("--memory_interval", type=float, default=0.2,
                        help="seconds between RSS samples of the process tree")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> dict:
    from recsys_common.criteo import spark_preprocess, to_split_binary

    args = build_parser().parse_args(argv)
    if args.days == 1 or args.days < 0:
        raise SystemExit(f"--days {args.days}: the Terabyte layout needs at least 2 days (the last is the test day); "
                         f"0 writes a Kaggle train.txt")
    if args.memory_interval <= 0:
        raise SystemExit(f"--memory_interval must be > 0, got {args.memory_interval}")
    from recsys_common.io import atomic_directory
    work = args.work_dir or tempfile.mkdtemp(prefix="criteo_bench_")
    names = [f"day_{d}" for d in range(args.days)] if args.days else ["train.txt"]
    started = time.perf_counter()
    # A --work_dir may be reused: the benchmark replaces its own generated input, never a train.txt it did not write.
    with atomic_directory(os.path.join(work, "in"), overwrite=True, tool="dlrm.preproc.benchmark_preprocess") as tmp:
        for i, name in enumerate(names):
            rows = args.rows // len(names) + (1 if i < args.rows % len(names) else 0)
            write_raw(os.path.join(tmp, name), rows, args.seed + i)
    generate_s = time.perf_counter() - started
    raw_bytes = sum(os.path.getsize(os.path.join(work, "in", name)) for name in names)
    result = {"rows": args.rows, "layout": "terabyte" if args.days else "kaggle", "files": names,
              "raw_bytes": raw_bytes, "generate_s": round(generate_s, 1)}
    try:
        started = time.perf_counter()
        with PeakTreeRSS(args.memory_interval) as spark_memory:
            spark_preprocess.main(["--input_path", os.path.join(work, "in"), "--output_path",
                                   os.path.join(work, "spark"), "--frequency_limit", str(args.frequency_limit),
                                   "--master", args.master, "--overwrite"])
        spark_s = time.perf_counter() - started
        started = time.perf_counter()
        with PeakTreeRSS(args.memory_interval) as convert_memory:
            to_split_binary.main(["--input", os.path.join(work, "spark"), "--output", os.path.join(work, "binary"),
                                  "--overwrite"])
        convert_s = time.perf_counter() - started
        result.update({"spark_s": round(spark_s, 1), "spark_rows_per_s": round(args.rows / spark_s),
                       **spark_memory.as_json("spark"),
                       "spark_peak_rss_over_input": round(spark_memory.peak_bytes / raw_bytes, 2),
                       "convert_s": round(convert_s, 1), "convert_rows_per_s": round(args.rows / convert_s),
                       **convert_memory.as_json("convert"),
                       "cores": os.cpu_count(), "master": args.master})
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
