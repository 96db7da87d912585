"""Speed and peak memory of ``convert.py`` on a generated ML-20m-sized ``ratings.csv``, as JSON.

    python benchmarks/convert.py                              # 20,000,263 rows (~0.5 GB), ML-20m's shape
    python benchmarks/convert.py --layout ml-1m               # the same ratings in ML-1M's ``::`` layout
    python benchmarks/convert.py --rows 2000000 --compare_with /tmp/old_convert.py   # and another converter

The input is generated (not GroupLens' file, which may not be redistributed): ML-20m's header and layout
``userId,movieId,rating,timestamp``, its 138,493 users (sorted, every user with at least 20 ratings, as in
ML-20m) and 26,744 movies (Zipf-like popularity, so some (user, movie) pairs repeat and exercise the
de-duplication), half-star ratings and Unix timestamps of ML-20m's range.

Each converter runs as a child process (``python convert.py --path ratings.csv --output DIR``); its peak
resident memory is the kernel's ``ru_maxrss`` of that child (``os.wait4``), its CPU time ``ru_utime`` +
``ru_stime``. Reported: ``seconds`` (wall), ``rows_per_s``, ``peak_rss_bytes`` and ``peak_rss_over_input``
(peak / input file size). Targets (issue 17): at ML-20m size at most 10 s and a peak of at most 1.5x the input;
``targets`` in the JSON says whether this run met them (wall time on a loaded machine says little: see
``cpu_seconds``, user + system CPU of the child). ``--compare_with`` runs a second converter script (for
instance the previous version, ``git show HEAD~1:PyTorch/NCF/convert.py > /tmp/old_convert.py``) on the same
file, side by side.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from recsys_common.cli import run_main
from recsys_common.io import check_json_output, write_json_output
from recsys_common.machine import cpu_model_name as _cpu_model

RECIPE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ is one below
ML20M_ROWS, ML20M_USERS, ML20M_ITEMS = 20_000_263, 138_493, 26_744
FIRST_TIME, LAST_TIME = 789_652_009, 1_427_784_002  # ML-20m's timestamp range


def generate_ratings_csv(path: str, rows: int, users: int, items: int, seed: int = 0,
                         chunk_rows: int = 2_000_000, layout: str = "ml-20m") -> int:
    """Write an ML-20m-layout ``ratings.csv`` of ``rows`` ratings; returns its size in bytes.

    ``layout="ml-1m"``: the same draws in ML-1M's ``ratings.dat`` layout (no header, ``::``, whole stars).

    Users get at least ``min(20, rows // users)`` ratings each, the rest spread at random; written in chunks so
    that the generator's own memory stays small.
    """

    rng = np.random.default_rng(seed)
    users = max(1, min(users, rows // 2))
    base = min(20, rows // users)
    per_user = np.full(users, base, dtype=np.int64)
    per_user += np.bincount(rng.integers(0, users, rows - base * users), minlength=users)
    user_ids = np.repeat(np.arange(1, users + 1, dtype=np.int32), per_user)
    options = pacsv.WriteOptions(include_header=False)
    with open(path, "wb") as f:
        if layout == "ml-20m":
            f.write(b"userId,movieId,rating,timestamp\n")  # unquoted, as GroupLens writes it
        for lo in range(0, rows, chunk_rows):
            n = min(chunk_rows, rows - lo)
            movie = (rng.zipf(1.2, n) + rng.integers(0, items, n)) % items + 1
            rating = rng.integers(1, 11, n) / 2.0
            table = pa.table({"userId": user_ids[lo: lo + n],
                              "movieId": movie.astype(np.int32),
                              "rating": rating if layout == "ml-20m" else np.ceil(rating).astype(np.int32),
                              "timestamp": rng.integers(FIRST_TIME, LAST_TIME, n).astype(np.int64)})
            if layout == "ml-20m":
                pacsv.write_csv(table, f, options)
            else:
                buffer = io.BytesIO()
                pacsv.write_csv(table, buffer, options)
                f.write(buffer.getvalue().replace(b",", b"::"))
    return os.path.getsize(path)


def run_converter(script: str, ratings: str, output: str, layout: str = "ml-20m") -> Dict:
    """Run ``script --path ratings --output output`` as a child; wall seconds, its peak RSS and CPU times."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (RECIPE, os.path.join(RECIPE, "..", "..", "common"),
                                                     env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, script, "--path", ratings, "--output", output, "--format", layout],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{script} failed ({child.returncode}): {out.decode(errors='replace')[-2000:]}")
    return {"script": script, "seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024,
            "user_cpu_s": usage.ru_utime, "system_cpu_s": usage.ru_stime,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "message": out.decode(errors="replace").strip().splitlines()[-1]}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="convert.py speed and peak memory on a generated ratings.csv (JSON)")
    p.add_argument("--rows", type=int, default=ML20M_ROWS, help="ratings to generate (default: ML-20m's count)")
    p.add_argument("--users", type=int, default=ML20M_USERS)
    p.add_argument("--items", type=int, default=ML20M_ITEMS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=["ml-20m", "ml-1m"], default="ml-20m",
                   help="ml-20m: ratings.csv with header; ml-1m: ratings.dat, '::'-separated")
    p.add_argument("--workdir", default=None, help="where the input and outputs go (default: a temporary "
                                                   "directory, removed afterwards)")
    p.add_argument("--compare_with", default=None, metavar="SCRIPT",
                   help="another converter script taking --path/--output (e.g. the previous convert.py)")
    p.add_argument("--output_json", "--output", dest="output",
                   help="also write the JSON here (atomically; an existing file is replaced only if it is JSON)")
    args = p.parse_args(argv)
    if args.rows < 2 or args.users < 1 or args.items < 2:
        p.error("--rows must be >= 2, --users >= 1, --items >= 2")
    if args.compare_with and not os.path.isfile(args.compare_with):
        p.error(f"--compare_with {args.compare_with}: file not found")
    return args


def main(argv: Optional[List[str]] = None) -> Dict:
    args = parse_args(argv)
    check_json_output(args.output)
    workdir = args.workdir or tempfile.mkdtemp(prefix="ncf-convert-bench-")
    os.makedirs(workdir, exist_ok=True)
    try:
        ratings = os.path.join(workdir, "ratings.csv" if args.layout == "ml-20m" else "ratings.dat")
        t0 = time.perf_counter()
        size = generate_ratings_csv(ratings, args.rows, args.users, args.items, args.seed, layout=args.layout)
        result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": _cpu_model(),
                  "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "rows": args.rows, "layout": args.layout,
                  "input_bytes": size, "generate_seconds": time.perf_counter() - t0}
        runs = {"convert": os.path.join(RECIPE, "convert.py")}
        if args.compare_with:
            runs["compare_with"] = os.path.abspath(args.compare_with)
        for name, script in runs.items():
            out_dir = os.path.join(workdir, f"out-{name}")
            shutil.rmtree(out_dir, ignore_errors=True)
            r = run_converter(script, ratings, out_dir, args.layout)
            r.update(rows_per_s=args.rows / r["seconds"], peak_rss_over_input=r["peak_rss_bytes"] / size)
            result[name] = r
        result["loadavg_after"] = os.getloadavg()
        result["targets"] = {"seconds_at_most_10": result["convert"]["seconds"] <= 10.0,
                             "cpu_seconds_at_most_10": result["convert"]["cpu_seconds"] <= 10.0,
                             "peak_at_most_1.5x_input": result["convert"]["peak_rss_over_input"] <= 1.5}
        if args.compare_with:
            same = all(_same_file(os.path.join(workdir, "out-convert", n), os.path.join(workdir, "out-compare_with", n))
                       for n in ("feature_spec.yaml", "train.parquet", "test.parquet"))
            result["outputs_identical"] = same
            result["speedup"] = result["compare_with"]["seconds"] / result["convert"]["seconds"]
            result["peak_rss_ratio"] = result["compare_with"]["peak_rss_bytes"] / result["convert"]["peak_rss_bytes"]
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=1))
    if args.output:
        write_json_output(args.output, result)
    return result


def _same_file(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


if __name__ == "__main__":
    run_main(main, prog="benchmarks/convert.py", input_errors=(FileExistsError,))   # an --output that is not a result file
