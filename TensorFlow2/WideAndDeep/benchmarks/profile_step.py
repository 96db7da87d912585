"""Where this recipe's training step goes: ``tf.profiler`` over the benchmark's ``ours`` step, by part, as JSON.

    python benchmarks/profile_step.py --amp                 # mixed_bfloat16, the benchmark's default shape
    python benchmarks/profile_step.py --top 20              # float32, the 20 largest op types and ops

Builds ``benchmarks/train_step.py``'s ``ours`` side (``build_ours``: ``WideDeepModel`` and
``wide_deep.model.optimizers``'s step,
FTRL + RMSprop) on the same batches (the same model and data flags), runs ``--warmup_steps`` steps, traces
``--steps`` steps and sums the ops' self time per step by part (``recsys_common.tf_profile``; shares are of the busy
time): ``gemm`` (oneDNN MatMul, fused with bias and ReLU in the forward pass), ``dropout_random`` (the mask's random
numbers), ``dropout_apply`` (compare, select, scale, forward and backward), ``embedding_gather``,
``embedding_gradient`` (the sparse gradients' segment sums and unique ids), ``bias_relu`` (their gradients),
``casts`` (bfloat16 <-> float32), ``optimizer`` (TensorFlow's sparse FTRL; the RMSprop update is one XLA program per
variable, ``xla_compiled``), ``input_pipeline`` (``tf.data``'s iterator spans: mostly waiting, not work; the step ran at the same speed on
preloaded batches, 17.9-18.4k samples/s either way, 2026-11-25, AMD EPYC, bf16), ``other``. Ops that run side by side each count their own time (the busy time exceeds
the step's wall time on two cores), and the profiler inflates small ops: read the shares, compare runs taken back to
back. ``--trace_dir`` keeps the raw trace for TensorBoard.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.machine import cpu_bf16_instructions, cpu_model_name
from recsys_common.tf_profile import add_profile_flags, check_profile_args, profile_steps
from train_step import add_model_flags, build_ours, load_batches, make_dataset   # benchmarks/train_step.py

GROUPS = (
    ("gemm", ("MatMul",)),
    ("dropout_random", ("Random",)),
    ("dropout_apply", ("Select", "GreaterEqual", "Bitcast")),
    ("embedding_gather", ("ResourceGather", "GatherV2")),
    ("embedding_gradient", ("UnsortedSegmentSum", "Unique")),
    ("bias_relu", ("BiasAdd", "Relu")),
    ("casts", ("Cast",)),
    ("optimizer", ("ResourceSparseApply", "ResourceApply", "Scatter")),
    ("xla_compiled", ("Xla", "__inference", "_XlaRun")),
    ("input_pipeline", ("Dataset", "Iterator")),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/profile_step.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p)
    add_profile_flags(p, warmup_steps=5, steps=4)
    return p


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Profile the step; prints and returns the JSON object (settings, machine, ``by_group``, ``by_op_type``,
    ``top_ops``)."""
    args = build_parser().parse_args(argv)
    check_profile_args(args)
    data, layout = load_batches(args.dataset_path, args.global_batch_size, args.num_batches, args.cardinality_scale,
                                args.seed)
    batches = iter(make_dataset(data, args.global_batch_size))
    _, step = build_ours(layout, args.deep_hidden_units, args.deep_dropout, args.combiner, args.linear_learning_rate,
                         args.deep_learning_rate, args.xla, args.seed, amp=args.amp)
    summary = profile_steps(lambda i: step(*next(batches)), args.warmup_steps, args.steps, GROUPS, args.top,
                            args.trace_dir)
    result = {"cpu": cpu_model_name(), "cpu_bfloat16": cpu_bf16_instructions(), "cores": os.cpu_count(),
              "loadavg": list(os.getloadavg()), "precision": "mixed_bfloat16" if args.amp else "float32",
              "xla_step": args.xla, "global_batch_size": args.global_batch_size,
              "deep_hidden_units": args.deep_hidden_units, "steps": args.steps, **summary}
    print(json.dumps(result, indent=2), flush=True)
    return result


if __name__ == "__main__":
    run_main(main)
