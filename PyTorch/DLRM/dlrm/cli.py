"""CPU defaults for ``python -m dlrm.scripts.main`` (issue 18): NVIDIA's GPU batch and schedule replaced on a CPU.

NVIDIA's ``--batch_size 32768`` with ``--lr 28 --warmup_steps 6400 --decay_start_step 64000 --decay_steps 80000``
made a 100k-row CPU run take 3 optimizer steps, all inside the warmup (test AUC 0.511). On a CPU, when the command
line does not set ``--batch_size``, :func:`apply_cpu_defaults` picks the batch with the repository's one rule
(:func:`recsys_common.cpu_defaults.choose_cpu_batch`), scales ``--lr`` with it (linear for SGD, NVIDIA's optimizer;
square root when ``--Adam_MLP_optimizer`` or ``--Adam_embedding_optimizer`` is on), and lays the step-based schedule
over this run as NVIDIA lays it over one Criteo-1TB epoch (:func:`recsys_common.cpu_defaults.scale_schedule_steps`).
``--test_batch_size``, when not given, is bounded by memory only. Flags given are kept; a GPU keeps NVIDIA's values.
"""
from __future__ import annotations

from typing import Optional

from recsys_common import cpu_defaults

NVIDIA_BATCH_SIZE = 32768
NVIDIA_LR = 28.0
CRITEO_1TB_TRAIN_ROWS = 4_195_197_692          # days 0-22 (reference: TorchRec's TOTAL_TRAINING_SAMPLES)
NVIDIA_RUN_STEPS = CRITEO_1TB_TRAIN_ROWS // NVIDIA_BATCH_SIZE   # 128027: NVIDIA trains one epoch
# Peak RSS per row of the batch, an upper bound: the whole 1.63 GB peak of NVIDIA's defaults (dim 128, MLPs
# 512-256-128 / 1024-1024-512-256-1) at --batch_size 32768 on 100k rows, divided by the batch (/usr/bin/time -v,
# 2026-11-25, AMD EPYC), scaled by the model's width.
BYTES_PER_ROW_NVIDIA_DLRM = 1.63e9 / NVIDIA_BATCH_SIZE
NVIDIA_DLRM_WIDTH = 26 * 128 + (512 + 256 + 128) + (1024 + 1024 + 512 + 256 + 1)
SCHEDULE_FLAGS = ("warmup_steps", "decay_start_step", "decay_steps")


def _ints(value) -> list:
    return [int(v) for v in (value.split(",") if isinstance(value, str) else value)]


def model_width(args, num_tables: int) -> int:
    return (num_tables * int(args.embedding_dim) + sum(_ints(args.bottom_mlp_sizes))
            + sum(_ints(args.top_mlp_sizes)))


def train_rows(args, info) -> Optional[int]:
    """Rows an epoch trains on: the synthetic entries, or the training files' rows (sizes only) x --dataset_subset."""
    if args.synthetic_dataset or args.dataset_type == "synthetic_gpu":
        return int(args.synthetic_dataset_num_entries)
    from recsys_common.datasets import count_rows
    rows = count_rows(info.spec, "train")
    return max(1, int(rows * args.dataset_subset)) if args.dataset_subset is not None else rows


def apply_cpu_defaults(args, device_type: str, world_size: int, info,
                       memory_bytes: Optional[int] = None) -> Optional[str]:
    """On a CPU, set ``args.batch_size`` / ``test_batch_size`` / ``lr`` / the schedule steps that the command line
    left at NVIDIA's defaults (``args.flags_given``, from ``parse``); returns the line to print (None: no change)."""
    if device_type != "cpu" or getattr(args, "flags_given", None) is None:
        return None
    given = set(args.flags_given)
    adam = args.Adam_MLP_optimizer or args.Adam_embedding_optimizer
    recipe = cpu_defaults.RecipeBatch(NVIDIA_BATCH_SIZE, NVIDIA_LR, "sqrt" if adam else "linear", "batch_size", "lr",
                                      "test_batch_size")
    training = args.mode == "train"
    rows = train_rows(args, info) if cpu_defaults.training_batch_wanted(given, recipe, training) else None
    parts, choice = cpu_defaults.apply_batch_defaults(
        args, given, recipe, world_size=world_size, training=training, train_rows=rows, memory_bytes=memory_bytes,
        bytes_per_row=BYTES_PER_ROW_NVIDIA_DLRM * model_width(args, len(info.cardinalities)) / NVIDIA_DLRM_WIDTH)
    if choice is not None:
        run_steps = (rows // choice.batch) * args.epochs   # training drops the last partial batch
        if args.max_steps:
            run_steps = min(run_steps, args.max_steps)
        schedule = cpu_defaults.apply_schedule_defaults(args, given, SCHEDULE_FLAGS, choice.batch, NVIDIA_BATCH_SIZE,
                                                        NVIDIA_RUN_STEPS, run_steps)
        if schedule:
            parts.append(schedule)
    return cpu_defaults.defaults_line("dlrm.scripts.main", parts, "--batch_size")
