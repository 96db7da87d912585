"""CPU defaults for a recipe's batch size and learning rate (issue 18): one rule shared by every recipe.

NVIDIA's defaults are GPU values (global batch 2**20 for NCF, 131,072 for Wide & Deep, 65,536 / 32,768 for the
DLRMs): on a laptop CPU they take one to three optimizer steps per epoch of a 100k-row dataset, or more memory than
the machine has (TF2 DLRM peaked at 14.8 GB), or refuse a dataset smaller than a batch (W&D). A recipe running on
the CPU whose command line did not set the batch flag replaces NVIDIA's batch with :func:`choose_cpu_batch`'s:

* the largest power of two (NVIDIA's are powers of two) that is at most NVIDIA's batch,
* that leaves at least ``MIN_STEPS_PER_EPOCH`` optimizer steps per epoch over the training rows,
* whose activations (the recipe's calibrated estimate of bytes per row) fit in ``MEMORY_FRACTION`` of the machine's
  RAM (total RAM, not free: every rank computes the same value and so the same batch),
* never below ``MIN_BATCH``, unless the training set itself is smaller: then the batch is the whole training set
  (one step per epoch, no row dropped).

The learning rate goes with the batch: the square-root rule for Adam-style optimizers (``lr * sqrt(b / B)``; linear
scaling would leave NCF 1/256 of its step at ``-b 4096``) and the linear rule for SGD (``lr * b / B``, Goyal et al.
2017), from NVIDIA's ``lr`` at NVIDIA's batch ``B``. A learning-rate flag the user gave is kept as given; on a GPU,
and whenever the batch flag is given (even equal to NVIDIA's value), nothing changes.

    >>> c = choose_cpu_batch(100_000, gpu_batch=65536, gpu_learning_rate=24.0, bytes_per_row=200 * 1024,
    ...                      memory_bytes=16 * 2 ** 30, lr_scaling="linear", batch_flag="--batch_size",
    ...                      lr_flag="--learning_rate")
    >>> c.batch, c.learning_rate
    (1024, 0.375)
"""
from __future__ import annotations

import argparse
import copy
import math
import os
from dataclasses import dataclass
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Sequence, Tuple

MIN_STEPS_PER_EPOCH = 100   # a CPU default batch leaves at least this many optimizer steps per epoch
MEMORY_FRACTION = 1 / 8     # of the machine's RAM, for one step's activations (shared by the ranks of one machine)
MIN_BATCH = 1024            # below this a CPU step is dominated by per-step overhead, not by arithmetic
LR_SCALINGS = ("sqrt", "linear")


@dataclass(frozen=True)
class CpuBatch:
    """A CPU default: ``batch`` and ``learning_rate`` to use, ``reason`` to print (what was chosen and why)."""
    batch: int
    learning_rate: float
    reason: str
    binding: str   # "nvidia", "steps", "memory", "floor" or "dataset": which limit decided the batch


def machine_memory_bytes() -> int:
    """Physical RAM in bytes (total, not free: every rank of a job must reach the same batch)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def given_flags(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> set:
    """The argparse destinations the command line set itself (``--batch_size 65536`` counts though it is the
    default): a second parse of the same ``argv`` with every default suppressed, so only options present remain."""
    quiet = copy.deepcopy(parser)
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    return set(vars(quiet.parse_known_args(list(argv) if argv is not None else None)[0]))


def scale_learning_rate(gpu_learning_rate: float, batch: int, gpu_batch: int, lr_scaling: str) -> float:
    """NVIDIA's rate moved to ``batch`` by the square-root or linear rule, to 3 significant digits."""
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f"lr_scaling must be one of {LR_SCALINGS}, got {lr_scaling!r}")
    ratio = batch / gpu_batch
    return float(f"{gpu_learning_rate * (math.sqrt(ratio) if lr_scaling == 'sqrt' else ratio):.3g}")


def choose_cpu_batch(train_rows: Optional[int], *, gpu_batch: int, gpu_learning_rate: float, bytes_per_row: float,
                     memory_bytes: Optional[int] = None, lr_scaling: str = "sqrt", batch_flag: str = "-b",
                     lr_flag: str = "-l", given_learning_rate: Optional[float] = None, steps_per_batch: int = 1,
                     multiple_of: int = 1, reference: str = "NVIDIA",
                     cpu_anchor: Optional[Tuple[float, int, str]] = None,
                     max_learning_rate: Optional[float] = None) -> CpuBatch:
    """The CPU default batch and learning rate (see the module docstring for the rule).

    Args:
        train_rows: rows an epoch trains on (``None`` when the recipe cannot know before reading: only memory and
            NVIDIA's value bound the batch then).
        gpu_batch, gpu_learning_rate: NVIDIA's defaults (the learning rate is scaled from them).
        bytes_per_row: the recipe's estimate of one training step's peak memory per row of the batch (calibrated
            from a measured run, documented where it is defined).
        memory_bytes: RAM to plan with (:func:`machine_memory_bytes` when ``None``).
        lr_scaling: ``"sqrt"`` (Adam, Adagrad, FTRL) or ``"linear"`` (SGD).
        batch_flag, lr_flag: the recipe's flag names, for the printed reason.
        given_learning_rate: the learning rate the user passed, kept as is (``None``: scale NVIDIA's).
        steps_per_batch: micro-batches accumulated into one optimizer step (NCF's ``--grads_accumulated``): an
            optimizer step sees ``batch * steps_per_batch`` rows, so the step count and the rate use that.
        multiple_of: the batch is a multiple of this (global batches split evenly over ``world_size`` ranks).
        reference: whose GPU values ``gpu_batch`` and ``gpu_learning_rate`` are, for the printed reason.
        cpu_anchor: ``(learning_rate, batch, who)``: a rate the recipe measured on CPUs at ``batch``, scaled from
            there (same ``lr_scaling``) instead of from the GPU rate (NCF's: NVIDIA's rate scaled down over three
            orders of magnitude of batch left a model that barely learned). ``None``: the GPU values are the anchor.
        max_learning_rate: the scaled rate is capped here (the largest rate the recipe measured to work: an anchor
            scaled to batches far from where it was measured is a guess). ``None``: no cap.
    """
    if gpu_batch < 1 or bytes_per_row <= 0 or steps_per_batch < 1 or multiple_of < 1:
        raise ValueError("gpu_batch, bytes_per_row, steps_per_batch and multiple_of must be positive")
    memory_bytes = memory_bytes or machine_memory_bytes()
    by_memory = max(int(memory_bytes * MEMORY_FRACTION / bytes_per_row), 1)
    by_data = (max(train_rows // (MIN_STEPS_PER_EPOCH * steps_per_batch), 1) if train_rows is not None
               else gpu_batch)
    limit = min(gpu_batch, by_data, by_memory)
    batch = 1 << (limit.bit_length() - 1)
    binding = "nvidia" if limit == gpu_batch else "steps" if limit == by_data else "memory"
    why = {"nvidia": f"{reference}'s value",
           "steps": f"at least {MIN_STEPS_PER_EPOCH} steps over {train_rows} training rows per epoch",
           "memory": f"about {MEMORY_FRACTION:.3g} of {memory_bytes / 2 ** 30:.1f} GiB RAM at "
                     f"{bytes_per_row / 1024:.1f} KiB per row"}[binding]
    if batch < MIN_BATCH:
        batch, binding, why = MIN_BATCH, "floor", f"the floor {MIN_BATCH}"
    if train_rows is not None and train_rows < batch * steps_per_batch:
        # A training set smaller than one batch: one step over all of it rather than a batch it cannot fill
        # (recipes that drop the last partial batch would otherwise train on nothing).
        batch = max(train_rows // steps_per_batch, 1)
        binding, why = "dataset", f"the whole training set of {train_rows} rows, smaller than the floor {MIN_BATCH}"
    batch = max(batch - batch % multiple_of, multiple_of)
    anchor_lr, anchor_batch, anchor_name = cpu_anchor or (gpu_learning_rate, gpu_batch, f"{reference}'s")
    lr = scale_learning_rate(anchor_lr, batch * steps_per_batch, anchor_batch, lr_scaling)
    rule = (f"sqrt({batch * steps_per_batch}/{anchor_batch})" if lr_scaling == "sqrt"
            else f"{batch * steps_per_batch}/{anchor_batch}")
    reason = f"{batch_flag} {batch} ({why}; {reference}'s GPU default is {gpu_batch})"
    capped = max_learning_rate is not None and lr > max_learning_rate
    if capped:
        lr = float(max_learning_rate)
    if given_learning_rate is None:
        reason += f" and {lr_flag} {lr:g} ({anchor_name} {anchor_lr:g} x {rule}{', capped' if capped else ''})"
    else:
        lr = float(given_learning_rate)
        reason += f"; {lr_flag} {lr:g} as given"
    return CpuBatch(batch, lr, reason, binding)


def scale_schedule_steps(steps: int, batch: int, gpu_batch: int, gpu_run_steps: int,
                         run_steps: Optional[int]) -> int:
    """A step count of NVIDIA's learning-rate schedule (warmup, decay start, decay length) moved to a CPU batch.

    NVIDIA's DLRM schedules are laid out over NVIDIA's run (``gpu_run_steps``: one epoch of Criteo 1TB at
    ``gpu_batch``): warmup its first 1/8, decay from 3/4 of it. The same fraction of this run (``run_steps``: its
    epochs x steps per epoch) keeps the schedule's shape whatever the dataset; scaling by samples instead
    (``steps * gpu_batch / batch``) would leave a 100k-row run inside a warmup of 524M rows. When the run's length is
    not known, scaling by samples is the fallback.
    """
    if run_steps is None:
        return int(round(steps * gpu_batch / batch))
    return int(round(steps * run_steps / gpu_run_steps))


@dataclass(frozen=True)
class RecipeBatch:
    """One recipe's NVIDIA batch defaults and the argparse destinations they live in (``--<dest>`` is the flag)."""
    gpu_batch: int              # NVIDIA's training (and evaluation) batch
    gpu_learning_rate: float    # NVIDIA's learning rate at ``gpu_batch`` (the one scaled with the batch)
    lr_scaling: str             # "sqrt" (Adam, FTRL, RMSprop) or "linear" (SGD)
    batch_dest: str             # e.g. "batch_size"
    lr_dest: str                # e.g. "lr"
    eval_batch_dest: str        # e.g. "test_batch_size"
    reference: str = "NVIDIA"   # whose GPU values these are (MLPerf's for PyTorch DLRM's --mlperf_dcnv2)


def training_batch_wanted(given_flags: AbstractSet[str], recipe: RecipeBatch, training: bool) -> bool:
    """Whether :func:`choose_batch_defaults` will choose the training batch (and so needs the training rows)."""
    return training and recipe.batch_dest not in given_flags


@dataclass(frozen=True)
class BatchDefaults:
    """What :func:`choose_batch_defaults` chose: ``values`` maps each flag's destination it set (only those the
    user did not give) to its value, ``parts`` is the line to print, ``choice`` the training batch's decision (None:
    not chosen). A recipe builds its frozen configuration from the user's flags overlaid with ``values``."""
    values: Mapping[str, Any]
    parts: Tuple[str, ...]
    choice: Optional[CpuBatch]


def choose_batch_defaults(given_flags: AbstractSet[str], recipe: RecipeBatch, *, bytes_per_row: float,
                          world_size: int, training: bool, train_rows: Optional[int],
                          given_learning_rate: Optional[float] = None,
                          memory_bytes: Optional[int] = None) -> BatchDefaults:
    """The evaluation batch (bounded by memory only) and, when ``training``, the training batch and learning rate
    of :func:`choose_cpu_batch`, each only where its flag is not in ``given_flags`` (the destinations the command
    line set; :func:`training_batch_wanted` says whether ``train_rows`` is needed, so that a recipe counts its rows
    only then). ``given_learning_rate``: the rate the user gave (kept as is). Writes nothing anywhere."""
    values: Dict[str, Any] = {}
    parts: List[str] = []
    if recipe.eval_batch_dest not in given_flags:
        evaluation = choose_cpu_batch(None, gpu_batch=recipe.gpu_batch, gpu_learning_rate=1.0,
                                      bytes_per_row=bytes_per_row, memory_bytes=memory_bytes, multiple_of=world_size)
        values[recipe.eval_batch_dest] = evaluation.batch
        parts.append(f"--{recipe.eval_batch_dest} {evaluation.batch}")
    if not training_batch_wanted(given_flags, recipe, training):
        return BatchDefaults(values, tuple(parts), None)
    choice = choose_cpu_batch(
        train_rows, gpu_batch=recipe.gpu_batch, gpu_learning_rate=recipe.gpu_learning_rate,
        bytes_per_row=bytes_per_row, memory_bytes=memory_bytes, lr_scaling=recipe.lr_scaling,
        batch_flag=f"--{recipe.batch_dest}", lr_flag=f"--{recipe.lr_dest}",
        given_learning_rate=given_learning_rate if recipe.lr_dest in given_flags else None,
        multiple_of=world_size, reference=recipe.reference)
    values[recipe.batch_dest] = choice.batch
    values[recipe.lr_dest] = choice.learning_rate
    return BatchDefaults(values, (choice.reason, *parts), choice)


def choose_schedule_defaults(given_flags: AbstractSet[str], schedule: Mapping[str, int], batch: int,
                             gpu_batch: int, gpu_run_steps: int,
                             run_steps: Optional[int]) -> Tuple[Dict[str, int], Optional[str]]:
    """Each step count of NVIDIA's schedule (``schedule``: destination -> NVIDIA's value) that is not in
    ``given_flags``, moved to this run (:func:`scale_schedule_steps`); returns the moved values and the part of the
    line to print (None: nothing moved)."""
    moved = {dest: scale_schedule_steps(steps, batch, gpu_batch, gpu_run_steps, run_steps)
             for dest, steps in schedule.items() if dest not in given_flags}
    if not moved:
        return moved, None
    how = (f"NVIDIA's schedule over {run_steps} steps as over its {gpu_run_steps}" if run_steps is not None
           else f"NVIDIA's schedule x {gpu_batch}/{batch}")
    return moved, f"{' '.join(f'--{dest} {value}' for dest, value in moved.items())} ({how})"


def defaults_line(prog: str, parts: Sequence[str], batch_flag: str) -> Optional[str]:
    """The one line a recipe prints about its CPU defaults (None when nothing was changed)."""
    if not parts:
        return None
    return f"{prog}: CPU defaults: {'; '.join(parts)}. Pass {batch_flag} (and the rest) to choose."
