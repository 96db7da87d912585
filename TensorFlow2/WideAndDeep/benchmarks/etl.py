"""Outbrain ETL benchmark: clicks_train rows/s and peak memory at several sizes of generated data, optionally side by
side with another version of the ETL (a checkout of an earlier commit). Prints JSON; not a test.

    python benchmarks/etl.py --work_dir /tmp/etl_bench --clicks_rows 5000000 20000000
    python benchmarks/etl.py --work_dir /tmp/etl_bench --clicks_rows 5000000 20000000 \
        --catalogue scaled        # documents and ads grow with the rows (the generator's default)
    git archive <commit> TensorFlow2/WideAndDeep/wide_deep | tar -x -C /tmp/old_etl     # the ETL to compare with
    python benchmarks/etl.py --work_dir /tmp/etl_bench --clicks_rows 1000000 4000000 \\
        --reference_code /tmp/old_etl/TensorFlow2/WideAndDeep --reference_max_rows 1000000 --output etl.json

Each run is ``python -m wide_deep.data.outbrain.preproc --cpu`` in a child process (the command line a user runs),
on the generator's data (``--num_displays`` = rows / 4.21, the generator's mean display size; the exact clicks
rows are reported), written once per size under ``--work_dir`` and reused. ``--catalogue real`` (the default here)
gives every size the real data's catalogue (3.0M documents, 0.56M ads: ``generator --catalogue real``), so the
sizes differ only in clicks and events, as a quarter and the whole of the real log do: that is the comparison that
says whether memory grows with the input; ``scaled`` is the generator's default (catalogue grows with the rows).
Peak memory is the largest sum of the
resident memory of the ETL's process tree (Dask workers included), sampled every 0.2 s. Rates are clicks_train rows per second of
wall time, start-up included, and per CPU second (user + system time of the whole process tree: less
sensitive to other jobs on a shared machine than wall time). The machine's CPU model, core count and load average (before and after) go with
the figures: on a shared machine they move by tens of percent from run to run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

import psutil

from recsys_common.io import atomic_write_text
from recsys_common.machine import cpu_model_name

CLICKS_PER_DISPLAY = 4.21   # the generator's mean display size (2 to 12 ads, Zipf)
RECIPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON_DIR = os.path.join(os.path.dirname(os.path.dirname(RECIPE_DIR)), "common")


def _tree_rss(pid: int) -> int:
    try:
        proc = psutil.Process(pid)
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_measured(command: List[str], env: Dict[str, str], log_path: str, cwd: str) -> Dict[str, float]:
    """Run ``command``; wall seconds, CPU seconds (user + system, its whole process tree) and the peak resident
    memory of its process tree (sampled)."""
    peak = [0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "w") as log:
        start = time.perf_counter()
        # cwd = the code's directory: ``python -m`` puts it first on sys.path, ahead of PYTHONPATH.
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        done = threading.Event()

        def sample():
            while not done.wait(0.2):
                peak[0] = max(peak[0], _tree_rss(proc.pid))

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        rc = proc.wait()
        seconds = time.perf_counter() - start
        done.set()
        thread.join()
    if rc != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{' '.join(command)} exited with {rc}; end of {log_path}:\n{tail}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_gb": peak[0] / 1e9}


def _env(code_dir: str) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([code_dir, COMMON_DIR])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def generated_data(work_dir: str, clicks_rows: int, seed: int, catalogue: str = "scaled") -> str:
    """The generator's seven CSVs for about ``clicks_rows`` clicks rows (made once, then reused); ``catalogue``:
    the generator's ``--catalogue`` (``scaled`` or ``real``)."""
    displays = max(1, int(round(clicks_rows / CLICKS_PER_DISPLAY)))
    path = os.path.join(work_dir, f"raw_{displays}_seed{seed}" + ("" if catalogue == "scaled" else f"_{catalogue}"))
    if not os.path.exists(os.path.join(path, "clicks_train.csv")):
        subprocess.run([sys.executable, "-m", "wide_deep.data.outbrain.generator", "--output_dir", path,
                        "--num_displays", str(displays), "--seed", str(seed), "--catalogue", catalogue],
                       env=_env(RECIPE_DIR), cwd=RECIPE_DIR, check=True)
    return path


def count_rows(path: str) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b"")) - 1


def run_etl(code_dir: str, raw_dir: str, out_dir: str, log_path: str, extra: Sequence[str]) -> Dict[str, float]:
    shutil.rmtree(out_dir, ignore_errors=True)
    command = [sys.executable, "-m", "wide_deep.data.outbrain.preproc", "--input_dir", raw_dir, "--output_dir",
               out_dir, "--cpu", *extra]
    result = run_measured(command, _env(code_dir), log_path, cwd=code_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    return result


REAL_CLICKS_ROWS = 87_141_731   # clicks_train.csv of the Kaggle Outbrain Click Prediction data
_STEP_LINE = re.compile(r"^\[preproc\] step (\d+)/\d+ (.*?)(?:: ([\d,]+) rows)? in ([\d.]+) s.*"
                        r"peak RSS so far ([\d.]+) GiB")


def step_figures(log_path: str) -> List[Dict[str, object]]:
    """The ETL's step lines: seconds and the process's peak RSS when the step ended (which step raised the peak)."""
    steps = []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _STEP_LINE.match(line.strip())
            if m:
                steps.append({"step": int(m.group(1)), "what": m.group(2).split(" (")[0],
                              "seconds": float(m.group(4)), "peak_rss_gib_so_far": float(m.group(5))})
    return steps


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work_dir", required=True, help="generated data, outputs and logs")
    p.add_argument("--clicks_rows", type=int, nargs="+", default=[5_000_000, 20_000_000])
    p.add_argument("--reference_code", default=None,
                   help="recipe directory (holding wide_deep/) of another ETL version to run side by side")
    p.add_argument("--reference_max_rows", type=int, default=1_000_000,
                   help="run the reference only at sizes up to this many clicks rows (it may not fit beyond)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--catalogue", choices=["real", "scaled"], default="real",
                   help="generated catalogue: real = the Kaggle data's 3.0M documents and 0.56M ads at every size "
                        "(only clicks and events grow); scaled = documents and ads grow with the rows")
    p.add_argument("--etl_args", default="", help="extra flags for this version's ETL, space separated")
    p.add_argument("--output", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    result: Dict[str, object] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_model": cpu_model_name(), "cpus": os.cpu_count(), "load_average_before": os.getloadavg(),
        "command": "python -m wide_deep.data.outbrain.preproc --cpu " + args.etl_args,
        "generator": f"python -m wide_deep.data.outbrain.generator --seed {args.seed} --catalogue {args.catalogue}",
        "runs": []}
    for rows in args.clicks_rows:
        raw_dir = generated_data(args.work_dir, rows, args.seed, args.catalogue)
        clicks = count_rows(os.path.join(raw_dir, "clicks_train.csv"))
        versions = [("this", RECIPE_DIR, args.etl_args.split())]
        if args.reference_code and rows <= args.reference_max_rows:
            versions.append(("reference", args.reference_code, []))
        for name, code_dir, extra in versions:
            tag = f"{name}_{clicks}"
            load = os.getloadavg()[0]
            m = run_etl(code_dir, raw_dir, os.path.join(args.work_dir, f"out_{tag}"),
                        os.path.join(args.work_dir, f"log_{tag}.txt"), extra)
            run = {"version": name, "clicks_rows": clicks, "seconds": round(m["seconds"], 1),
                   "clicks_rows_per_second": round(clicks / m["seconds"]),
                   "cpu_seconds": round(m["cpu_seconds"], 1),
                   "clicks_rows_per_cpu_second": round(clicks / max(m["cpu_seconds"], 1e-9)),
                   "cpu_seconds_per_million_clicks_rows": round(m["cpu_seconds"] / clicks * 1e6, 2),
                   "peak_rss_gb": round(m["peak_rss_gb"], 3),
                   "load_average_1min_at_start": load, "load_average_1min_at_end": os.getloadavg()[0],
                   "steps": step_figures(os.path.join(args.work_dir, f"log_{tag}.txt"))}
            result["runs"].append(run)
            print(json.dumps(run), flush=True)
    runs = result["runs"]
    this = [r for r in runs if r["version"] == "this"]
    if len(this) >= 2:
        small, large = this[0], this[-1]
        result["peak_rss_ratio_largest_to_smallest"] = round(large["peak_rss_gb"] / small["peak_rss_gb"], 3)
        result["size_ratio_largest_to_smallest"] = round(large["clicks_rows"] / small["clicks_rows"], 3)
    for ref in (r for r in runs if r["version"] == "reference"):
        mine = next(r for r in this if r["clicks_rows"] == ref["clicks_rows"])
        result.setdefault("this_vs_reference", []).append({
            "clicks_rows": ref["clicks_rows"],
            "speedup": round(mine["clicks_rows_per_second"] / ref["clicks_rows_per_second"], 2),
            "cpu_time_ratio": round(ref["cpu_seconds"] / max(mine["cpu_seconds"], 1e-9), 2),
            "peak_rss_ratio": round(mine["peak_rss_gb"] / ref["peak_rss_gb"], 3)})
    if this:
        # The real data through the same code: the largest run's rates scaled to 87M clicks rows (wall time at that
        # run's load, and CPU time, which is what 2 idle cores would need at most).
        big = this[-1]
        result["real_outbrain_extrapolation"] = {
            "clicks_rows": REAL_CLICKS_ROWS, "from_clicks_rows": big["clicks_rows"],
            "wall_hours_at_measured_load": round(REAL_CLICKS_ROWS / big["clicks_rows_per_second"] / 3600, 2),
            "cpu_hours": round(REAL_CLICKS_ROWS / big["clicks_rows_per_cpu_second"] / 3600, 2)}
    result["load_average_after"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        atomic_write_text(args.output, text + "\n")
    return result


if __name__ == "__main__":
    main()
