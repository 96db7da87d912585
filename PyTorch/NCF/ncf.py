"""Train and evaluate NCF (NeuMF, GMF or MLP) on a converted MovieLens-style dataset.

    python ncf.py --data /data/cache/ml-20m                                  # one process (CPU or one GPU)
    torchrun --nproc_per_node=8 ncf.py --data /data/cache/ml-20m             # DDP, NCCL on GPUs / gloo on CPU
    python -m torch.distributed.launch --nproc_per_node=8 --use_env ncf.py --data /data/cache/ml-20m

Data flow (top to bottom of :func:`run`): dataset -> device memory (:mod:`dataloading`) -> per epoch: negatives
drawn on the device, shuffled, batches of ``-b`` rows split over ranks, ``--grads_accumulated`` batches per
optimizer step -> BCE-with-logits loss (checked for NaN/inf every step) -> fused Adam -> evaluation (HR@K, NDCG@K
over each user's candidates, all-reduced over ranks) -> checkpoint when HR improves -> early stop at ``--threshold``.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import time
from contextlib import nullcontext
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from dataloading import DatasetError, EvalSet, TrainEpochs, load_dataset
from neumf import (MODEL_NAMES, build_model, fix_gmf_predictor, from_nvidia_state_dict, is_nvidia_state_dict,
                   neumf_state_from_pretrained, strip_ddp_prefix)
from recsys_common import cpu_defaults
from recsys_common.feature_spec import FeatureSpecError
from recsys_common.io import atomic_path
from recsys_common.logger import Logger

# Where and how checkpoints are written and read: checkpointing.py (these names stay importable from here).
from checkpointing import (BEST_CHECKPOINT, CHECKPOINT_FORMAT, RESUME_CHECKPOINT, CheckpointError,  # noqa: E402,F401
                           check_checkpoint_dir, check_config, kept_checkpoints, load_model_weights, save_checkpoint,
                           save_epoch, training_state)
from checkpointing import read_checkpoint as _read_checkpoint  # noqa: E402


class ConfigurationError(ValueError):
    """Flags that cannot give a meaningful result with this dataset (e.g. ``-k`` >= candidates per user)."""


class TrainingDivergedError(RuntimeError):
    """The training loss became NaN or infinite; the message names the epoch and step."""


def build_parser() -> argparse.ArgumentParser:
    """ncf.py's command line: NVIDIA's flags and defaults, then this recipe's additions."""
    p = argparse.ArgumentParser(description="Train a Neural Collaborative Filtering model")
    p.add_argument("--data", type=str, required=True, help="Path to the directory with the feature spec and data files")
    p.add_argument("--feature_spec_file", type=str, default="feature_spec.yaml",
                   help="Name of the feature spec file inside --data")
    p.add_argument("-e", "--epochs", type=int, default=30, help="Number of epochs for training")
    p.add_argument("-b", "--batch_size", type=int, default=2 ** 20,
                   help="Number of examples for each iteration (global, over all processes); "
                        "on CPU, when not given, chosen from the data and RAM (see the first line of output)")
    p.add_argument("--valid_batch_size", type=int, default=2 ** 20, help="Number of examples in each validation chunk")
    p.add_argument("-f", "--factors", type=int, default=64, help="Number of predictive factors")
    p.add_argument("--layers", nargs="+", type=int, default=[256, 256, 128, 64], help="Sizes of hidden layers for MLP")
    p.add_argument("-n", "--negative_samples", type=int, default=4, help="Number of negative examples per interaction")
    p.add_argument("-l", "--learning_rate", type=float, default=0.0045,
                   help="Learning rate for optimizer; scaled by sqrt(batch / 2**20) when the CPU chooses -b")
    p.add_argument("-k", "--topk", type=int, default=10, help="Rank for test examples to be considered a hit")
    p.add_argument("--seed", "-s", type=int, default=None, help="Manually set random seed for torch")
    p.add_argument("--threshold", "-t", type=float, default=1.0, help="Stop training early at threshold")
    p.add_argument("--beta1", "-b1", type=float, default=0.25, help="Beta1 for Adam")
    p.add_argument("--beta2", "-b2", type=float, default=0.5, help="Beta2 for Adam")
    p.add_argument("--eps", type=float, default=1e-8, help="Epsilon for Adam")
    p.add_argument("--dropout", type=float, default=0.5,
                   help="Dropout probability, if equal to 0 will not use dropout at all")
    p.add_argument("--checkpoint_dir", type=str, default="",
                   help="Path to the directory storing the checkpoint file, passing an empty path disables checkpoint saving")
    p.add_argument("--load_checkpoint_path", type=str, default=None,
                   help="Path to the checkpoint file to be loaded before training/evaluation")
    p.add_argument("--mode", choices=("train", "test"), default="train",
                   help='Passing "test" will only run a single evaluation; otherwise full training will be performed')
    p.add_argument("--grads_accumulated", type=int, default=1,
                   help="Number of gradients to accumulate before performing an optimization step "
                        "(each of -b rows: N times the batch per step, as NVIDIA's)")
    p.add_argument("--amp", action="store_true",
                   help="Enable mixed precision (bf16 autocast on CPU; fp16 + GradScaler on CUDA unless --amp_dtype bf16)")
    p.add_argument("--log_path", type=str, default="log.json", help="Path for the JSON training log")
    # ---- beyond NVIDIA's flags
    p.add_argument("--model", choices=MODEL_NAMES, default="neumf",
                   help="NCF instantiation: NeuMF, or the paper's GMF / MLP baselines")
    p.add_argument("--amp_dtype", choices=("auto", "fp16", "bf16"), default="auto",
                   help="Autocast dtype with --amp; auto = fp16 on CUDA, bf16 on CPU")
    p.add_argument("--resume", action="store_true",
                   help=f"Resume the interrupted run saved in --checkpoint_dir/{RESUME_CHECKPOINT} (exactly)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="Where to train; auto = CUDA when available")
    p.add_argument("--apex_fused_adam", action="store_true",
                   help="Use apex.optimizers.FusedAdam (must be installed) instead of torch.optim.Adam(fused=True)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the training step (forward + loss + backward: fused ReLU/dropout/bf16 casts); "
                        "the first steps pay the compilation")
    p.add_argument("--exclude_positives", action="store_true",
                   help="Draw training negatives among the items each user has no training interaction with (the NCF "
                        "paper's sampling); default: NVIDIA's approximate sampling, uniform over all items")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                   help="adam: Adam with -l/-b1/-b2/--eps (NVIDIA's); sgd: plain SGD with -l (the NCF paper's choice for "
                        "NeuMF initialised from --pretrained_gmf/--pretrained_mlp)")
    p.add_argument("--l2_embedding", type=float, default=0.0,
                   help="L2 regularisation of the embeddings: adds this times each row's squared norm of the "
                        "user and item vectors it looks up to the loss (0: none, NVIDIA's)")
    p.add_argument("--pretrained_gmf", type=str, default=None,
                   help="With --model neumf: initialise from this --model gmf checkpoint and --pretrained_mlp's, as "
                        "the NCF paper does (predictor = [alpha * h_GMF ; (1 - alpha) * h_MLP])")
    p.add_argument("--pretrained_mlp", type=str, default=None,
                   help="With --model neumf: the --model mlp checkpoint paired with --pretrained_gmf")
    p.add_argument("--alpha", type=float, default=0.5,
                   help="Weight of the GMF branch when fusing --pretrained_gmf and --pretrained_mlp (the paper's 0.5)")
    p.add_argument("--learning_rate_decay", type=float, default=1.0,
                   help="Multiply the learning rate by this after every epoch: epoch e trains at -l x this^e "
                        "(1: constant, NVIDIA's)")
    p.add_argument("--embedding_init_std", type=float, default=0.01,
                   help="Standard deviation of the normal distribution the embeddings are drawn from (0.01: NVIDIA's; "
                        "Rendle et al.'s MF uses 0.1)")
    p.add_argument("--gmf_dot_product", action="store_true",
                   help="With --model gmf: fix the predictor weights h to ones, making GMF the plain dot product "
                        "p_u . q_i + b (matrix factorisation, as Rendle et al. train it with SGD)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None,
                   help="Set by torch.distributed.launch; LOCAL_RANK from the environment is used otherwise")
    return p


given_flags = cpu_defaults.given_flags  # the one implementation, shared with the other recipes


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.explicit = given_flags(p, argv)
    checks = [(args.epochs >= 0, "--epochs must be >= 0"), (args.batch_size > 0, "--batch_size must be > 0"),
              (args.valid_batch_size > 0, "--valid_batch_size must be > 0"), (args.factors > 0, "--factors must be > 0"),
              (all(s > 0 for s in args.layers), "--layers must be positive"),
              (args.negative_samples >= 0, "--negative_samples must be >= 0"), (args.topk > 0, "--topk must be > 0"),
              (0 <= args.dropout < 1, "--dropout must be in [0, 1)"),
              (args.grads_accumulated > 0, "--grads_accumulated must be > 0")]
    for ok, message in checks:
        if not ok:
            p.error(message)
    if args.resume and not args.checkpoint_dir:
        p.error("--resume needs --checkpoint_dir")
    if bool(args.pretrained_gmf) != bool(args.pretrained_mlp):
        p.error("--pretrained_gmf and --pretrained_mlp go together")
    if args.pretrained_gmf and args.model != "neumf":
        p.error("--pretrained_gmf/--pretrained_mlp initialise --model neumf")
    if args.pretrained_gmf and args.load_checkpoint_path:
        p.error("--pretrained_gmf/--pretrained_mlp and --load_checkpoint_path both set the initial weights: give one")
    if not 0 <= args.alpha <= 1:
        p.error("--alpha must be in [0, 1]")
    if args.l2_embedding < 0:
        p.error("--l2_embedding must be >= 0")
    if not 0 < args.learning_rate_decay <= 1:
        p.error("--learning_rate_decay must be in (0, 1]")
    if args.embedding_init_std <= 0:
        p.error("--embedding_init_std must be > 0")
    if args.gmf_dot_product and args.model != "gmf":
        p.error("--gmf_dot_product applies to --model gmf (a fused NeuMF learns its predictor)")
    return args


# ------------------------------------------------------------------------------------------------ CPU defaults
# The rule is recsys_common.cpu_defaults' (shared by every recipe); NCF supplies NVIDIA's values and its memory model.
NVIDIA_BATCH_SIZE, NVIDIA_LEARNING_RATE = 2 ** 20, 0.0045  # tuned for one 32-80 GB GPU on ML-20m
CPU_MIN_STEPS_PER_EPOCH = cpu_defaults.MIN_STEPS_PER_EPOCH
CPU_MEMORY_FRACTION = cpu_defaults.MEMORY_FRACTION
CPU_MIN_BATCH = cpu_defaults.MIN_BATCH
# Peak RSS of one training step per row and per float of width (2 f + L0 + sum(layers)): 5.30 GB at -b 2**20 with
# NVIDIA's model (width 1088) on ML-100k, measured with /usr/bin/time -v (2026-11-25, AMD EPYC): 4.6 bytes.
BYTES_PER_ROW_PER_WIDTH = 4.6
machine_memory_bytes = cpu_defaults.machine_memory_bytes


def choose_cpu_batch(train_rows: int, factors: int, layers: List[int], memory_bytes: int,
                     grads_accumulated: int = 1, given_learning_rate: Optional[float] = None):
    """(batch_size, learning_rate, reason): a CPU default for -b / -l in place of NVIDIA's GPU values.

    :func:`recsys_common.cpu_defaults.choose_cpu_batch` with NVIDIA's -b 2**20 / -l 0.0045, the square-root rule
    (Adam) and this model's activations per row (``BYTES_PER_ROW_PER_WIDTH`` x its widths). -b is global: ranks on
    one machine split its rows, so their activations add up to the same. An optimizer step sees
    ``-b x --grads_accumulated`` rows, which is what the step count and the rate use.
    """
    width = 2 * factors + layers[0] + sum(layers)
    c = cpu_defaults.choose_cpu_batch(train_rows, gpu_batch=NVIDIA_BATCH_SIZE, gpu_learning_rate=NVIDIA_LEARNING_RATE,
                                      bytes_per_row=BYTES_PER_ROW_PER_WIDTH * width, memory_bytes=memory_bytes,
                                      lr_scaling="sqrt", batch_flag="-b", lr_flag="-l",
                                      given_learning_rate=given_learning_rate, steps_per_batch=grads_accumulated)
    return c.batch, c.learning_rate, c.reason


def apply_cpu_defaults(args: argparse.Namespace, device: torch.device, train_rows: int,
                       memory_bytes: Optional[int] = None) -> Optional[str]:
    """On CPU, replace NVIDIA's -b (and -l with it) unless the command line set -b; returns the line to print.

    -l given alone is kept; -b given keeps NVIDIA's -l unless -l is given too. ``args.explicit`` (from
    :func:`parse_args`) lists what the command line set; a Namespace without it (built in code) is left as is.
    """
    explicit = getattr(args, "explicit", None)
    if device.type != "cpu" or explicit is None or "batch_size" in explicit or args.mode != "train":
        return None
    given_lr = args.learning_rate if "learning_rate" in explicit else None
    batch, lr, reason = choose_cpu_batch(train_rows, args.factors, args.layers,
                                         memory_bytes or machine_memory_bytes(), args.grads_accumulated, given_lr)
    args.batch_size, args.learning_rate = batch, lr
    return f"ncf.py: CPU defaults: {reason}. Pass -b (and -l) to choose."


# ------------------------------------------------------------------------------------------------ distributed
def init_distributed(args: argparse.Namespace):
    """(rank, world_size, device). Multi-process when WORLD_SIZE > 1: NCCL on GPUs, gloo on CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank if args.local_rank is not None else 0))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world_size > 1:
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        return dist.get_rank(), dist.get_world_size(), device
    return 0, 1, device


def shutdown_distributed(barrier: bool = True) -> None:
    """Tear the process group down on this rank, after :func:`run` has returned (its DDP model is gone).

    The repository's one teardown (:mod:`recsys_common.torch_distributed` explains the gloo abort at exit, "terminate
    called without an active exception", that it prevents). :func:`main` calls it on every exit, ``barrier=False``
    on an error (a rank that failed must not wait for ranks that may still be inside a collective). Safe without a
    group and safe to call twice.
    """
    from recsys_common.torch_distributed import shutdown_process_group
    shutdown_process_group(barrier=barrier)


def all_reduce_sum(values: List[float], device: torch.device) -> List[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def agree_on_seed(seed: Optional[int], device: torch.device) -> int:
    """The seed every rank uses: --seed, or one random draw on rank 0 broadcast to the others."""
    if seed is None:
        seed = random.SystemRandom().randrange(2 ** 31)
        if dist.is_initialized():
            t = torch.tensor([seed], dtype=torch.int64, device=device)
            dist.broadcast(t, src=0)
            seed = int(t.item())
    return seed


# ------------------------------------------------------------------------------------------------ allocator
def keep_freed_memory() -> bool:
    """Make glibc keep freed memory in the process instead of handing it back to the kernel. Returns whether it did.

    With glibc's defaults every block above the mmap threshold (at most 32 MB) is mmap'd and munmap'd, and a large
    free top of the heap is trimmed. A training step at ``-b 1048576`` allocates and frees several GB of
    activations and gradients, so every step faulted those pages in again: system time as large as user time on
    a 2-core VM. ``M_MMAP_MAX = 0`` serves big blocks from the heap and ``M_TRIM_THRESHOLD = -1`` (SIZE_MAX)
    never trims it, so the pages of one step are reused by the next (the same effect as the environment variables
    ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...``, set here because they must exist before the process
    starts). Peak memory is unchanged; the process keeps its high-water mark. No-op off glibc.
    """
    from recsys_common.machine import glibc_malloc_options
    return glibc_malloc_options(mmap_max=0, trim_threshold=-1)


# ------------------------------------------------------------------------------------------------ precision
def autocast_for(args: argparse.Namespace, device: torch.device):
    """(autocast context factory, GradScaler-or-None)."""
    if not args.amp:
        return nullcontext, None
    dtype = args.amp_dtype
    if dtype == "auto":
        dtype = "fp16" if device.type == "cuda" else "bf16"
    if dtype == "fp16" and device.type != "cuda":
        raise ValueError("--amp_dtype fp16 needs CUDA; on CPU use bf16")
    torch_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda") if dtype == "fp16" else None
    return (lambda: torch.autocast(device_type=device.type, dtype=torch_dtype)), scaler


def make_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    betas = (args.beta1, args.beta2)
    if args.apex_fused_adam:
        try:
            from apex.optimizers import FusedAdam  # only in NGC images / source builds of NVIDIA apex
        except ImportError as err:
            raise RuntimeError("--apex_fused_adam: NVIDIA apex is not installed (use the default fused torch Adam)") \
                from err
        return FusedAdam(model.parameters(), lr=args.learning_rate, betas=betas, eps=args.eps)
    if getattr(args, "optimizer", "adam") == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.learning_rate, foreach=True)
    return torch.optim.Adam(model.parameters(), lr=args.learning_rate, betas=betas, eps=args.eps, fused=True)


def epoch_learning_rate(learning_rate: float, decay: float, epoch: int) -> float:
    """The rate epoch ``epoch`` (0-based) trains at with ``--learning_rate_decay``: ``learning_rate * decay ** epoch``.

    A function of the epoch alone (no scheduler state), so a resumed run continues at the rate it stopped at.

    >>> [round(epoch_learning_rate(0.002, 0.9, e), 6) for e in range(3)]
    [0.002, 0.0018, 0.00162]
    """
    return learning_rate * decay ** epoch


def set_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate


# ------------------------------------------------------------------------------------------------ checkpoints
def model_config(args: argparse.Namespace, num_users: int, num_items: int) -> Dict:
    import checkpointing
    return checkpointing.model_config(args.model, num_users, num_items, args.factors, args.layers, args.dropout)


# ------------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model: nn.Module, test: EvalSet, topk: int, valid_batch_size: int, autocast) -> Dict[str, float]:
    """HR@K and NDCG@K over all ranks' users (all-reduced), and the validation BCE over all candidates.

    A user's positive ranks ``r`` = number of its (non-duplicate) negatives scoring at least as high (ties count
    against the positive, as the NCF paper's evaluation does); hit if ``r < K``, NDCG = ``1 / log2(r + 2)``.

    A NaN score compares false with everything, so a NaN positive would rank first (a hit with NDCG 1) and a NaN
    negative would never beat the positive: a user with a NaN score among its ranked candidates (the positive or any
    non-duplicate negative) is counted as a miss, so a diverged model scores HR 0, not 1. ``nan_users`` counts them.
    """
    model.eval()
    users, candidates = test.users, test.candidates
    n_users, samples = candidates.shape
    check_topk(topk, samples)
    flat_users = users.repeat_interleave(samples)
    flat_items = candidates.reshape(-1)
    scores = torch.empty(flat_items.shape[0], dtype=torch.float32, device=flat_items.device)
    for lo in range(0, flat_items.shape[0], valid_batch_size):
        with autocast():
            scores[lo: lo + valid_batch_size] = model(flat_users[lo: lo + valid_batch_size],
                                                      flat_items[lo: lo + valid_batch_size]).float()
    scores = scores.view(n_users, samples)
    labels = torch.zeros_like(scores)
    labels[:, 0] = 1.0
    bce = nn.functional.binary_cross_entropy_with_logits(scores, labels, reduction="sum") if n_users else \
        torch.zeros((), device=scores.device)
    hits, ndcg, unrankable = rank_positives(scores, test.mask, topk)
    total_hits, total_ndcg, total_bce, total_users, nan_users = all_reduce_sum(
        [float(hits.sum()), float(ndcg.sum()), float(bce), float(n_users), float(unrankable.sum())], scores.device)
    return {"hr": total_hits / total_users, "ndcg": total_ndcg / total_users,
            "val_loss": total_bce / (total_users * samples), "eval_rows": total_users * samples,
            "nan_users": int(nan_users)}


def rank_positives(scores: torch.Tensor, mask: torch.Tensor, topk: int):
    """The ranking rule of :func:`evaluate`, also applied to served scores by ``deployment/evaluate_accuracy.py``
    (one rule, so trained and served evaluation cannot disagree). ``scores [U, S]`` has the positive in column 0;
    ``mask [U, S]`` is True for candidates repeating an earlier one (``dataloading.duplicate_mask``: not ranked).

    Returns per-user ``hits`` (bool), ``ndcg`` (float64, 0 for a miss) and ``unrankable`` (a NaN among the ranked
    candidates: counted as a miss).

    >>> hits, ndcg, nan = rank_positives(torch.tensor([[0.9, 0.1, 0.9], [0.2, 0.5, 0.1]]),
    ...                                  torch.zeros(2, 3, dtype=torch.bool), topk=2)
    >>> hits.tolist(), ndcg.tolist(), nan.tolist()
    ([True, True], [0.6309297535714575, 0.6309297535714575], [False, False])
    """
    ranked = scores.masked_fill(mask, float("-inf"))
    unrankable = torch.isnan(ranked).any(dim=1)
    rank = (ranked[:, 1:] >= ranked[:, :1]).sum(dim=1)
    hits = (rank < topk) & ~unrankable
    ndcg = torch.where(hits, 1.0 / torch.log2(rank.double() + 2.0), torch.zeros((), dtype=torch.float64,
                                                                                  device=rank.device))
    return hits, ndcg, unrankable


def check_topk(topk: int, samples_per_series: int, origin: str = "the test set") -> None:
    """``-k`` must be below the candidates per user: with K >= S every positive ranks below K, so HR@K = 1."""
    if topk >= samples_per_series:
        raise ConfigurationError(
            f"-k/--topk {topk} must be below the number of candidates per user in {origin} "
            f"({samples_per_series} = 1 positive + {samples_per_series - 1} negatives, "
            f"metadata.test_samples_per_series): with K >= {samples_per_series} every user counts as a hit")


# ------------------------------------------------------------------------------------------------ training
def check_finite_loss(step_loss: torch.Tensor, epoch: int, step: int, steps: int, world_size: int) -> None:
    """Raise :class:`TrainingDivergedError` if this step's loss is NaN or infinite on any rank.

    The losses are summed over ranks first, so that every rank sees the same verdict and stops at the same step
    (one rank leaving alone would leave the others waiting in the next collective). Costs one host sync per step.
    """
    total = step_loss.detach().clone()
    if world_size > 1 and dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    value = float(total)
    if not math.isfinite(value):
        raise TrainingDivergedError(f"epoch {epoch}, step {step} (of {steps}): the training loss is {value}"
                                    f"{' on at least one rank' if world_size > 1 else ''}")


def embedding_tables(model: nn.Module):
    """``[(embedding, "user" | "item")]`` of ``model`` (a DDP wrapper is looked through)."""
    module = getattr(model, "module", model)
    return [(m, "user" if name.endswith("user_embedding") else "item") for name, m in module.named_modules()
            if isinstance(m, nn.Embedding) and name.endswith(("user_embedding", "item_embedding"))]


def batch_loss_fn(model: nn.Module, autocast, l2_embedding: float = 0.0):
    """``loss(users, items, labels)``: the summed BCE-with-logits of ``model`` on one batch (float32 loss), plus
    ``l2_embedding`` times the summed squared norms of the embedding rows the batch looks up (each row's user and
    item vectors of every branch; the caller's division by the rows makes it a per-row mean).

    The forward pass runs under ``autocast()``; the logits are cast to float32 before the loss. The penalty covers
    only the rows in the batch (as the NCF paper's per-batch regulariser and Rendle et al.'s MF do), so an item
    is pulled toward zero in proportion to how often it is sampled.
    """
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
    tables = embedding_tables(model) if l2_embedding else []

    def loss(users: torch.Tensor, items: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with autocast():
            logits = model(users, items)
        total = loss_fn(logits.float(), labels)
        for table, kind in tables:
            total = total + l2_embedding * table(users if kind == "user" else items).float().pow(2).sum()
        return total
    return loss


def compiled_batch_loss(model: nn.Module, autocast, l2_embedding: float = 0.0):
    """:func:`batch_loss_fn` through ``torch.compile``: one graph for embedding lookups, MLP (ReLU, dropout and the
    bf16 casts fused into the matmuls' neighbours), predictor and loss, and its backward.

    Compilation wraps the training step only: ``model`` stays the eager module (its ``state_dict`` keys, and its
    eval-mode forward for TorchScript/ONNX export, are unchanged). ``dynamic=False``: a run has two batch sizes
    (full and the last, partial one), each compiled once.
    """
    return torch.compile(batch_loss_fn(model, autocast, l2_embedding), dynamic=False)


def train_epoch(model: nn.Module, optimizer, scaler, autocast, batches, grads_accumulated: int,
                world_size: int, epoch: int = 0, steps: Optional[int] = None, batch_loss=None,
                l2_embedding: float = 0.0) -> float:
    """One pass; returns the mean training loss of this rank.

    Each optimizer step accumulates the gradients of ``grads_accumulated`` consecutive batches (NVIDIA's semantics:
    N batches of ``-b`` rows per step); its gradient is the mean over all their rows, so N batches of ``b`` rows give
    the step of one batch of ``N * b`` rows. A last group of fewer batches is still applied (no data is dropped).
    Every step's loss is checked before the optimizer applies it (:func:`check_finite_loss`). ``batch_loss``
    (default: :func:`batch_loss_fn` of ``model``) computes a batch's summed loss, e.g. a compiled one.
    """
    model.train()
    batch_loss = batch_loss or batch_loss_fn(model, autocast, l2_embedding)
    device = next(model.parameters()).device
    loss_sum, rows = torch.zeros((), dtype=torch.float64, device=device), 0
    batches = iter(batches)
    for step in itertools.count():
        group = list(itertools.islice(batches, grads_accumulated))
        if not group:
            break
        group_rows = sum(users.shape[0] for users, _, _ in group)
        step_loss = torch.zeros((), dtype=torch.float64, device=device)
        for j, (u, i, y) in enumerate(group):
            # Intermediate batches skip DDP's all-reduce; the last one syncs the accumulated gradient.
            sync = j == len(group) - 1 or not hasattr(model, "no_sync")
            with (nullcontext() if sync else model.no_sync()):
                loss = batch_loss(u, i, y) / group_rows  # mean over all rows of this step (local)
                (scaler.scale(loss) if scaler else loss).backward()
            step_loss += loss.detach().double()
        check_finite_loss(step_loss, epoch, step, steps, world_size)
        loss_sum += step_loss * group_rows
        rows += group_rows
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return float(loss_sum) / max(rows, 1)


def run(args: argparse.Namespace) -> Dict:
    """Everything :func:`main` does; returns the summary (also logged). Raises on bad input."""
    rank, world_size, device = init_distributed(args)
    # Every refusal comes before the log is opened, so that a refused run leaves no trace (and no clobbered log).
    data = load_dataset(args.data, args.feature_spec_file)
    check_topk(args.topk, data.samples_per_series, os.path.join(args.data, args.feature_spec_file))
    cpu_defaults = apply_cpu_defaults(args, device, len(data.train_users) * (1 + args.negative_samples))
    if cpu_defaults and rank == 0:
        print(cpu_defaults, flush=True)
    if args.mode == "train":
        check_checkpoint_dir(args.checkpoint_dir, rank, device)
    resume_state = None
    if args.resume:
        resume_path = os.path.join(args.checkpoint_dir, RESUME_CHECKPOINT)
        resume_state = _read_checkpoint(resume_path)
        if "epoch" not in resume_state:
            raise CheckpointError(f"{resume_path}: has no training state to resume from")
        if args.seed is None:
            args.seed = int(resume_state["seed"])
        elif args.seed != int(resume_state["seed"]):
            raise CheckpointError(f"{resume_path}: saved by a run with --seed {resume_state['seed']}, "
                                  f"this run has --seed {args.seed}: an exact resume needs the same seed")
    seed = agree_on_seed(args.seed, device)
    torch.manual_seed(seed)
    config = model_config(args, data.num_users, data.num_items)
    model = build_model(args.model, data.num_users, data.num_items, args.factors, args.layers,
                        args.dropout, args.embedding_init_std).to(device)
    if args.gmf_dot_product:
        fix_gmf_predictor(model)  # before any weights are loaded: a checkpoint of it holds the same ones
    weights_path = args.load_checkpoint_path
    if args.mode == "test" and not weights_path and not args.pretrained_gmf:
        # NVIDIA's behaviour: test mode evaluates the best checkpoint of --checkpoint_dir (--pretrained_gmf/_mlp
        # instead: the fused NeuMF as initialised, before any training)
        weights_path = os.path.join(args.checkpoint_dir, BEST_CHECKPOINT) if args.checkpoint_dir else None
        if not weights_path or not os.path.isfile(weights_path):
            raise CheckpointError("--mode test needs --load_checkpoint_path, or --checkpoint_dir holding "
                                  f"{BEST_CHECKPOINT}")
    if weights_path:
        load_model_weights(model, _read_checkpoint(weights_path)["model"], weights_path)
    if args.pretrained_gmf and resume_state is None:
        try:
            fused = neumf_state_from_pretrained(_read_checkpoint(args.pretrained_gmf)["model"],
                                                _read_checkpoint(args.pretrained_mlp)["model"], args.alpha)
        except ValueError as err:
            raise CheckpointError(f"--pretrained_gmf {args.pretrained_gmf} / --pretrained_mlp "
                                  f"{args.pretrained_mlp}: {err}") from err
        load_model_weights(model, fused, f"{args.pretrained_gmf} + {args.pretrained_mlp}")
    autocast, scaler = autocast_for(args, device)
    optimizer = make_optimizer(args, model)
    start_epoch, best = 0, {"hr": -1.0, "ndcg": 0.0, "epoch": -1}
    elapsed, time_to_target = 0.0, None
    if resume_state is not None:
        check_config(resume_state, config, resume_path)   # names every differing field, as the other recipes
        load_model_weights(model, resume_state["model"], resume_path)
        optimizer.load_state_dict(resume_state["optimizer"])
        if scaler is not None and resume_state.get("scaler"):
            scaler.load_state_dict(resume_state["scaler"])
        start_epoch = int(resume_state["epoch"]) + 1
        best = {"hr": float(resume_state["best_hr"]), "ndcg": float(resume_state["best_ndcg"]),
                "epoch": int(resume_state["best_epoch"])}
        elapsed = float(resume_state["elapsed"])
        time_to_target = resume_state.get("time_to_target")
    # A resumed run continues the earlier run's log (as DLRM's does) instead of replacing it.
    logger = Logger(args.log_path, rank=rank, append=resume_state is not None)
    for metric, unit in (("train_throughput", "samples/s"), ("eval_throughput", "samples/s"),
                         ("time_to_target", "s"), ("epoch_time", "s"), ("train_epoch_time", "s"),
                         ("validation_epoch_time", "s")):
        logger.metadata(metric, {"unit": unit})

    test = EvalSet(data, rank, world_size, device)
    ddp_model = model
    if world_size > 1:
        ddp_model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    params = dict({k: v for k, v in vars(args).items() if k != "explicit"}, cpu_defaults=cpu_defaults, seed=seed, world_size=world_size, device=str(device), num_users=data.num_users,
                  num_items=data.num_items, train_positives=len(data.train_users),
                  test_samples_per_series=data.samples_per_series)
    logger.log_parameters(params)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if args.mode == "test":
        sync(); t0 = time.perf_counter()
        metrics = evaluate(model, test, args.topk, args.valid_batch_size, autocast)
        sync(); seconds = time.perf_counter() - t0
        summary = {f"hr@{args.topk}": metrics["hr"], f"ndcg@{args.topk}": metrics["ndcg"],
                   "val_loss": metrics["val_loss"], "eval_throughput": metrics["eval_rows"] / seconds}
        logger.log_summary(summary)
        logger.close()
        return summary

    train = TrainEpochs(data.train_users, data.train_items, data.num_items, args.negative_samples,
                        args.batch_size, rank, world_size, device, exclude_positives=args.exclude_positives)
    batch_loss = (compiled_batch_loss if args.compile else batch_loss_fn)(ddp_model, autocast, args.l2_embedding)
    best_train_tp, best_eval_tp, last = 0.0, 0.0, {}
    steps_per_epoch = -(-train.steps_per_epoch // args.grads_accumulated)  # optimizer steps
    for epoch in range(start_epoch, args.epochs):
        torch.manual_seed(seed * 7919 + epoch * 104729 + rank)  # dropout stream of this epoch: resume is exact
        set_learning_rate(optimizer, epoch_learning_rate(args.learning_rate, args.learning_rate_decay, epoch))
        sync(); t0 = time.perf_counter()
        try:
            loss = train_epoch(ddp_model, optimizer, scaler, autocast, train.epoch(seed, epoch),
                               args.grads_accumulated, world_size, epoch=epoch, steps=steps_per_epoch,
                               batch_loss=batch_loss)
        except TrainingDivergedError as err:
            message = f"{err}; stopped before applying it. {kept_checkpoints(args.checkpoint_dir, best, epoch)} " \
                      f"Lower the learning rate (-l), or check the data and --amp settings."
            logger.log(step=(epoch,), data={"error": message})
            logger.close()
            raise TrainingDivergedError(message) from None
        sync(); train_time = time.perf_counter() - t0
        metrics = evaluate(model, test, args.topk, args.valid_batch_size, autocast)  # the module: no DDP hooks
        sync(); eval_time = time.perf_counter() - t0 - train_time
        loss = all_reduce_sum([loss], device)[0] / world_size
        elapsed += train_time + eval_time
        train_tp, eval_tp = train.rows_per_epoch / train_time, metrics["eval_rows"] / eval_time
        best_train_tp, best_eval_tp = max(best_train_tp, train_tp), max(best_eval_tp, eval_tp)
        last = {"epoch": epoch, f"hr@{args.topk}": metrics["hr"], f"ndcg@{args.topk}": metrics["ndcg"],
                "loss": loss, "val_loss": metrics["val_loss"], "train_throughput": train_tp,
                "eval_throughput": eval_tp, "epoch_time": train_time + eval_time,
                "train_epoch_time": train_time, "validation_epoch_time": eval_time}
        if metrics["nan_users"]:  # counted as misses; said out loud, since a finite loss rarely gives NaN scores
            last["eval_nan_users"] = metrics["nan_users"]
        logger.log(step=(epoch,), data=last)
        improved = metrics["hr"] > best["hr"]
        if improved:
            best = {"hr": metrics["hr"], "ndcg": metrics["ndcg"], "epoch": epoch}
        if time_to_target is None and metrics["hr"] >= args.threshold:
            time_to_target = elapsed
        if args.checkpoint_dir and rank == 0:  # last.pth, and model.pth when HR improved (checkpointing.py)
            save_epoch(args.checkpoint_dir, training_state(config, model, optimizer, scaler, epoch, seed, best,
                                                           elapsed, time_to_target), improved)
        if metrics["hr"] >= args.threshold:
            break
    summary = {f"best_hr@{args.topk}": best["hr"], f"best_ndcg@{args.topk}": best["ndcg"],
               "best_epoch": best["epoch"], "time_to_target": time_to_target, "total_time": elapsed,
               "best_train_throughput": best_train_tp, "best_eval_throughput": best_eval_tp,
               "last": last, "seed": seed}
    logger.log_summary(summary)
    logger.close()
    if dist.is_initialized():
        dist.barrier()  # rank 0's checkpoint is complete before any rank returns
    return summary


def main(argv: Optional[List[str]] = None) -> Dict:
    """Train or evaluate (see :func:`parse_args`); returns the summary. Raises :data:`INPUT_ERRORS` for input it
    cannot use and a diverged loss. Tears the process group down on every exit, a refusal or an error included (then
    without the barrier: see :func:`shutdown_distributed`)."""
    args = parse_args(argv)
    keep_freed_memory()  # before the first big allocation: see its docstring (page faults at -b 1048576)
    succeeded = False
    try:
        summary = run(args)
        succeeded = True
        return summary
    finally:
        shutdown_distributed(barrier=succeeded)


# What `python ncf.py` reports in one line with exit status 2 (a diverged loss too, as before the shared runner).
INPUT_ERRORS = (DatasetError, FeatureSpecError, CheckpointError, ConfigurationError, TrainingDivergedError)

if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, prog="ncf.py", input_errors=INPUT_ERRORS)
