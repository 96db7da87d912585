"""Where a training step's time goes: the TensorFlow profiler over the benchmark's step, summed by op type, as JSON.

    python benchmarks/profile_step.py --model dlrm --shape kaggle            # float32
    python benchmarks/profile_step.py --model dlrm --shape kaggle --amp      # mixed_bfloat16
    python benchmarks/profile_step.py --model dcnv2 --shape kaggle --amp --top 15

Builds the same model, optimizers and ``Trainer`` as ``benchmarks/throughput.py``'s ``ours`` side (``build_ours``) on the same
synthetic batches, runs ``--warmup_steps`` steps, then traces ``--steps`` steps with ``tf.profiler`` and reads the
trace back with TensorFlow's own converter (``framework_op_stats``, what TensorBoard's profile plugin shows). Prints
the self time of each op type per step and its share of the busy time (the profiler's ``IDLE`` left out;
``recsys_common.tf_profile``, which Wide & Deep's ``profile_step`` uses too), grouped into the parts issue 18 asks about
(``GROUPS``): ``gemm`` (oneDNN MatMul / BatchMatMul), ``embedding_gather`` (the table lookups),
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
import json
import os
from typing import Any, Dict, Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.tf_profile import add_profile_flags, check_profile_args, profile_steps
from throughput import MODELS, SHAPES, build_ours, machine_info, make_batches  # the sibling benchmark's model

# TensorFlow is imported in main() on purpose, after the flags are read.

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/profile_step.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="dlrm", choices=MODELS)
    p.add_argument("--shape", default="kaggle", choices=tuple(SHAPES))
    p.add_argument("--amp", action="store_true", help="mixed_bfloat16")
    p.add_argument("--xla", action="store_true", help="the whole step compiled by XLA")
    p.add_argument("--tf_embedding_update", action="store_true",
                   help="the embedding update with TensorFlow's kernels (Trainer(compile_embedding_update=False)), "
                        "as before issue 18")
    add_profile_flags(p, warmup_steps=5, steps=10)
    p.add_argument("--data_seed", type=int, default=12345)
    return p


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = build_parser().parse_args(argv)
    check_profile_args(args)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    shape = dict(SHAPES[args.shape])
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16" if args.amp else "float32")
    try:
        _, trainer, _, data = build_ours(args.model, shape, make_batches(shape, 8, args.data_seed), args.xla,
                                         compile_embedding_update=False if args.tf_embedding_update else None)
        summary = profile_steps(lambda i: trainer.train_step(*data[i % len(data)]), args.warmup_steps, args.steps,
                                GROUPS, args.top, args.trace_dir)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    result = {"machine": machine_info(), "loadavg": list(os.getloadavg()), "model": args.model, "shape": args.shape,
              "precision": "mixed_bfloat16" if args.amp else "float32", "xla_step": args.xla,
              "embedding_update_xla": trainer.embedding_update_compiled, "steps": args.steps, **summary}
    print(json.dumps(result, indent=2), flush=True)
    return result


if __name__ == "__main__":
    run_main(main)
