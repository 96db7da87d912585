"""Turn a DLLogger-compatible JSON log into PNG plots: losses, metrics and throughput against step.

    python -m recsys_common.plot_log /results/log.json --output /results/plots

One PNG per group (``loss.png``, ``metrics.png``, ``throughput.png``) is written; keys are grouped by name
(``*loss*``, ``*throughput*`` / ``*samples/s*`` / ``*_per_s*``, everything else numeric is a metric). The x axis is
the running index of the LOG records that carry the key, labelled with the last step component (epoch or iteration).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Iterable, List, Optional, Tuple

from .io import atomic_path
from .logger import read_log


def _group(key: str) -> str:
    k = key.lower()
    if "loss" in k:
        return "loss"
    if "throughput" in k or "samples/s" in k or "_per_s" in k or "per_second" in k:
        return "throughput"
    return "metrics"


def collect_series(path: str) -> Dict[str, Dict[str, List[Tuple[float, float]]]]:
    """group -> key -> [(x, value)] from the step-indexed LOG records (parameters and the summary excluded)."""
    groups: Dict[str, Dict[str, List[Tuple[float, float]]]] = {}
    for index, record in enumerate(read_log(path)):
        step = record.get("step")
        if not isinstance(step, list) or not step:
            continue
        x = float(step[-1]) if len(step) == 1 else float(index)
        for key, value in (record.get("data") or {}).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            groups.setdefault(_group(key), {}).setdefault(key, []).append((x, float(value)))
    return groups


def plot(path: str, output_dir: str) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = collect_series(path)
    if not groups:
        raise ValueError(f"{path}: no step-indexed numeric LOG records to plot")
    os.makedirs(output_dir, exist_ok=True)
    written = []
    for group, series in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, points in sorted(series.items()):
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o" if len(xs) < 50 else None, label=key)
        ax.set_xlabel("step")
        ax.set_ylabel(group)
        ax.set_title(f"{os.path.basename(path)}: {group}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        target = os.path.join(output_dir, f"{group}.png")
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)
        written.append(target)
    return written


def main(argv: Optional[Iterable[str]] = None) -> List[str]:
    p = argparse.ArgumentParser(prog="python -m recsys_common.plot_log",
                                description="Plot loss, metrics and throughput from a DLLogger JSON log as PNG files.")
    p.add_argument("log", help="DLLogger-compatible JSON stream (lines 'DLLL {...}')")
    p.add_argument("--output", default="plots", help="directory for the PNG files (default ./plots)")
    args = p.parse_args(None if argv is None else list(argv))
    written = plot(args.log, args.output)
    for w in written:
        print(w)
    return written


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
