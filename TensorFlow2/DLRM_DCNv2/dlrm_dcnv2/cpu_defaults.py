"""CPU defaults for ``dlrm.py`` / ``dcnv2.py`` (issue 18): NVIDIA's GPU batch and schedule replaced on a CPU.

NVIDIA's ``--batch_size 65536 --valid_batch_size 65536`` made a 100k-row CPU run peak at 14.8 GB and take 2 steps
per epoch, inside an 8000-step warmup. On a CPU (no GPU visible, or ``--cpu``), when the command line does not set
``--batch_size``, :func:`choose_cpu_defaults` picks the batch with the repository's one rule
(:func:`recsys_common.cpu_defaults.choose_cpu_batch`), scales the learning rate with it (linear for SGD, DLRM's
optimizer; square root for Adam, DCNv2's), and lays NVIDIA's step-based schedule (warmup, decay start, decay length)
over this run as NVIDIA lays it over one Criteo-1TB epoch (:func:`recsys_common.cpu_defaults.scale_schedule_steps`).
``--valid_batch_size``, when not given, is bounded by memory only. Flags given on the command line are kept; a GPU
keeps NVIDIA's values. The choices are returned (the run's one configuration is built from them,
``dlrm_dcnv2.cli.settle``); nothing is written into the parsed flags.
"""
from __future__ import annotations

from typing import AbstractSet, Any, Dict, List, Optional, Tuple

from recsys_common import cpu_defaults

NVIDIA_BATCH_SIZE = 65536
CRITEO_1TB_TRAIN_ROWS = 4_195_197_692          # days 0-22 (reference: TorchRec's TOTAL_TRAINING_SAMPLES)
NVIDIA_RUN_STEPS = CRITEO_1TB_TRAIN_ROWS // NVIDIA_BATCH_SIZE   # 64013: NVIDIA trains one epoch
# Peak RSS per row of the batch: 14.8 GB at --batch_size/--valid_batch_size 65536 and 3.55 GB at 8192 on 100k rows
# with NVIDIA's DLRM (dim 128, MLPs 512-256-128 / 1024-1024-512-256-1; /usr/bin/time -v, 2026-11-25, AMD EPYC):
# (14.8 - 3.55) GB / 57344 rows = 196 KB per row, at that model's width below; other widths scale it.
BYTES_PER_ROW_NVIDIA_DLRM = 196e3
NVIDIA_DLRM_WIDTH = 26 * 128 + (512 + 256 + 128) + (1024 + 1024 + 512 + 256 + 1)
SCHEDULE_FLAGS = ("warmup_steps", "decay_start_step", "decay_steps")


def model_width(args, embedding_dims: List[int]) -> int:
    """Floats per row that the step's activations scale with: embeddings, MLPs and (DCNv2) the cross layers."""
    width = sum(embedding_dims) + sum(args.bottom_mlp_dims) + sum(args.top_mlp_dims)
    if args.interaction == "cross":
        width += args.num_cross_layers * (sum(embedding_dims) + args.bottom_mlp_dims[-1])
    return width


def train_rows(data) -> Optional[int]:
    """Rows of the training split (``data``: the run's ``DataConfig``, its spec parsed once): read from the files'
    sizes; None where only reading would tell (TFRecords), and for the synthetic type."""
    return data.train_rows()


def run_steps(args, batch: int, rows: Optional[int]) -> Optional[int]:
    """Optimizer steps of this run at ``batch`` (epochs x steps per epoch, capped by ``--max_steps``); None when the
    training rows are unknown. The last partial batch is trained too (``data.batch_layout``)."""
    if args.dataset_type == "synthetic":
        steps_per_epoch = args.synthetic_dataset_train_batches
    elif rows is not None:
        steps_per_epoch = -(-rows // batch)
    else:
        return None
    steps = steps_per_epoch * args.epochs
    return min(steps, args.max_steps) if args.max_steps > 0 else steps


def choose_cpu_defaults(args, model: str, given_flags: AbstractSet[str], data, *, on_gpu: bool, world_size: int,
                        embedding_dims: List[int], gpu_learning_rate: float,
                        memory_bytes: Optional[int] = None) -> Tuple[Dict[str, Any], Optional[str]]:
    """On a CPU (not ``on_gpu``), the values of ``--batch_size`` / ``--valid_batch_size`` / ``--learning_rate`` / the schedule steps
    that the command line left at NVIDIA's defaults (``given_flags``: the destinations it set); returns ``(values,
    the line to print)`` (``({}, None)`` when nothing is chosen). ``args``: the parsed flags (read, never written);
    ``data``: the run's ``DataConfig`` (its training rows are counted only when the batch is chosen);
    ``gpu_learning_rate``: the model's NVIDIA default (DLRM 24, DCNv2 0.0001)."""
    if on_gpu:
        return {}, None
    recipe = cpu_defaults.RecipeBatch(NVIDIA_BATCH_SIZE, gpu_learning_rate,
                                      "linear" if args.optimizer == "sgd" else "sqrt", "batch_size", "learning_rate",
                                      "valid_batch_size")
    training = args.mode == "train"
    rows = train_rows(data) if cpu_defaults.training_batch_wanted(given_flags, recipe, training) else None
    chosen = cpu_defaults.choose_batch_defaults(
        given_flags, recipe, world_size=world_size, training=training, train_rows=rows,
        given_learning_rate=args.learning_rate, memory_bytes=memory_bytes,
        bytes_per_row=BYTES_PER_ROW_NVIDIA_DLRM * model_width(args, embedding_dims) / NVIDIA_DLRM_WIDTH)
    values, parts = dict(chosen.values), list(chosen.parts)
    if chosen.choice is not None:
        schedule = {dest: getattr(args, dest) for dest in SCHEDULE_FLAGS}
        moved, line = cpu_defaults.choose_schedule_defaults(
            given_flags, schedule, chosen.choice.batch, NVIDIA_BATCH_SIZE, NVIDIA_RUN_STEPS,
            run_steps(args, chosen.choice.batch, rows))
        values.update(moved)
        if line:
            parts.append(line)
    return values, cpu_defaults.defaults_line(f"{model}.py", parts, "--batch_size")
