#!/usr/bin/env python3
"""Throughput and peak memory of the Criteo preprocessing engines on generated raw rows (no download needed).

Writes ``--rows`` rows in Criteo's raw TSV layout (power-law categorical values as 8-digit hex strings, count-like
integers, ~10 % missing fields, every 50th row with its trailing empty fields stripped) as a Kaggle ``train.txt``, or
with ``--days N`` as Terabyte day files ``day_0 .. day_<N-1>`` (the rows split evenly; the last day is the test day),
then runs each engine of ``--engines`` as its own process, end to end from raw text to the split-binary dataset:

- ``ours``: ``python -m recsys_common.criteo.polars_preprocess`` (the recipes' default engine; ``ours_input``: the
  same with ``--train_ordering input``, the row order the peer script writes, no shuffle);
- ``peer``: the plain Polars script ``--peer_script`` (default ``benchmarks/criteo_polars_peer.py``, the single-file
  approach a user would write; Kaggle layout only: it reads one file);
- ``spark``: ``python -m recsys_common.criteo.spark_preprocess`` then ``to_split_binary`` (the cluster engine).

It prints one JSON line: per engine seconds, rows/s, peak memory and CPU seconds (user + system), the ratios
ours/peer and ours/spark (rows/s: higher is better; peak memory: lower is better; ``cpu_s``: theirs over ours, higher
is better, the figure a loaded machine distorts least), the machine (CPU model, cores, load average before and after), and
the time Criteo Kaggle (45,840,617 rows) and Criteo 1TB (4,373,472,329 rows) would take at the measured rate.

    python benchmarks/preprocess.py --rows 1000000 --frequency_limit 15
    python benchmarks/preprocess.py --rows 6000000 --days 24 --engines ours      # memory at two sizes
    python benchmarks/preprocess.py --rows 24000000 --days 24 --engines ours

Peak memory is the largest sum of the resident set sizes (RSS) of the engine's process tree (the Python process and,
for Spark, the JVM it starts, which with a ``local[...]`` master also runs the executors), sampled every
``--memory_interval`` seconds with psutil. Shared pages are counted once per process, so the sum is an upper bound;
a peak shorter than the interval can be missed, so ``max_rss_one_process_mib`` adds the kernel's exact peak of the
largest single process (``ru_maxrss``), which is the whole figure for the single-process engines (ours, peer). Linux
carries a process's peak across fork and exec, so a child of this process (which holds hundreds of MiB once it has
generated the input) would never report less than this process's own peak: each engine is started by a small
launcher that reports its children's peak instead.
Engines run one after the other on the same files; on a shared machine compare the ratios, not the absolute figures.

``main(argv)`` returns the result dict.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import polars as pl
import psutil

from recsys_common.cli import InputError, run_main
from recsys_common.io import atomic_directory
from recsys_common.machine import cpu_model_name

KAGGLE_ROWS = 45_840_617
TERABYTE_ROWS = 4_373_472_329
_HERE = os.path.dirname(os.path.abspath(__file__))
# The plain Polars script the engine is measured against (engine ``peer``): ours, in this folder.
DEFAULT_PEER = os.path.join(_HERE, "criteo_polars_peer.py")


def write_raw(path: str, rows: int, seed: int, block: int = 200_000) -> None:
    """``rows`` generated raw rows into ``path``, vectorised (Polars builds the lines), about 1M rows/s."""
    rng = np.random.default_rng(seed)
    vocab = [rng.integers(1, 10 ** (2 + i % 6), dtype=np.int64) + 1 for i in range(26)]  # per-column value ranges
    hex_digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    with open(path, "wb") as f:
        for start in range(0, rows, block):
            n = min(block, rows - start)
            columns = {"label": pl.Series((rng.random(n) < 0.25).astype(np.int64)).cast(pl.Utf8)}
            ints = np.floor(rng.pareto(1.5, (n, 13)) * 3).astype(np.int64)
            ints_missing = rng.random((n, 13)) < 0.1
            for c in range(13):
                columns[f"i{c}"] = pl.Series(np.ma.masked_array(ints[:, c], ints_missing[:, c])).cast(pl.Utf8)
            for c in range(26):
                v = np.minimum(rng.zipf(1.3, n), vocab[c]).astype(np.uint64)
                h = (v * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
                text = hex_digits[(h[:, None] >> shifts) & np.uint64(0xF)].view("S8").ravel()
                missing = rng.random(n) < 0.1
                columns[f"c{c}"] = pl.Series(text).cast(pl.Utf8).zip_with(pl.Series(~missing), pl.Series([None], dtype=pl.Utf8))
            frame = pl.DataFrame(columns)
            line = pl.concat_str([pl.col(c).fill_null("") for c in frame.columns], separator="\t")
            # some copies of the data strip trailing empty fields: every 50th row here
            strip = (pl.int_range(pl.len()) + start) % 50 == 0
            lines = frame.select(pl.when(strip).then(line.str.strip_chars_end("\t")).otherwise(line).alias("l"))
            f.write((lines["l"].str.join("\n").item() + "\n").encode("ascii"))


def generate_input(directory: str, rows: int, days: int, seed: int):
    """``rows`` generated rows in ``directory``: one Kaggle ``train.txt`` (``days`` 0) or ``day_0 .. day_<days-1>``.
    Reused when the directory already holds the same ``rows``/``days``/``seed``. Returns (file names, bytes, reused).
    """
    names = [f"day_{d}" for d in range(days)] if days else ["train.txt"]
    stamp = os.path.join(directory, ".generated.json")
    wanted = {"rows": rows, "days": days, "seed": seed}
    reuse = os.path.isfile(stamp) and json.load(open(stamp)) == wanted
    if not reuse:
        # A --work_dir may be reused: the benchmark replaces its own generated input, never a file it did not write.
        with atomic_directory(directory, overwrite=True, tool="dlrm.preproc.benchmark_preprocess") as tmp:
            for i, name in enumerate(names):
                n = rows // len(names) + (1 if i < rows % len(names) else 0)
                write_raw(os.path.join(tmp, name), n, seed + i)
            with open(os.path.join(tmp, ".generated.json"), "w") as f:
                json.dump(wanted, f)
    return names, sum(os.path.getsize(os.path.join(directory, name)) for name in names), reuse


class PeakTreeRSS:
    """Samples the summed RSS of this process and its descendants on a thread while used as a context manager.

    ``peak_bytes`` is the largest sum seen, ``peak_by_name`` the largest RSS per process name (e.g. ``python3``,
    ``java``), ``samples`` how many samples were taken (at least one, taken on entry and on exit).
    """

    def __init__(self, interval_s: float = 0.2):
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
    parser.add_argument("--rows", type=int, default=1_000_000, help="generated raw rows")
    parser.add_argument("--work_dir", default=None,
                        help="scratch directory (default: a temporary one, removed); when reused, only the "
                             "benchmark's own earlier outputs are replaced, and generated input of the same "
                             "--rows/--days/--seed is reused")
    parser.add_argument("--frequency_limit", type=int, default=15, help="as the engines' --frequency_limit")
    parser.add_argument("--engines", default="ours,peer,spark",
                        help="comma-separated: ours, ours_input (ours with --train_ordering input, the peer's row "
                             "order), peer, spark")
    parser.add_argument("--peer_script", default=None,
                        help="the plain Polars script (engine peer), called with --input train.txt --output DIR "
                             "--frequency_limit N; default: benchmarks/criteo_polars_peer.py")
    parser.add_argument("--master", default="local[*]", help="Spark master (engine spark)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated rows")
    parser.add_argument("--days", type=int, default=0,
                        help="0: one Kaggle train.txt; N >= 2: Terabyte day_0 .. day_<N-1> with --rows split over them")
    parser.add_argument("--engine_args", default="",
                        help="more flags for our engine, e.g. '--chunk_mb 8 --shuffle_bucket_rows 500000'")
    parser.add_argument("--memory_interval", type=float, default=0.1,
                        help="seconds between RSS samples of the process tree")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each engine but spark, taken in turn (ours, peer, ours, peer, ...); the JSON "
                             "gives each engine's median and the median of the per-round ratios")
    parser.add_argument("--memory_rows", default="",
                        help="comma-separated row counts, e.g. '6000000,24000000': our engine (default flags) also "
                             "runs on generated Terabyte input of --memory_days day files of each size, and the "
                             "JSON's flat_memory gives each peak (memory flat with the input size)")
    parser.add_argument("--memory_days", type=int, default=24, help="day files of the --memory_rows inputs")
    return parser


# Started between this process and the engine: the engine's exact peak RSS (RUSAGE_CHILDREN of a process of ~10 MiB,
# not floored by this one's), printed as its last line after the engine's own output.
_MAXRSS_MARK = "[benchmark-launcher] children ru_maxrss kB: "
_LAUNCHER = ("import resource, subprocess, sys\n"
             "code = subprocess.call(sys.argv[1:])\n"
             f"print({_MAXRSS_MARK!r} + str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss), flush=True)\n"
             "sys.exit(code)\n")


def _timed(argv: List[str], interval: float, env: Optional[Dict[str, str]] = None) -> Dict[str, object]:
    """Run one command; its wall time and the peak RSS of its process tree (sampled from this process)."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    peak, stop = [0], threading.Event()
    output: List[str] = []
    reader = threading.Thread(target=lambda: output.append(proc.stdout.read()), daemon=True)
    reader.start()

    def sample() -> None:
        while not stop.is_set():
            try:
                root = psutil.Process(proc.pid)
                total = 0
                for p in [root] + root.children(recursive=True):
                    try:
                        total += p.memory_info().rss
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        pass
                peak[0] = max(peak[0], total)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
            stop.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # wait4: CPU time of the launcher and the engine; the engine's exact peak RSS comes from the launcher
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    stop.set()
    sampler.join()
    reader.join()
    text, _, maxrss_kb = "".join(output).rpartition(_MAXRSS_MARK)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with exit code {code}:\n{text[-3000:]}")
    return {"seconds": seconds, "peak_rss_bytes": peak[0], "max_rss_bytes": int(maxrss_kb) * 1024,
            "cpu_seconds": usage.ru_utime + usage.ru_stime, "output": text}


def _engine_result(rows: int, runs: List[Dict[str, object]], raw_bytes: int) -> Dict[str, object]:
    seconds = sum(r["seconds"] for r in runs)
    peak = max(r["peak_rss_bytes"] for r in runs)
    return {"seconds": round(seconds, 2), "rows_per_s": round(rows / seconds), "peak_rss_mib": round(peak / 2 ** 20, 1),
            "peak_rss_over_input": round(peak / raw_bytes, 2),
            "max_rss_one_process_mib": round(max(r["max_rss_bytes"] for r in runs) / 2 ** 20, 1),
            # user + system CPU seconds of the engine's processes (wait4): what a loaded machine's share of the cores
            # blurs least (a JVM's CPU is counted; its executors run inside it with a local master)
            "cpu_s": round(sum(r["cpu_seconds"] for r in runs), 2),
            "steps_s": [round(r["seconds"], 2) for r in runs]}


def _median_result(runs: List[Dict[str, object]]) -> Dict[str, object]:
    """One engine over several rounds: the round of median rows/s, with every round's rows/s and peaks beside it."""
    if len(runs) == 1:
        return runs[0]
    ordered = sorted(runs, key=lambda r: r["rows_per_s"])
    median = dict(ordered[(len(ordered) - 1) // 2])
    median["rounds"] = len(runs)
    median["rows_per_s_by_round"] = [r["rows_per_s"] for r in runs]
    median["peak_rss_mib_by_round"] = [r["peak_rss_mib"] for r in runs]
    median["max_rss_one_process_mib_by_round"] = [r["max_rss_one_process_mib"] for r in runs]
    median["cpu_s_by_round"] = [r["cpu_s"] for r in runs]
    return median


def _extrapolate(rows_per_s: float, cores: int) -> Dict[str, float]:
    return {"criteo_kaggle_hours": round(KAGGLE_ROWS / rows_per_s / 3600, 2),
            "criteo_1tb_hours": round(TERABYTE_ROWS / rows_per_s / 3600, 1),
            "rows_per_s_per_core": round(rows_per_s / cores),
            "criteo_1tb_core_hours": round(TERABYTE_ROWS / rows_per_s * cores / 3600, 1)}


def check_args(args) -> List[str]:
    """The engines of ``--engines``, after checking the flags (:class:`InputError` naming the flag)."""
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - {"ours", "ours_input", "peer", "spark"})
    if unknown or not engines:
        raise InputError(f"--engines: unknown {unknown or 'none given'}; choose from ours, ours_input, peer, spark")
    if args.days == 1 or args.days < 0:
        raise InputError(f"--days {args.days}: the Terabyte layout needs at least 2 days (the last is the test day); "
                         f"0 writes a Kaggle train.txt")
    if args.memory_interval <= 0:
        raise InputError(f"--memory_interval must be > 0, got {args.memory_interval}")
    if args.rounds < 1:
        raise InputError(f"--rounds must be >= 1, got {args.rounds}")
    if args.memory_days < 2:
        raise InputError(f"--memory_days {args.memory_days}: the Terabyte layout needs at least 2 days")
    if "peer" in engines and args.days:
        raise InputError("--engines peer: the peer script reads one Kaggle train.txt; use --days 0")
    if "peer" in engines and not os.path.isfile(args.peer_script):
        raise InputError(f"--peer_script {args.peer_script}: not found")
    return engines


def _run_ours(args, inp: str, out: str, extra: List[str]) -> List[Dict[str, object]]:
    return [_timed([sys.executable, "-m", "recsys_common.criteo.polars_preprocess", "--input_path", inp,
                    "--output_path", out, "--frequency_limit", str(args.frequency_limit), *extra],
                   args.memory_interval)]


def run_engine(engine: str, args, work: str, raw_bytes: int) -> Dict[str, object]:
    """One run of ``engine`` on the generated input in ``work/in``, end to end to split binary: its figures."""
    py, inp = sys.executable, os.path.join(work, "in")
    out = os.path.join(work, f"out_{engine}")
    for path in (out, out + ".work", out + "_spark"):
        shutil.rmtree(path, ignore_errors=True)   # the benchmark's own scratch outputs
    if engine in ("ours", "ours_input"):
        order = ["--train_ordering", "input"] if engine == "ours_input" else []
        runs = _run_ours(args, inp, out, [*order, *args.engine_args.split()])
    elif engine == "peer":
        runs = [_timed([py, args.peer_script, "--input", os.path.join(inp, "train.txt"), "--output", out,
                        "--frequency_limit", str(args.frequency_limit)], args.memory_interval)]
    else:
        env = {**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}
        runs = [_timed([py, "-m", "recsys_common.criteo.spark_preprocess", "--input_path", inp,
                        "--output_path", out + "_spark", "--frequency_limit", str(args.frequency_limit),
                        "--master", args.master], args.memory_interval, env),
                _timed([py, "-m", "recsys_common.criteo.to_split_binary", "--input", out + "_spark",
                        "--output", out], args.memory_interval)]
    one = _engine_result(args.rows, runs, raw_bytes)
    notes = [line for r in runs for line in r["output"].splitlines() if "peak RSS so far" in line]
    if notes:
        one["phases"] = notes
    return one


def flat_memory(args, work: str) -> List[Dict[str, object]]:
    """Our engine (default flags) on generated Terabyte input of each ``--memory_rows`` size: its peaks."""
    flat = []
    for rows in [int(r) for r in args.memory_rows.split(",") if r.strip()]:
        directory = os.path.join(work, f"in_memory_{rows}")
        _, size, _ = generate_input(directory, rows, args.memory_days, args.seed)
        out = os.path.join(work, f"out_memory_{rows}")
        for path in (out, out + ".work"):
            shutil.rmtree(path, ignore_errors=True)
        load = round(os.getloadavg()[0], 2)
        one = _engine_result(rows, _run_ours(args, directory, out, []), size)
        shutil.rmtree(out, ignore_errors=True)
        flat.append({"rows": rows, "days": args.memory_days, "raw_bytes": size, "load_avg_1m_before": load,
                     **{k: one[k] for k in ("seconds", "rows_per_s", "peak_rss_mib", "max_rss_one_process_mib")}})
        print(f"[benchmark] memory at {rows} rows: {json.dumps(flat[-1])}", file=sys.stderr, flush=True)
    return flat


def engine_ratios(e: Dict[str, Dict], rounds: Dict[str, List[Dict[str, object]]]) -> Dict[str, object]:
    """Ours (and ours_input) over the peer and Spark: rows/s, peak memory, CPU seconds."""
    ratios: Dict[str, object] = {}
    for mine in ("ours", "ours_input"):
        for other in ("peer", "spark"):
            if mine in e and other in e:
                # Round by round (the runs back to back share the machine's load), then the median.
                pairs = list(zip(rounds[mine], rounds[other])) if other != "spark" else [(e[mine], e[other])]
                ratios[f"{mine}_vs_{other}_rows_per_s"] = round(float(np.median(
                    [a["rows_per_s"] / b["rows_per_s"] for a, b in pairs])), 2)
                ratios[f"{mine}_vs_{other}_peak_rss"] = round(float(np.median(
                    [a["peak_rss_mib"] / b["peak_rss_mib"] for a, b in pairs])), 2)
                ratios[f"{mine}_vs_{other}_max_rss_one_process"] = round(float(np.median(
                    [a["max_rss_one_process_mib"] / b["max_rss_one_process_mib"] for a, b in pairs])), 2)
                ratios[f"{mine}_vs_{other}_cpu_s"] = round(float(np.median(
                    [b["cpu_s"] / a["cpu_s"] for a, b in pairs])), 2)   # > 1: ours used less CPU
                if len(pairs) > 1:
                    ratios[f"{mine}_vs_{other}_rows_per_s_by_round"] = [
                        round(a["rows_per_s"] / b["rows_per_s"], 2) for a, b in pairs]
    return ratios


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    args.peer_script = args.peer_script or DEFAULT_PEER
    engines = check_args(args)
    work = args.work_dir or tempfile.mkdtemp(prefix="criteo_bench_")
    started = time.perf_counter()
    names, raw_bytes, reuse = generate_input(os.path.join(work, "in"), args.rows, args.days, args.seed)
    generate_s = time.perf_counter() - started
    cores = os.cpu_count() or 1
    result: Dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model_name(), "cores": cores,
        "load_avg_1m_before": round(os.getloadavg()[0], 2), "rows": args.rows,
        "layout": "terabyte" if args.days else "kaggle", "files": len(names), "raw_bytes": raw_bytes,
        "frequency_limit": args.frequency_limit, "engine_args": args.engine_args,
        "generate_s": round(generate_s, 1), "input_reused": reuse,
        "engines": {}}
    rounds: Dict[str, List[Dict[str, object]]] = {engine: [] for engine in engines}
    try:
        for round_index in range(args.rounds):
            for engine in engines:
                if engine == "spark" and round_index:
                    continue   # one Spark run: it takes minutes, and its ratio is not close
                rounds[engine].append(run_engine(engine, args, work, raw_bytes))
                print(f"[benchmark] round {round_index + 1} {engine}: {json.dumps(rounds[engine][-1])}",
                      file=sys.stderr, flush=True)
        for engine in engines:
            result["engines"][engine] = _median_result(rounds[engine])
        flat = flat_memory(args, work)
        if flat:
            result["flat_memory"] = flat
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    result["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    result["ratios"] = engine_ratios(result["engines"], rounds)
    result["extrapolated_at_measured_rate"] = {name: _extrapolate(v["rows_per_s"], cores)
                                               for name, v in result["engines"].items()}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run_main(main, input_errors=(FileExistsError,))   # InputError: a bad flag; FileExistsError: --output_json
