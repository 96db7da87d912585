"""Benchmark: time and peak memory of the exact ROC AUC (``recsys_common.metrics``) at Criteo's test size, as JSON.

    python common/benchmarks/auc.py --rows 100000000 --peer_rows 20000000

Criteo 1TB's test half-day is about 89M rows. Each measurement runs in a fresh child process that generates
``rows`` float32 logits (labels 26 % positive, Criteo Kaggle's click rate; logits rounded to 1/1024 so that many
scores tie) and then times one AUC call. Its memory is the peak resident set *during the call* above the resident
set just before it (the peak is reset through ``/proc/self/clear_refs`` after the data are made), so the input
arrays themselves are not counted. Methods:

* ``ours``: ``recsys_common.metrics.roc_auc_score`` (sort of the larger class in float32, binary search of the
  smaller; see its docstring), at ``--rows`` and at ``--peer_rows``;
* ``float64_argsort``: the previous implementation (float64 argsort, average ranks; what both DLRM recipes ran on
  every rank after gathering every logit), at ``--peer_rows``;
* ``sklearn``: ``sklearn.metrics.roc_auc_score`` when installed, at ``--peer_rows``.

The JSON has every figure, the ratios at ``--peer_rows`` and whether all methods agree, plus the CPU model and the
load average (machines here are shared: compare the ratios, taken back to back, rather than single times).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = os.path.dirname(HERE)
sys.path.insert(0, COMMON)


def float64_argsort_auc(labels, scores):
    """The implementation ``recsys_common.metrics`` had before (kept here as the baseline)."""
    import numpy as np
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    positives = float(labels.sum())
    negatives = float(labels.size) - positives
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    counts = np.diff(np.r_[starts, scores.size])
    ranks = np.repeat(starts + (counts + 1) / 2.0, counts)
    positive_rank_sum = float(np.dot(ranks, labels[order]))
    return (positive_rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(method: str, rows: int, seed: int) -> dict:
    import numpy as np
    rng = np.random.default_rng(seed)
    labels = np.empty(rows, np.bool_)
    scores = np.empty(rows, np.float32)
    block = 1 << 22
    for start in range(0, rows, block):
        n = min(block, rows - start)
        y = rng.random(n) < 0.26
        labels[start:start + n] = y
        scores[start:start + n] = np.round((rng.standard_normal(n, np.float32) + 0.9 * y - 1.2) * 1024) / 1024
    if method == "ours":
        from recsys_common.metrics import roc_auc_score as fn
    elif method == "float64_argsort":
        fn = float64_argsort_auc
    else:
        from sklearn.metrics import roc_auc_score as fn
    with open("/proc/self/clear_refs", "w") as f:   # reset VmHWM (the peak RSS) to the current RSS
        f.write("5")
    before = _rss_kib("VmRSS")
    start = time.perf_counter()
    auc = float(fn(labels, scores))
    seconds = time.perf_counter() - start
    return {"method": method, "rows": rows, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds),
            "peak_extra_mib": round((_rss_kib("VmHWM") - before) / 1024, 1),
            "input_mib": round((labels.nbytes + scores.nbytes) / 2 ** 20, 1), "auc": auc}


def run_child(method: str, rows: int, seed: int) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", method, "--rows", str(rows),
                          "--seed", str(seed)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"method": method, "rows": rows, "error": out.stderr.strip()[-500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000_000, help="rows of the main measurement (ours)")
    p.add_argument("--peer_rows", type=int, default=20_000_000,
                   help="rows at which ours, the float64 baseline and sklearn are compared (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        print(json.dumps(child(args._child, args.rows, args.seed)))
        return {}
    from recsys_common.machine import cpu_model_name
    import importlib.util
    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "cpu": cpu_model_name(), "cores": os.cpu_count(),
              "load_average_before": [round(x, 2) for x in os.getloadavg()], "runs": []}
    result["runs"].append(run_child("ours", args.rows, args.seed))
    if args.peer_rows:
        methods = ["ours", "float64_argsort"] + (["sklearn"] if importlib.util.find_spec("sklearn") else [])
        peers = {m: run_child(m, args.peer_rows, args.seed) for m in methods}
        result["runs"] += list(peers.values())
        ours = peers["ours"]
        if "error" not in ours:
            for m, r in peers.items():
                if m != "ours" and "error" not in r:
                    result[f"speedup_vs_{m}"] = round(r["seconds"] / ours["seconds"], 2)
                    result[f"memory_ratio_{m}_over_ours"] = round(r["peak_extra_mib"] / max(ours["peak_extra_mib"], 0.1), 2)
                    result[f"auc_difference_vs_{m}"] = abs(r["auc"] - ours["auc"])
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
