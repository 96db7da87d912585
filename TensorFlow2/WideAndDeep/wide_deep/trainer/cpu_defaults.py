"""CPU defaults for ``main.py`` (issue 18): NVIDIA's GPU batch and learning rates replaced on a CPU.

NVIDIA's ``--global_batch_size 131072 --eval_batch_size 131072`` refused a 105k-row CPU run before its first step
(the trainer drops the last partial batch, so the training set held no batch). On a CPU (``--cpu`` or no GPU
visible), when the command line does not set ``--global_batch_size``, :func:`apply_cpu_defaults` picks the batch
with the repository's one rule (:func:`recsys_common.cpu_defaults.choose_cpu_batch`) and scales both learning rates
with it by the square root (FTRL for the wide part and RMSprop for the deep part are adaptive optimizers, like Adam).
The deep warmup is in epochs, so it needs no rescaling. ``--eval_batch_size``, when not given, is bounded by memory
only. Flags given on the command line are kept; a GPU keeps NVIDIA's values.
"""
from __future__ import annotations

from typing import Optional

from recsys_common import cpu_defaults

NVIDIA_BATCH_SIZE = 131072
NVIDIA_LINEAR_LR, NVIDIA_DEEP_LR = 0.02, 0.00012
# Peak bytes per row of the batch and per float of model width (embeddings + numericals + hidden units), taken from
# TF2 DLRM_DCNv2's measurement (196 KB per row at width 7041, same TensorFlow and Keras): 27.8 B. Checked here on the
# 105k-row run of the README (its peak at the chosen batch is below the estimate).
BYTES_PER_ROW_PER_WIDTH = 196e3 / 7041


def model_width(spec, embedding_sizes_file: str, hidden_units) -> int:
    """Floats per row that a step's activations scale with: deep embeddings, numericals and hidden layers."""
    from .dataloader import input_description
    from .model import load_embedding_sizes, resolve_embedding_sizes_path
    d = input_description(spec)
    categorical = list(d["onehot"]) + list(d["multihot"])
    dims = load_embedding_sizes(resolve_embedding_sizes_path(embedding_sizes_file), categorical)
    return sum(dims.values()) + len(d["numerical"]) + sum(hidden_units)


def apply_cpu_defaults(args, on_cpu: bool, world_size: int, spec, memory_bytes: Optional[int] = None,
                       train_rows: Optional[int] = None) -> Optional[str]:
    """On a CPU, set ``args.global_batch_size`` / ``eval_batch_size`` / both learning rates where the command line
    left NVIDIA's defaults (``args.flags_given``); returns the line to print (None: nothing changed)."""
    if not on_cpu or getattr(args, "flags_given", None) is None:
        return None
    given = set(args.flags_given)
    bytes_per_row = BYTES_PER_ROW_PER_WIDTH * model_width(spec, args.embedding_sizes_file, args.deep_hidden_units)
    parts = []
    if "eval_batch_size" not in given:
        ev = cpu_defaults.choose_cpu_batch(None, gpu_batch=NVIDIA_BATCH_SIZE, gpu_learning_rate=1.0,
                                           bytes_per_row=bytes_per_row, memory_bytes=memory_bytes,
                                           multiple_of=world_size)
        args.eval_batch_size = ev.batch
        parts.append(f"--eval_batch_size {ev.batch}")
    if not args.evaluate and "global_batch_size" not in given:
        if train_rows is None:
            from recsys_common.datasets import count_rows
            train_rows = count_rows(spec, "train")
        choice = cpu_defaults.choose_cpu_batch(
            train_rows, gpu_batch=NVIDIA_BATCH_SIZE, gpu_learning_rate=NVIDIA_DEEP_LR, bytes_per_row=bytes_per_row,
            memory_bytes=memory_bytes, lr_scaling="sqrt", batch_flag="--global_batch_size",
            lr_flag="--deep_learning_rate",
            given_learning_rate=args.deep_learning_rate if "deep_learning_rate" in given else None,
            multiple_of=world_size)
        args.global_batch_size, args.deep_learning_rate = choice.batch, choice.learning_rate
        parts.insert(0, choice.reason)
        if "linear_learning_rate" not in given:
            args.linear_learning_rate = cpu_defaults.scale_learning_rate(NVIDIA_LINEAR_LR, choice.batch,
                                                                         NVIDIA_BATCH_SIZE, "sqrt")
            parts.insert(1, f"--linear_learning_rate {args.linear_learning_rate:g} (NVIDIA's {NVIDIA_LINEAR_LR} x "
                            f"sqrt({choice.batch}/{NVIDIA_BATCH_SIZE}))")
    if not parts:
        return None
    return f"main.py: CPU defaults: {'; '.join(parts)}. Pass --global_batch_size (and the rest) to choose."
