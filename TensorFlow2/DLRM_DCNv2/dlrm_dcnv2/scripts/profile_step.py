"""Where a training step's time goes: the TensorFlow profiler over the benchmark's step, summed by op type, as JSON.

    python -m dlrm_dcnv2.scripts.profile_step --model dlrm --shape kaggle            # float32
    python -m dlrm_dcnv2.scripts.profile_step --model dlrm --shape kaggle --amp      # mixed_bfloat16
    python -m dlrm_dcnv2.scripts.profile_step --model dcnv2 --shape kaggle --amp --top 15

Builds the same model, optimizers and ``Trainer`` as ``scripts.benchmark``'s ``ours`` side (``build_ours``) on the same
synthetic batches, runs ``--warmup_steps`` steps, then traces ``--steps`` steps with ``tf.profiler`` and reads the
trace back with TensorFlow's own converter (``framework_op_stats``, what TensorBoard's profile plugin shows). Prints
the self time of each op type per step and its share of the busy time (the profiler's ``IDLE`` left out), grouped into
the parts issue 18 asks about: ``gemm`` (oneDNN MatMul / BatchMatMul), ``embedding_gather`` (the table lookups),
``embedding_update`` (scatter-adds and sparse optimizer kernels), ``dense_optimizer``, ``casts``,
``interaction_gather`` (the DLRM interaction's pair gather and its gradient), ``bias_relu`` (bias and ReLU gradients),
``slicing_glue`` (slices, splits, concats, stacks and their gradients), ``other``. An XLA-compiled function (the
embedding update, which the trainer compiles by default, or the whole step with ``--xla``) is not in the converter's
op table: its share is the difference to a run with ``--tf_embedding_update`` (TensorFlow's own kernels), or read it
in the kept trace (``--trace_dir``).

The profiler's own overhead inflates small ops; read the shares, not the milliseconds, and compare two runs taken
back to back. ``--trace_dir`` keeps the raw trace (open it in TensorBoard); the default is a temporary directory.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence

from recsys_common.cli import InputError

GROUPS = (
    ("gemm", ("MatMul",)),
    ("embedding_gather", ("ResourceGather",)),
    ("embedding_update", ("Scatter", "ResourceSparseApply")),
    ("dense_optimizer", ("ResourceApply",)),
    ("casts", ("Cast",)),
    ("interaction_gather", ("GatherV2", "UnsortedSegmentSum")),
    ("bias_relu", ("BiasAdd", "Relu")),
    ("slicing_glue", ("StridedSlice", "Slice", "Split", "Concat", "Pack", "Unpack", "AddN")),
    ("xla_compiled", ("Xla", "__inference", "_XlaRun")),
)


def group_of(op_type: str) -> str:
    """The part of the step an op type belongs to (see the module docstring)."""
    for group, markers in GROUPS:
        if any(marker in op_type for marker in markers):
            return group
    return "other"


def summarize(rows: List[Dict[str, Any]], steps: int, top: int = 10) -> Dict[str, Any]:
    """``rows``: ``framework_op_stats`` rows (``type``, ``operation``, ``total_self_time`` in us) of ``steps`` steps
    -> busy ms per step, shares by group and by op type, and the ``top`` single ops."""
    busy = [r for r in rows if r["type"] != "IDLE"]
    total = sum(r["total_self_time"] for r in busy) or 1.0
    by_group: Dict[str, float] = defaultdict(float)
    by_type: Dict[str, float] = defaultdict(float)
    for r in busy:
        by_group[group_of(r["type"])] += r["total_self_time"]
        by_type[r["type"]] += r["total_self_time"]

    def table(d: Dict[str, float]) -> List[Dict[str, Any]]:
        return [{"name": k, "ms_per_step": v / 1e3 / steps, "share": v / total}
                for k, v in sorted(d.items(), key=lambda kv: -kv[1])]
    ops = sorted(busy, key=lambda r: -r["total_self_time"])[:top]
    return {"busy_ms_per_step": total / 1e3 / steps, "by_group": table(by_group), "by_op_type": table(by_type)[:top],
            "top_ops": [{"op": r["operation"], "type": r["type"], "ms_per_step": r["total_self_time"] / 1e3 / steps}
                        for r in ops]}


def read_op_stats(trace_dir: str) -> List[Dict[str, Any]]:
    """The ``framework_op_stats`` rows of the one ``*.xplane.pb`` under ``trace_dir``."""
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


def build_parser() -> argparse.ArgumentParser:
    from dlrm_dcnv2.scripts.benchmark import MODELS, SHAPES
    p = argparse.ArgumentParser(prog="python -m dlrm_dcnv2.scripts.profile_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="dlrm", choices=MODELS)
    p.add_argument("--shape", default="kaggle", choices=tuple(SHAPES))
    p.add_argument("--amp", action="store_true", help="mixed_bfloat16")
    p.add_argument("--xla", action="store_true", help="the whole step compiled by XLA")
    p.add_argument("--tf_embedding_update", action="store_true",
                   help="the embedding update with TensorFlow's kernels (Trainer(compile_embedding_update=False)), "
                        "as before issue 18")
    p.add_argument("--warmup_steps", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps traced")
    p.add_argument("--top", type=int, default=10, help="op types and single ops listed")
    p.add_argument("--trace_dir", default=None, help="keep the trace here (default: a temporary directory)")
    p.add_argument("--data_seed", type=int, default=12345)
    return p


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 1:
        raise InputError(f"--steps and --warmup_steps must be at least 1, got {args.steps} and {args.warmup_steps}")
    if args.trace_dir and os.path.exists(args.trace_dir) and os.listdir(args.trace_dir):
        raise InputError(f"--trace_dir {args.trace_dir} exists and is not empty")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    from dlrm_dcnv2.scripts.benchmark import SHAPES, build_ours, make_batches, machine_info

    shape = dict(SHAPES[args.shape])
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16" if args.amp else "float32")
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="dlrm_profile_")
    try:
        _, trainer, _, data = build_ours(args.model, shape, make_batches(shape, 8, args.data_seed), args.xla,
                                         compile_embedding_update=False if args.tf_embedding_update else None)
        for i in range(args.warmup_steps):
            trainer.train_step(*data[i % len(data)])
        float(trainer.train_step(*data[0]))  # the host waits: warmup done before the trace starts
        tf.profiler.experimental.start(trace_dir)
        try:
            for i in range(args.steps):
                loss = trainer.train_step(*data[i % len(data)])
            float(loss)
        finally:
            tf.profiler.experimental.stop()
        summary = summarize(read_op_stats(trace_dir), args.steps, args.top)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
        if not args.trace_dir:
            shutil.rmtree(trace_dir, ignore_errors=True)
    result = {"machine": machine_info(), "loadavg": list(os.getloadavg()), "model": args.model, "shape": args.shape,
              "precision": "mixed_bfloat16" if args.amp else "float32", "xla_step": args.xla,
              "embedding_update_xla": trainer.embedding_update_compiled, "steps": args.steps, **summary}
    if args.trace_dir:
        result["trace_dir"] = args.trace_dir
    print(json.dumps(result, indent=2), flush=True)
    return result


if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main)
