"""CPU defaults for ``dlrm.py`` / ``dcnv2.py`` (issue 18): NVIDIA's GPU batch and schedule replaced on a CPU.

NVIDIA's ``--batch_size 65536 --valid_batch_size 65536`` made a 100k-row CPU run peak at 14.8 GB and take 2 steps
per epoch, inside an 8000-step warmup. On a CPU (no GPU visible, or ``--cpu``), when the command line does not set
``--batch_size``, :func:`apply_cpu_defaults` picks the batch with the repository's one rule
(:func:`recsys_common.cpu_defaults.choose_cpu_batch`), scales the learning rate with it (linear for SGD, DLRM's
optimizer; square root for Adam, DCNv2's), and lays NVIDIA's step-based schedule (warmup, decay start, decay length)
over this run as NVIDIA lays it over one Criteo-1TB epoch (:func:`recsys_common.cpu_defaults.scale_schedule_steps`).
``--valid_batch_size``, when not given, is bounded by memory only. Flags given on the command line are kept; a GPU
keeps NVIDIA's values.
"""
from __future__ import annotations

from typing import List, Optional

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


def train_rows(args) -> Optional[int]:
    """Rows of the training split, read from the files' sizes; None where only reading would tell (TFRecords), and
    for the synthetic type (its rows are batches x batch size)."""
    if args.dataset_type != "tf_raw" or not args.dataset_path:
        return None
    from dlrm_dcnv2.dataloading.dataloader import load_spec
    from recsys_common.datasets import count_rows
    return count_rows(load_spec(args.dataset_path, args.feature_spec, "--feature_spec"), "train")


def apply_cpu_defaults(args, on_gpu: bool, world_size: int, embedding_dims: List[int],
                       gpu_learning_rate: float, memory_bytes: Optional[int] = None) -> Optional[str]:
    """On a CPU, set ``args.batch_size`` / ``valid_batch_size`` / ``learning_rate`` / the schedule steps that the
    command line left at NVIDIA's defaults (``args.flags_given``, from ``parse_args``); returns the line to print
    (None when nothing changed). ``gpu_learning_rate`` is the model's NVIDIA default (DLRM 24, DCNv2 0.0001)."""
    if on_gpu or getattr(args, "flags_given", None) is None:
        return None
    given = set(args.flags_given)
    recipe = cpu_defaults.RecipeBatch(NVIDIA_BATCH_SIZE, gpu_learning_rate,
                                      "linear" if args.optimizer == "sgd" else "sqrt", "batch_size", "learning_rate",
                                      "valid_batch_size")
    training = args.mode == "train"
    rows = train_rows(args) if cpu_defaults.training_batch_wanted(given, recipe, training) else None
    parts, choice = cpu_defaults.apply_batch_defaults(
        args, given, recipe, world_size=world_size, training=training, train_rows=rows, memory_bytes=memory_bytes,
        bytes_per_row=BYTES_PER_ROW_NVIDIA_DLRM * model_width(args, embedding_dims) / NVIDIA_DLRM_WIDTH)
    if choice is not None:
        if args.dataset_type == "synthetic":
            steps_per_epoch = args.synthetic_dataset_train_batches
        else:
            # the last partial batch is trained too (dataloader.batch_layout)
            steps_per_epoch = -(-rows // choice.batch) if rows is not None else None
        run_steps = None
        if steps_per_epoch is not None:
            run_steps = steps_per_epoch * args.epochs
            if args.max_steps > 0:
                run_steps = min(run_steps, args.max_steps)
        schedule = cpu_defaults.apply_schedule_defaults(args, given, SCHEDULE_FLAGS, choice.batch, NVIDIA_BATCH_SIZE,
                                                        NVIDIA_RUN_STEPS, run_steps)
        if schedule:
            parts.append(schedule)
    return cpu_defaults.defaults_line(f"{args.model}.py", parts, "--batch_size")
