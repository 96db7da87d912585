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
# The deep learning rate is the one scaled with the batch; the wide one follows it below.
RECIPE = cpu_defaults.RecipeBatch(NVIDIA_BATCH_SIZE, NVIDIA_DEEP_LR, "sqrt", "global_batch_size",
                                  "deep_learning_rate", "eval_batch_size")


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
    training = not args.evaluate
    if train_rows is None and cpu_defaults.training_batch_wanted(given, RECIPE, training):
        from recsys_common.datasets import count_rows
        train_rows = count_rows(spec, "train")
    parts, choice = cpu_defaults.apply_batch_defaults(
        args, given, RECIPE, world_size=world_size, training=training, train_rows=train_rows,
        memory_bytes=memory_bytes,
        bytes_per_row=BYTES_PER_ROW_PER_WIDTH * model_width(spec, args.embedding_sizes_file, args.deep_hidden_units))
    if choice is not None and "linear_learning_rate" not in given:
        args.linear_learning_rate = cpu_defaults.scale_learning_rate(NVIDIA_LINEAR_LR, choice.batch,
                                                                     NVIDIA_BATCH_SIZE, "sqrt")
        parts.insert(1, f"--linear_learning_rate {args.linear_learning_rate:g} (NVIDIA's {NVIDIA_LINEAR_LR} x "
                        f"sqrt({choice.batch}/{NVIDIA_BATCH_SIZE}))")
    return cpu_defaults.defaults_line("main.py", parts, "--global_batch_size")
