"""Candidate CPU rules for ncf.py's defaults (batch, learning rate), measured on datasets of different density.

    python benchmarks/cpu_rules.py --data_dir $RECSYS_DATA_DIR --work /tmp/ncf-cpu-rules --jobs 2

Datasets (built under ``--work``, never in the repository: MovieLens may not be redistributed):

* ``ml1m-paper``: the NCF paper's ML-1M split, users 0..2997 (train rows rebuilt from the partial ratings file);
* ``ml100k``: ML-100K, leave-one-out with 100 sampled negatives (``convert.py``'s default protocol);
* ``sparse-30`` / ``sparse-8`` / ``sparse-3``: ML-1M's users 1..2998 with 30 / 8 / 3 % of their ratings kept
  (``benchmarks/sparse_movielens.py``: three-field paper files, 99 negatives), densities about 1.4 / 0.5 / 0.3 %;
* ``tail-6``: the same users, the 10 % most-rated movies removed, 6 ratings kept per user (density 0.25 %,
  popularity HR@10 0.28: the long tail and the popularity of issue 35's product-ratings sets).

Each candidate is one ``python ncf.py --data D -e E --seed S FLAGS`` (the rest ncf.py's NVIDIA defaults, so the best
epoch is chosen on the validation item and the test HR@10 is the one at that epoch) in its own process, ``--jobs`` at
a time, one thread each. Learning-rate candidates keep NVIDIA's model and set ``-b B -l L``: ``B`` is the batch of
the CPU batch rule for NVIDIA's model (at least 100 steps per epoch, a power of two); ``L`` is the candidate's rate
at that batch: a constant (``lr-X``), or a rate scaled by sqrt(B / batch) from an anchor (``sqrt-X@batch``;
``nvidia-sqrt`` is NVIDIA's 0.0045 at 2**20, the rule before issue 35). Model candidates (``MODEL_CANDIDATES``) set
the model and optimizer too: ``paper-fF`` is the published NeuMF's (He et al.'s code: -f F, MLP 64-32-16-8, Adam
(0.9, 0.999) at 0.001, -b 256, no dropout), ``nvidia-adam`` NVIDIA's model at the 2026-11-28 rule's -b / -l with
Adam (0.9, 0.999) and no dropout. Runs are kept in
``WORK/runs.json`` by (dataset, B, L, epochs, seed), so candidates that give the same L share one run and a rerun
only trains what is new. ``defaults`` runs ncf.py with no -b / -l at all: what a user gets. Also reported: popularity's HR@10 on the same test candidates (:func:`neumf.evaluation.popularity_metrics`).
Prints a markdown table (HR@10 per dataset and candidate; best epoch in brackets) and writes ``WORK/results.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.dirname(HERE)
sys.path.insert(0, RECIPE)
sys.path.insert(0, HERE)

from neumf import cli  # noqa: E402
from neumf.data import convert, load_dataset  # noqa: E402
from neumf.evaluation import popularity_metrics  # noqa: E402
from recsys_common.logger import read_log  # noqa: E402
import sparse_movielens  # noqa: E402

ML1M_RATINGS = ("movielens", "ml-1m", "ratings.users-1-2999.dat.gz")
SPARSE_KEEP = {"sparse-30": 0.30, "sparse-8": 0.08, "sparse-3": 0.03}
# name -> sparse_movielens.build's keyword arguments
SPARSE_SETS = {**{name: dict(keep=keep) for name, keep in SPARSE_KEEP.items()},
               "tail-6": dict(keep=1.0, drop_popular=0.1, max_per_user=6)}
# name -> (learning rate, at batch, cap): scaled by sqrt(rule's batch / at batch), at most cap; at batch None: that
# rate at any batch. "sqrt-0.002@1024-max-0.004" is the rule ncf.py uses (neumf/cli.py).
CANDIDATES = {"nvidia-sqrt": (0.0045, 2 ** 20, None), "lr-0.001": (0.001, None, None),
              "lr-0.002": (0.002, None, None), "lr-0.004": (0.004, None, None), "lr-0.008": (0.008, None, None),
              "sqrt-0.002@1024": (0.002, 1024, None), "sqrt-0.004@1024": (0.004, 1024, None),
              "sqrt-0.002@1024-max-0.004": (0.002, 1024, 0.004)}
PAPER = ["--layers", "64", "32", "16", "8", "-b1", "0.9", "-b2", "0.999", "--dropout", "0"]
# name -> (learning-rate candidate whose -b / -l it starts from, or None; the flags it adds)
MODEL_CANDIDATES = {
    **{f"paper-f{f}": (None, ["-f", str(f), "-b", "256", "-l", "0.001", *PAPER]) for f in (8, 16, 32)},
    **{f"paper-f{f}-l{lr}": (None, ["-f", str(f), "-b", "256", "-l", lr, *PAPER])
       for f in (8, 16, 32) for lr in ("0.0005", "0.002")},
    **{f"paper-f{f}-b1024": (None, ["-f", str(f), "-b", "1024", "-l", "0.002", *PAPER]) for f in (8, 16)},
    "nvidia-adam": ("sqrt-0.002@1024-max-0.004", ["-b1", "0.9", "-b2", "0.999", "--dropout", "0"]),
}


def build_datasets(data_dir: str, work: str, names: List[str]) -> Dict[str, str]:
    """Convert (once) each dataset of ``names`` under ``work``; returns name -> converted directory."""
    out = {}
    ratings = os.path.join(data_dir, *ML1M_RATINGS)
    for name in names:
        target = os.path.join(work, name, "converted")
        out[name] = target
        if os.path.isfile(os.path.join(target, "feature_spec.yaml")):
            continue
        if name == "ml1m-paper":
            split = convert.convert_paper_split(os.path.join(data_dir, "ncf-ml-1m", "ml-1m"), ratings, max_user=2997)
        elif name == "ml100k":
            split = convert.convert_ratings(os.path.join(data_dir, "movielens", "ml-100k", "u.data"))
        else:
            prefix = sparse_movielens.build(ratings, os.path.join(work, name), max_user=2998, **SPARSE_SETS[name])
            split = convert.convert_paper_split(prefix)
        convert.write_split(split, target, overwrite=True)
    return out


def rule_batch(train_positives: int, negatives: int = 4) -> int:
    """The CPU batch rule's batch for NVIDIA's model (``cli.choose_cpu_batch``)."""
    return cli.choose_cpu_batch(train_positives * (1 + negatives), 64, [256, 256, 128, 64],
                                cli.machine_memory_bytes())[0]


def candidate_flags(candidate: str, train_positives: int) -> List[str]:
    """The flags of ``candidate`` on a dataset of ``train_positives`` (none for ``defaults``)."""
    if candidate == "defaults":
        return []
    if candidate in MODEL_CANDIDATES:
        base, extra = MODEL_CANDIDATES[candidate]
        return (candidate_flags(base, train_positives) if base else []) + extra
    batch = rule_batch(train_positives)
    rate, at_batch, cap = CANDIDATES[candidate]
    lr = rate if at_batch is None else float(f"{rate * math.sqrt(batch / at_batch):.3g}")
    lr = min(lr, cap) if cap is not None else lr
    return ["-b", str(batch), "-l", f"{lr:g}"]


def run_one(dataset: str, flags: List[str], epochs: int, seed: int, log_path: str) -> Dict:
    """One ncf.py run in a child process (one thread); returns its summary, command and wall time."""
    argv = [sys.executable, os.path.join(RECIPE, "ncf.py"), "--data", dataset, "-e", str(epochs), "--seed", str(seed),
            "--log_path", log_path, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = read_log(argv[argv.index("--log_path") + 1])[-1]["data"]
    return {"command": " ".join(argv[1:]), "wall_s": round(wall, 1), "hr": summary["best_hr@10"],
            "ndcg": summary["best_ndcg@10"], "best_epoch": summary["best_epoch"],
            "valid_hr": summary.get("best_valid_hr@10")}


def keep_run(runs_path: str, key: str, run: Dict) -> Dict:
    """Add ``run`` to the runs kept in ``runs_path`` (re-read first, so that two invocations on the same ``--work``
    keep each other's runs; written to a temporary name, then renamed); returns them all."""
    runs = json.load(open(runs_path)) if os.path.isfile(runs_path) else {}
    runs[key] = run
    with open(runs_path + ".tmp", "w") as f:
        json.dump(runs, f, indent=1)
    os.replace(runs_path + ".tmp", runs_path)
    return runs


def table(results: Dict, datasets: List[str], candidates: List[str], popularity: Dict) -> str:
    lines = ["| candidate | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
    for c in candidates:
        cells = []
        for d in datasets:
            r = results.get(d, {}).get(c)
            cells.append(f"{r['hr']:.3f} ({r['best_epoch']})" if r else "")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines.append("| popularity | " + " | ".join(f"{popularity[d]:.3f}" for d in datasets) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", default=os.environ.get("RECSYS_DATA_DIR", "../shared/data"))
    p.add_argument("--work", default="/tmp/ncf-cpu-rules")
    p.add_argument("--datasets", nargs="+", default=["ml1m-paper", "ml100k", *SPARSE_SETS],
                   choices=["ml1m-paper", "ml100k", *SPARSE_SETS])
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES),
                   choices=[*CANDIDATES, *MODEL_CANDIDATES, "defaults"])
    p.add_argument("--epochs", type=int, default=20, help="-e (early stopping, 5 epochs' patience, may end a run sooner)")
    p.add_argument("--sparse_epochs", type=int, default=None, help="-e on the sparse sets (default: --epochs)")
    p.add_argument("--ml1m_epochs", type=int, default=None, help="-e on ml1m-paper (default: --epochs)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    p.add_argument("--table_only", action="store_true", help="train nothing: the table of the runs already kept")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    paths = build_datasets(args.data_dir, args.work, args.datasets)
    popularity = {d: popularity_metrics(load_dataset(paths[d]), 10)["hr"] for d in args.datasets}
    runs_path = os.path.join(args.work, "runs.json")
    runs = json.load(open(runs_path)) if os.path.isfile(runs_path) else {}
    planned = {}   # (dataset, candidate) -> the key of its run
    for d in args.datasets:
        positives = len(load_dataset(paths[d]).train_users)
        epochs = {"ml1m-paper": args.ml1m_epochs or args.epochs, "ml100k": args.epochs}.get(
            d, args.sparse_epochs or args.epochs)
        for c in args.candidates:
            flags = candidate_flags(c, positives)
            planned[d, c] = (d, " ".join(flags) or "defaults", epochs, args.seed)
    todo = [] if args.table_only else sorted({key for key in planned.values()
                                              if "|".join(map(str, key)) not in runs})
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_one, paths[d], flags.split() if flags != "defaults" else [], epochs, seed,
                               os.path.join(args.work, f"{d}-{flags.replace(' ', '')}-e{epochs}-s{seed}.json")):
                   (d, flags, epochs, seed) for d, flags, epochs, seed in todo}
        for future, key in futures.items():
            r = future.result()
            print(f"{key}: HR@10 {r['hr']:.4f} (epoch {r['best_epoch']}, valid {r['valid_hr']}) in {r['wall_s']} s: "
                  f"{r['command']}", flush=True)
            runs = keep_run(runs_path, "|".join(map(str, key)), r)
    results = {}
    for (d, c), key in planned.items():
        if "|".join(map(str, key)) in runs:
            results.setdefault(d, {})[c] = runs["|".join(map(str, key))]
    report = {"results": results, "popularity": popularity, "seed": args.seed}
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(table(results, args.datasets, args.candidates, popularity))
    return report


if __name__ == "__main__":
    main()
