"""Peak memory and speed of ``recsys_common.prepare_clicks`` at two input sizes (prints one JSON object).

    python common/benchmarks/prepare_clicks.py --rows 1000000 4000000 --work_dir /tmp/pc_bench

Writes an Avazu-shaped CSV per size (header, ``click`` label, ``hour`` as YYMMDDHH over 10 days, 18 categorical
columns of hex ids drawn from Zipf-like distributions over fixed vocabularies, C15/C16 numericals), then runs the
prepare command on it in a child process (``--split time --time_column hour``, the default block size) and records
the child's peak RSS (``resource.getrusage(RUSAGE_CHILDREN)``) and its wall time. The vocabularies do not grow with
the row count, so a flat peak across sizes shows that memory does not depend on the number of rows (the dictionaries
themselves, which a real log's vocabulary sets, are the part that does not stream).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from recsys_common.machine import cpu_model_name

CATEGORICAL = ["C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain", "app_category",
               "device_id", "device_model", "device_type", "device_conn_type", "C14", "C17", "C18", "C19", "C20",
               "C21"]
VOCABULARY = [7, 7, 4700, 7700, 26, 8500, 550, 36, 20000, 8200, 5, 4, 2600, 430, 4, 68, 170, 60]
COMMON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_log(path: str, rows: int, seed: int = 0, block: int = 200_000) -> None:
    """Avazu-shaped CSV, written block by block (the generator never holds the file)."""
    rng = np.random.default_rng(seed)
    header = ["id", "click", "hour"] + CATEGORICAL[:12] + ["C14", "C15", "C16"] + CATEGORICAL[13:]
    vocab_hex = [np.array([f"{(v * 2654435761 + i * 97) & 0xFFFFFFFF:08x}" for v in range(n)]) for i, n in
                 enumerate(VOCABULARY)]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(",".join(header) + "\n")
        for start in range(0, rows, block):
            n = min(block, rows - start)
            hours = 14102100 + 100 * (np.arange(start, start + n) * 10 // rows) + rng.integers(0, 24, n)
            cols: Dict[str, np.ndarray] = {"id": np.arange(start, start + n).astype(str),
                                           "hour": hours.astype(str)}
            logits = np.full(n, -1.7)
            for i, name in enumerate(CATEGORICAL):
                index = np.minimum(rng.zipf(1.3, n) - 1, VOCABULARY[i] - 1)
                cols[name] = vocab_hex[i][index]
                logits += np.where(index % 3 == 0, 0.15, -0.1)
            cols["click"] = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(int).astype(str)
            cols["C15"] = rng.choice(["320", "300", "216", "728"], n, p=[0.93, 0.05, 0.01, 0.01])
            cols["C16"] = rng.choice(["50", "250", "36", "90"], n, p=[0.93, 0.05, 0.01, 0.01])
            lines = np.array(cols[header[0]], dtype=object)
            for name in header[1:]:
                lines = lines + "," + cols[name].astype(object)
            f.write("\n".join(lines.tolist()) + "\n")
    os.replace(tmp, path)


def run_prepare(csv_path: str, output: str, extra: Sequence[str]) -> Dict[str, float]:
    """The prepare command in a child process; its wall time and peak RSS."""
    command = [sys.executable, "-m", "recsys_common.prepare_clicks", "--input", csv_path, "--output", output,
               "--overwrite", "--label", "click", "--categorical", *CATEGORICAL, "--numerical", "C15", "C16",
               "--split", "time", "--time_column", "hour", *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COMMON_DIR, os.environ.get("PYTHONPATH", "")]))
    # A fresh parent per run, so that its RUSAGE_CHILDREN peak is this run's alone (ru_maxrss of children is the
    # largest child a process has waited for).
    wrapper = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", wrapper, *command], env=env, check=True, stdout=subprocess.PIPE,
                          text=True)
    seconds = time.time() - started
    lines = proc.stdout.strip().splitlines()
    print("\n".join(lines[:-1]), file=sys.stderr, flush=True)   # the command's progress
    peak_kib = int(lines[-1])
    return {"seconds": round(seconds, 2), "peak_rss_mib": round(peak_kib / 1024, 1)}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000],
                        help="input sizes, run in increasing order")
    parser.add_argument("--work_dir", default="/tmp/prepare_clicks_benchmark")
    parser.add_argument("--prepare_args", nargs=argparse.REMAINDER, default=[],
                        help="extra flags for the prepare command (last)")
    args = parser.parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    results: List[Dict[str, object]] = []
    for rows in sorted(args.rows):
        csv_path = os.path.join(args.work_dir, f"log_{rows}.csv")
        if not os.path.exists(csv_path):
            write_log(csv_path, rows)
        measured = run_prepare(csv_path, os.path.join(args.work_dir, f"out_{rows}"), args.prepare_args)
        results.append({"rows": rows, "input_mib": round(os.path.getsize(csv_path) / 2**20, 1), **measured,
                        "rows_per_s": round(rows / measured["seconds"])})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    report = {"benchmark": "prepare_clicks", "cpu": cpu_model_name(), "cores": os.cpu_count(),
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load_average_1min": round(os.getloadavg()[0], 1), "runs": results,
              "peak_ratio_largest_to_smallest": round(results[-1]["peak_rss_mib"] / results[0]["peak_rss_mib"], 3)}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
