"""Where a TensorFlow training step's time goes: ``tf.profiler`` over a few steps, op self time summed by part.

Both TensorFlow recipes' ``benchmarks/profile_step.py`` tools use this (TensorFlow2/DLRM_DCNv2 and
TensorFlow2/WideAndDeep); each names the parts of its own step (``groups``). The trace is read back with
TensorFlow's own converter (``framework_op_stats``, what TensorBoard's profile plugin shows); the profiler's ``IDLE``
is left out, so shares are of the busy time. Ops that run side by side each count their own time: the busy
milliseconds per step can exceed the step's wall time, and the profiler's overhead inflates small ops, so read the
shares and compare two runs taken back to back. An XLA-compiled function is not in the op table by its ops.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .cli import InputError

Groups = Sequence[Tuple[str, Sequence[str]]]


def add_profile_flags(parser, warmup_steps: int, steps: int) -> None:
    """``--warmup_steps``, ``--steps``, ``--top``, ``--trace_dir``: what every ``profile_step`` tool takes."""
    parser.add_argument("--warmup_steps", type=int, default=warmup_steps, help="untraced steps first")
    parser.add_argument("--steps", type=int, default=steps, help="steps traced")
    parser.add_argument("--top", type=int, default=10, help="op types and single ops listed")
    parser.add_argument("--trace_dir", default=None, help="keep the trace here (default: a temporary directory)")


def check_profile_args(args) -> None:
    """Raise ``InputError`` for step counts below 1 or a ``--trace_dir`` that holds files already."""
    if args.steps < 1 or args.warmup_steps < 1:
        raise InputError(f"--steps and --warmup_steps must be at least 1, got {args.steps} and {args.warmup_steps}")
    if args.trace_dir and os.path.exists(args.trace_dir) and os.listdir(args.trace_dir):
        raise InputError(f"--trace_dir {args.trace_dir} exists and is not empty")


def group_of(op_type: str, groups: Groups) -> str:
    """The first group one of whose markers is in ``op_type`` (``"MatMul"`` matches ``_MklNativeFusedMatMul``),
    else ``"other"``."""
    for group, markers in groups:
        if any(marker in op_type for marker in markers):
            return group
    return "other"


def summarize(rows: List[Dict[str, Any]], steps: int, groups: Groups, top: int = 10) -> Dict[str, Any]:
    """``framework_op_stats`` rows (``type``, ``operation``, ``total_self_time`` in us) of ``steps`` steps -> busy ms
    per step, ms per step and share by group and by op type, and the ``top`` single ops.

    Args:
        rows: what ``read_op_stats`` returns.
        steps: the number of traced steps (the times are divided by it).
        groups: ``(name, markers)`` pairs, see ``group_of``.
        top: how many op types and single ops to list.
    Returns:
        ``{"busy_ms_per_step", "by_group", "by_op_type", "top_ops"}``.
    """
    busy = [r for r in rows if r["type"] != "IDLE"]
    total = sum(r["total_self_time"] for r in busy) or 1.0
    by_group: Dict[str, float] = defaultdict(float)
    by_type: Dict[str, float] = defaultdict(float)
    for r in busy:
        by_group[group_of(r["type"], groups)] += r["total_self_time"]
        by_type[r["type"]] += r["total_self_time"]

    def table(d: Dict[str, float]) -> List[Dict[str, Any]]:
        return [{"name": k, "ms_per_step": v / 1e3 / steps, "share": v / total}
                for k, v in sorted(d.items(), key=lambda kv: -kv[1])]
    ops = sorted(busy, key=lambda r: -r["total_self_time"])[:top]
    return {"busy_ms_per_step": total / 1e3 / steps, "by_group": table(by_group), "by_op_type": table(by_type)[:top],
            "top_ops": [{"op": r["operation"], "type": r["type"], "ms_per_step": r["total_self_time"] / 1e3 / steps}
                        for r in ops]}


def read_op_stats(trace_dir: str) -> List[Dict[str, Any]]:
    """The ``framework_op_stats`` rows of the newest ``*.xplane.pb`` under ``trace_dir``."""
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as plugin
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise RuntimeError(f"the profiler wrote no *.xplane.pb under {trace_dir}")
    data, ok = plugin.xspace_to_tools_data(sorted(paths)[-1:], "framework_op_stats", {})
    if not ok:
        raise RuntimeError(f"TensorFlow could not convert the trace {paths[-1]}")
    tables = json.loads(data)
    table = tables[0] if isinstance(tables, list) else tables
    cols = [c["id"] for c in table["cols"]]
    return [{k: (cell or {}).get("v") for k, cell in zip(cols, row["c"])} for row in table["rows"]]


def profile_steps(run_step: Callable[[int], Any], warmup_steps: int, steps: int, groups: Groups, top: int = 10,
                  trace_dir: Optional[str] = None) -> Dict[str, Any]:
    """Run ``run_step(i)`` ``warmup_steps`` times untraced, then ``steps`` times under ``tf.profiler``; summarize.

    Args:
        run_step: one training step; returns a tensor (the loss) that the host waits for before and after the trace,
            so that no warm-up work lands in it and every traced step is in it.
        warmup_steps, steps: untraced and traced step counts (at least 1 each).
        groups, top: see ``summarize``.
        trace_dir: keep the raw trace there (open it in TensorBoard); default: a temporary directory, removed.
    Returns:
        ``summarize``'s result, with ``trace_dir`` when one was given.
    """
    import tensorflow as tf
    if warmup_steps < 1 or steps < 1:
        raise ValueError(f"warmup_steps and steps must be at least 1, got {warmup_steps} and {steps}")
    directory = trace_dir or tempfile.mkdtemp(prefix="tf_profile_")
    try:
        for i in range(warmup_steps):
            out = run_step(i)
        float(tf.reduce_sum(tf.cast(out, tf.float32)))   # the host waits: warm-up done before the trace starts
        tf.profiler.experimental.start(directory)
        try:
            for i in range(steps):
                out = run_step(warmup_steps + i)
            float(tf.reduce_sum(tf.cast(out, tf.float32)))
        finally:
            tf.profiler.experimental.stop()
        summary = summarize(read_op_stats(directory), steps, groups, top)
    finally:
        if not trace_dir:
            shutil.rmtree(directory, ignore_errors=True)
    if trace_dir:
        summary["trace_dir"] = trace_dir
    return summary
