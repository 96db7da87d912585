"""Turn a DLLogger-compatible JSON log into PNG plots of losses, metrics, learning rate, times and throughput.

    python -m recsys_common.plot_log /results/log.json --output /results/plots

The x axis is what the log recorded as the step of each record (DLLogger's ``step`` tuple), never the record's
position in the file:

- ``step: [epoch, step]`` (PyTorch/DLRM logs ``(epoch, global_step)`` every ``--print_freq`` and ``--test_freq``
  steps): x = the training step, with a dotted line where each new epoch starts. Loggers that count steps from 0 in
  every epoch (a step that goes down when the epoch goes up) are drawn against the fractional epoch
  ``epoch + step / steps``, ``steps`` being the largest step logged in an epoch.
- ``step: [epoch]`` (PyTorch/NCF and NVIDIA's NCF log once per epoch): x = the epoch.

Parameters (``step: "PARAMETER"``) and the summary (``step: []``) are not plotted, nor data keys that repeat the step
(``epoch``, ``step``, ``global_step``). Keys are grouped by name into one PNG each: ``loss`` (``*loss*``),
``throughput`` (``*throughput*``, ``*samples/s*``, ``*_per_s*``), ``time`` (``*time*``), ``learning_rate`` (``lr``,
``*learning_rate*``) and ``metrics`` (every other number: AUC, HR@10, ...). A group whose keys were logged against
both kinds of step gets two files, ``<group>.png`` (steps) and ``<group>_by_epoch.png``.

A log whose last summary holds reliability buckets (``test_reliability_sums``: ``[rows, positives, sum of predicted
probability]`` per bucket, as ``recsys_common.metrics.reliability_sums``; PyTorch/DLRM writes them at its final
evaluation) also gets ``reliability.png``, the reliability diagram (``recsys_common.metrics.plot_reliability``), with
the whole-set calibration and NE in its title when the summary has ``test_ctr_sums`` too.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from .io import atomic_path
from .logger import read_log
from .metrics import plot_reliability

STEP_AXIS = "step"
EPOCH_AXIS = "epoch"
AXIS_LABELS = {
    STEP_AXIS: "training step (optimizer steps since the start of training)",
    EPOCH_AXIS: "epoch",
}
_STEP_KEYS = {"epoch", "step", "global_step", "iteration"}
_Y_LABELS = {"time": "seconds", "throughput": "samples/s", "learning_rate": "learning rate", "metrics": "value"}


def _group(key: str) -> str:
    k = key.lower()
    if "loss" in k:
        return "loss"
    if "throughput" in k or "samples/s" in k or "_per_s" in k or "per_second" in k:
        return "throughput"
    if "time" in k:
        return "time"
    if k == "lr" or "learning_rate" in k:
        return "learning_rate"
    return "metrics"


@dataclass
class Series:
    """One logged key: ``xs`` on the ``axis`` (``"step"`` or ``"epoch"``), values ``ys``."""
    key: str
    axis: str
    xs: List[float] = field(default_factory=list)
    ys: List[float] = field(default_factory=list)
    epochs: List[int] = field(default_factory=list)   # the epoch of each point (step axis: marks epoch starts)


def _records(path: str) -> List[Tuple[List[int], Dict[str, float]]]:
    """``(step tuple, numeric data)`` of the step-indexed LOG records, in file order."""
    out = []
    for record in read_log(path):
        step = record.get("step")
        if record.get("type", "LOG") != "LOG" or not isinstance(step, list) or not step:
            continue
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in step):
            continue
        data = {k: float(v) for k, v in (record.get("data") or {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k.lower() not in _STEP_KEYS}
        if data:
            out.append(([int(s) for s in step], data))
    return out


def collect_series(path: str) -> Dict[str, Dict[str, Series]]:
    """group -> key -> Series, each point placed at the step the log recorded for it (see module docstring)."""
    by_key: Dict[str, List[Tuple[List[int], float]]] = {}
    for step, data in _records(path):
        for key, value in data.items():
            by_key.setdefault(key, []).append((step, value))
    groups: Dict[str, Dict[str, Series]] = {}
    for key, points in by_key.items():
        if all(len(s) == 1 for s, _ in points):
            series = Series(key, EPOCH_AXIS, [float(s[0]) for s, _ in points], [v for _, v in points],
                            [s[0] for s, _ in points])
        else:
            # (epoch, step): the epoch is the first component, the step the last; a bare (epoch,) record among
            # them (e.g. an end-of-epoch line) sits at the epoch's last logged step.
            epochs = [s[0] for s, _ in points]
            steps = [s[-1] if len(s) > 1 else None for s, _ in points]
            known = [x for x in steps if x is not None]
            if any(b < a for a, b in zip(known, known[1:])):
                # Steps restart every epoch: the global position is the fractional epoch.
                per_epoch = max(max(known), 1)
                xs = [e + (x if x is not None else per_epoch) / per_epoch for e, x in zip(epochs, steps)]
                series = Series(key, EPOCH_AXIS, xs, [v for _, v in points], epochs)
            else:
                last_of_epoch: Dict[int, int] = {}
                for e, x in zip(epochs, steps):
                    if x is not None:
                        last_of_epoch[e] = max(last_of_epoch.get(e, x), x)
                xs = [float(x if x is not None else last_of_epoch.get(e, 0)) for e, x in zip(epochs, steps)]
                series = Series(key, STEP_AXIS, xs, [v for _, v in points], epochs)
        groups.setdefault(_group(key), {})[key] = series
    return groups


def _epoch_starts(series: Iterable[Series]) -> List[Tuple[float, int]]:
    """``(x, epoch)`` for each epoch after the first: a line just after the previous epoch's last logged step."""
    last: Dict[int, float] = {}
    for s in series:
        for x, e in zip(s.xs, s.epochs):
            last[e] = max(last.get(e, x), x)
    epochs = sorted(last)
    return [(last[prev], e) for prev, e in zip(epochs, epochs[1:])]


def build_figures(path: str) -> Dict[str, "object"]:
    """file name -> matplotlib Figure (not saved). Raises ValueError when the log has nothing to plot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = collect_series(path)
    if not groups:
        raise ValueError(f"{path}: no step-indexed numeric LOG records to plot")
    figures = {}
    for group, series in sorted(groups.items()):
        axes = sorted({s.axis for s in series.values()}, key=lambda a: a != STEP_AXIS)
        for axis in axes:
            chosen = [s for _, s in sorted(series.items()) if s.axis == axis]
            name = group if axis == axes[0] else f"{group}_by_{axis}"
            fig, ax = plt.subplots(figsize=(7, 4))
            for s in chosen:
                ax.plot(s.xs, s.ys, marker="o" if len(s.xs) < 50 else None, label=s.key)
            if axis == STEP_AXIS:
                for x, epoch in _epoch_starts(chosen):
                    ax.axvline(x, color="grey", linestyle=":", linewidth=1)
                    ax.annotate(f"epoch {epoch}", (x, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                                textcoords="offset points", fontsize="x-small", color="grey")
            values = [y for s in chosen for y in s.ys]
            if group in ("throughput", "time") and min(values) > 0 and max(values) > 20 * min(values):
                ax.set_yscale("log")   # e.g. train and eval throughput, an order of magnitude apart
            ax.set_xlabel(AXIS_LABELS[axis])
            ax.set_ylabel(_Y_LABELS.get(group, group))
            ax.set_title(f"{os.path.basename(path)}: {group.replace('_', ' ')}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small")
            fig.tight_layout()
            figures[f"{name}.png"] = fig
    return figures


RELIABILITY_KEY = "test_reliability_sums"
CTR_SUMS_KEY = "test_ctr_sums"


RELIABILITY_STEP = "RELIABILITY"   # the step of a record holding only these tables (the TF2 recipes write one)


def reliability_entry(ctr_sums, bucket_sums) -> dict:
    """The summary keys that let this tool draw a run's reliability diagram later: ``{test_ctr_sums,
    test_reliability_sums}`` as plain lists (``recsys_common.metrics.ctr_sums`` / ``reliability_sums``)."""
    import numpy as np
    return {CTR_SUMS_KEY: np.asarray(ctr_sums, dtype=np.float64)[:4].tolist(),
            RELIABILITY_KEY: np.asarray(bucket_sums, dtype=np.float64).tolist()}


def reliability_from_log(path: str) -> Optional[Tuple[list, Optional[list]]]:
    """``(bucket sums, ctr sums or None)`` from the last summary (``step: []``) or ``RELIABILITY`` record that has
    ``test_reliability_sums``; None when none has them."""
    found = None
    for record in read_log(path):
        data = record.get("data") or {}
        if record.get("step") in ([], RELIABILITY_STEP) and isinstance(data.get(RELIABILITY_KEY), list):
            found = (data[RELIABILITY_KEY], data.get(CTR_SUMS_KEY))
    return found


def plot(path: str, output_dir: str) -> List[str]:
    """Write one PNG per group (see module docstring) into ``output_dir``, and ``reliability.png`` when the log has
    reliability buckets; returns the paths written."""
    import matplotlib.pyplot as plt

    reliability = reliability_from_log(path)
    try:
        figures = build_figures(path)
    except ValueError:
        if reliability is None:
            raise
        figures = {}   # e.g. an evaluation-only run: a summary, no step-indexed records
    os.makedirs(output_dir, exist_ok=True)
    written = []
    if reliability is not None:
        buckets, sums = reliability
        written.append(plot_reliability(buckets, os.path.join(output_dir, "reliability.png"),
                                        f"{os.path.basename(path)}:", sums))
    for name, fig in figures.items():
        target = os.path.join(output_dir, name)
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)
        written.append(target)
    return written


def main(argv: Optional[Iterable[str]] = None) -> List[str]:
    p = argparse.ArgumentParser(prog="python -m recsys_common.plot_log",
                                description="Plot loss, metrics, learning rate, times and throughput from a DLLogger "
                                            "JSON log as PNG files, against the logged training step or epoch.")
    p.add_argument("log", help="DLLogger-compatible JSON stream (lines 'DLLL {...}')")
    p.add_argument("--output", default="plots", help="directory for the PNG files (default ./plots)")
    args = p.parse_args(None if argv is None else list(argv))
    written = plot(args.log, args.output)
    for w in written:
        print(w)
    return written


if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, input_errors=(ValueError, FileNotFoundError))
