"""Train and evaluate NCF (NeuMF, GMF or MLP) on a converted MovieLens-style dataset (``python ncf.py`` runs
:func:`main`).

    python ncf.py --data /data/cache/ml-20m                                  # one process (CPU or one GPU)
    torchrun --nproc_per_node=8 ncf.py --data /data/cache/ml-20m             # DDP, NCCL on GPUs / gloo on CPU
    python -m torch.distributed.launch --nproc_per_node=8 --use_env ncf.py --data /data/cache/ml-20m

Data flow (top to bottom of :func:`run`): dataset -> device memory (:mod:`neumf.data`) -> the run's frozen
:class:`~neumf.cli.NcfConfig` -> per epoch: negatives drawn on the device, shuffled, batches of ``-b`` rows split over
ranks, ``--grads_accumulated`` batches per optimizer step -> BCE-with-logits loss (checked for NaN/inf every step)
-> fused Adam -> evaluation (HR@K, NDCG@K over each user's candidates, all-reduced over ranks; on the held-out
validation series too with ``--select_on validation``) -> checkpoint (:class:`~neumf.checkpointing.Checkpoints`) when
the chosen HR (validation, or test as NVIDIA's) improves -> early stop after ``--early_stop_patience`` epochs without
a better validation HR, or at ``--threshold``.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import time
from contextlib import nullcontext
from typing import Dict, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from recsys_common.cli import InputError
from recsys_common.feature_spec import FeatureSpecError
from recsys_common.logger import Logger
from recsys_common.machine import glibc_malloc_options

from .checkpointing import (CheckpointError, Checkpoints, check_config, load_model_weights, model_config,
                            read_checkpoint, training_state)
from .cli import ConfigurationError, NcfConfig, build_parser, given_flags, parse_args, settle
from .data import DatasetError, EvalSet, NCFData, TrainEpochs, hold_out_validation, load_dataset
from .distributed import agree_on_seed, all_reduce_sum, init_distributed, shutdown_distributed
from .evaluation import check_topk, evaluate, popularity_metrics
from .tune import tuned_run
from .model import build_model, fix_gmf_predictor, neumf_state_from_pretrained


class TrainingDivergedError(RuntimeError):
    """The training loss became NaN or infinite; the message names the epoch and step."""


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
    return glibc_malloc_options(mmap_max=0, trim_threshold=-1)


# ------------------------------------------------------------------------------------------------ precision
def autocast_for(config: NcfConfig, device: torch.device):
    """(autocast context factory, GradScaler-or-None)."""
    if not config.amp:
        return nullcontext, None
    dtype = config.amp_dtype
    if dtype == "auto":
        dtype = "fp16" if device.type == "cuda" else "bf16"
    if dtype == "fp16" and device.type != "cuda":
        raise ValueError("--amp_dtype fp16 needs CUDA; on CPU use bf16")
    torch_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda") if dtype == "fp16" else None
    return (lambda: torch.autocast(device_type=device.type, dtype=torch_dtype)), scaler


def make_optimizer(config: NcfConfig, model: nn.Module) -> torch.optim.Optimizer:
    betas = (config.beta1, config.beta2)
    if config.apex_fused_adam:
        try:
            from apex.optimizers import FusedAdam  # only in NGC images / source builds of NVIDIA apex
        except ImportError as err:
            raise RuntimeError("--apex_fused_adam: NVIDIA apex is not installed (use the default fused torch Adam)") \
                from err
        return FusedAdam(model.parameters(), lr=config.learning_rate, betas=betas, eps=config.eps)
    if config.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config.learning_rate, foreach=True)
    return torch.optim.Adam(model.parameters(), lr=config.learning_rate, betas=betas, eps=config.eps, fused=True)


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


# ------------------------------------------------------------------------------------------------ the run
@dataclasses.dataclass
class Progress:
    """Where training stands after an epoch: what a checkpoint saves and a resume restores."""
    start_epoch: int = 0
    # the chosen epoch: its test HR/NDCG and, when choosing on validation, its validation HR (what is compared)
    best: Dict = dataclasses.field(default_factory=lambda: {"hr": -1.0, "ndcg": 0.0, "epoch": -1, "valid_hr": -1.0})
    elapsed: float = 0.0
    time_to_target: Optional[float] = None


def settle_run(args: argparse.Namespace, given: Optional[frozenset], data: NCFData, device: torch.device,
               rank: int):
    """(config, checkpoints, resume_state): the run's settings, settled once, before anything is trained.

    Every refusal comes here, before the log is opened, so that a refused run leaves no trace."""
    check_topk(args.topk, data.samples_per_series, f"{args.data}/{args.feature_spec_file}")
    checkpoints = Checkpoints(args.checkpoint_dir, for_training=args.mode == "train", rank=rank, device=device)
    resume_state = checkpoints.resume_state(args.seed) if args.resume else None
    config = settle(args, given, device, len(data.train_users) * (1 + args.negative_samples),
                    seed=int(resume_state["seed"]) if resume_state is not None else None)
    if config.cpu_defaults and rank == 0:
        print(config.cpu_defaults, flush=True)
    return config, checkpoints, resume_state


def initial_weights_path(config: NcfConfig, checkpoints: Checkpoints) -> Optional[str]:
    """The checkpoint the model starts from: ``--load_checkpoint_path``; in test mode (NVIDIA's behaviour) the best
    checkpoint of ``--checkpoint_dir`` (with ``--pretrained_gmf``/``_mlp`` instead: the fused NeuMF as initialised)."""
    if config.load_checkpoint_path or config.mode != "test" or config.pretrained_gmf:
        return config.load_checkpoint_path
    path = checkpoints.best_path
    if not path or not os.path.isfile(path):
        raise CheckpointError("--mode test needs --load_checkpoint_path, or --checkpoint_dir holding model.pth")
    return path


def build_and_load_model(config: NcfConfig, data: NCFData, device: torch.device, checkpoints: Checkpoints,
                         resumed: bool) -> nn.Module:
    """The model of ``config`` on ``device``, with its initial weights (a checkpoint, or the paper's pretraining)."""
    model = build_model(config.model, data.num_users, data.num_items, config.factors, list(config.layers),
                        config.dropout, config.embedding_init_std).to(device)
    if config.gmf_dot_product:
        fix_gmf_predictor(model)  # before any weights are loaded: a checkpoint of it holds the same ones
    weights_path = initial_weights_path(config, checkpoints)
    if weights_path:
        load_model_weights(model, read_checkpoint(weights_path)["model"], weights_path)
    if config.pretrained_gmf and not resumed:
        try:
            fused = neumf_state_from_pretrained(read_checkpoint(config.pretrained_gmf)["model"],
                                                read_checkpoint(config.pretrained_mlp)["model"], config.alpha)
        except ValueError as err:
            raise CheckpointError(f"--pretrained_gmf {config.pretrained_gmf} / --pretrained_mlp "
                                  f"{config.pretrained_mlp}: {err}") from err
        load_model_weights(model, fused, f"{config.pretrained_gmf} + {config.pretrained_mlp}")
    return model


def restore(resume_state: Dict, path: str, architecture: Dict, model: nn.Module, optimizer, scaler) -> Progress:
    """Load a resumed run's model, optimizer and scaler state; returns where it stood."""
    check_config(resume_state, architecture, path)   # names every differing field, as the other recipes
    load_model_weights(model, resume_state["model"], path)
    optimizer.load_state_dict(resume_state["optimizer"])
    if scaler is not None and resume_state.get("scaler"):
        scaler.load_state_dict(resume_state["scaler"])
    return Progress(start_epoch=int(resume_state["epoch"]) + 1,
                    best={"hr": float(resume_state["best_hr"]), "ndcg": float(resume_state["best_ndcg"]),
                          "epoch": int(resume_state["best_epoch"]),
                          "valid_hr": float(resume_state.get("best_valid_hr", -1.0))},
                    elapsed=float(resume_state["elapsed"]), time_to_target=resume_state.get("time_to_target"))


def open_log(config: NcfConfig, rank: int, resumed: bool, **run_facts) -> Logger:
    """The JSON log, its metric units and the run's parameters. A resumed run continues the earlier run's log (as
    DLRM's does) instead of replacing it."""
    logger = Logger(config.log_path, rank=rank, append=resumed)
    for metric, unit in (("train_throughput", "samples/s"), ("eval_throughput", "samples/s"),
                         ("time_to_target", "s"), ("epoch_time", "s"), ("train_epoch_time", "s"),
                         ("validation_epoch_time", "s")):
        logger.metadata(metric, {"unit": unit})
    logger.log_parameters(dict(config.log_parameters(), **run_facts))
    return logger


def synchronize(device: torch.device) -> None:
    """Wait for the device, so that a timer read after it measures the work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def test_only(config: NcfConfig, model: nn.Module, test: EvalSet, autocast, device: torch.device,
              logger: Logger) -> Dict:
    """``--mode test``: one evaluation, its summary logged and returned."""
    synchronize(device); t0 = time.perf_counter()
    metrics = evaluate(model, test, config.topk, config.valid_batch_size, autocast)
    synchronize(device); seconds = time.perf_counter() - t0
    summary = {f"hr@{config.topk}": metrics["hr"], f"ndcg@{config.topk}": metrics["ndcg"],
               "val_loss": metrics["val_loss"], "eval_throughput": metrics["eval_rows"] / seconds}
    logger.log_summary(summary)
    return summary


@dataclasses.dataclass
class Trainer:
    """What the epoch loop needs, built once by :func:`run`."""
    config: NcfConfig
    model: nn.Module          # the module (evaluated and saved)
    ddp_model: nn.Module      # what trains: the module, or its DDP wrapper
    optimizer: torch.optim.Optimizer
    scaler: Optional[torch.amp.GradScaler]
    autocast: object
    architecture: Dict        # what a checkpoint must match to be resumed
    checkpoints: Checkpoints
    logger: Logger
    seed: int
    rank: int
    world_size: int
    device: torch.device
    valid: Optional[EvalSet] = None   # the held-out validation series (--select_on validation), else None


def train_one_epoch(t: Trainer, train: TrainEpochs, test: EvalSet, batch_loss, epoch: int, progress: Progress,
                    steps_per_epoch: int) -> Dict:
    """Train epoch ``epoch``, evaluate, log; returns the epoch's record. A diverged loss is logged and re-raised."""
    config = t.config
    torch.manual_seed(t.seed * 7919 + epoch * 104729 + t.rank)  # dropout stream of this epoch: resume is exact
    set_learning_rate(t.optimizer, epoch_learning_rate(config.learning_rate, config.learning_rate_decay, epoch))
    synchronize(t.device); t0 = time.perf_counter()
    try:
        loss = train_epoch(t.ddp_model, t.optimizer, t.scaler, t.autocast, train.epoch(t.seed, epoch),
                           config.grads_accumulated, t.world_size, epoch=epoch, steps=steps_per_epoch,
                           batch_loss=batch_loss)
    except TrainingDivergedError as err:
        message = (f"{err}; stopped before applying it. {t.checkpoints.describe(progress.best, epoch)} "
                   f"Lower the learning rate (-l), or check the data and --amp settings.")
        t.logger.log(step=(epoch,), data={"error": message})
        raise TrainingDivergedError(message) from None
    synchronize(t.device); train_time = time.perf_counter() - t0
    metrics = evaluate(t.model, test, config.topk, config.valid_batch_size, t.autocast)  # the module: no DDP hooks
    validation = evaluate(t.model, t.valid, config.topk, config.valid_batch_size, t.autocast) if t.valid else None
    synchronize(t.device); eval_time = time.perf_counter() - t0 - train_time
    loss = all_reduce_sum([loss], t.device)[0] / t.world_size
    record = {"epoch": epoch, f"hr@{config.topk}": metrics["hr"], f"ndcg@{config.topk}": metrics["ndcg"],
              "loss": loss, "val_loss": metrics["val_loss"], "train_throughput": train.rows_per_epoch / train_time,
              "eval_throughput": metrics["eval_rows"] / eval_time, "epoch_time": train_time + eval_time,
              "train_epoch_time": train_time, "validation_epoch_time": eval_time}
    if validation is not None:
        record.update({f"valid_hr@{config.topk}": validation["hr"], f"valid_ndcg@{config.topk}": validation["ndcg"]})
    if metrics["nan_users"]:  # counted as misses; said out loud, since a finite loss rarely gives NaN scores
        record["eval_nan_users"] = metrics["nan_users"]
    t.logger.log(step=(epoch,), data=record)
    return record


def train_epochs(t: Trainer, train: TrainEpochs, test: EvalSet, progress: Progress) -> Dict:
    """The loop: per epoch, train -> evaluate -> maybe checkpoint -> maybe stop at ``--threshold``; the summary."""
    config = t.config
    batch_loss = (compiled_batch_loss if config.compile else batch_loss_fn)(t.ddp_model, t.autocast,
                                                                           config.l2_embedding)
    steps_per_epoch = -(-train.steps_per_epoch // config.grads_accumulated)  # optimizer steps
    best_train_tp, best_eval_tp, last = 0.0, 0.0, {}
    patience = config.early_stop_patience if t.valid is not None else 0
    for epoch in range(progress.start_epoch, config.epochs):
        if patience and progress.best["epoch"] >= 0 and epoch - progress.best["epoch"] > patience:
            break   # from the best epoch alone, so a resumed run stops where the uninterrupted one would
        last = train_one_epoch(t, train, test, batch_loss, epoch, progress, steps_per_epoch)
        hr = last[f"hr@{config.topk}"]
        best_train_tp = max(best_train_tp, last["train_throughput"])
        best_eval_tp = max(best_eval_tp, last["eval_throughput"])
        progress.elapsed += last["epoch_time"]
        improved = chosen_improves(t, last, progress.best)
        if improved:
            progress.best = {"hr": hr, "ndcg": last[f"ndcg@{config.topk}"], "epoch": epoch,
                             "valid_hr": last.get(f"valid_hr@{config.topk}", -1.0)}
        if progress.time_to_target is None and hr >= config.threshold:
            progress.time_to_target = progress.elapsed
        t.checkpoints.save(training_state(t.architecture, t.model, t.optimizer, t.scaler, epoch, t.seed,
                                          progress.best, progress.elapsed, progress.time_to_target), improved)
        if hr >= config.threshold:
            break
    summary = {f"best_hr@{config.topk}": progress.best["hr"], f"best_ndcg@{config.topk}": progress.best["ndcg"],
               "best_epoch": progress.best["epoch"], "selected_on": "validation" if t.valid else "test",
               "time_to_target": progress.time_to_target, "total_time": progress.elapsed,
               "best_train_throughput": best_train_tp, "best_eval_throughput": best_eval_tp, "last": last,
               "seed": t.seed}
    if t.valid is not None:
        summary[f"best_valid_hr@{config.topk}"] = progress.best["valid_hr"]
    return summary


def chosen_improves(t: Trainer, record: Dict, best: Dict) -> bool:
    """Whether this epoch beats the chosen one: on validation HR (``t.valid``), else on test HR (NVIDIA's)."""
    if t.valid is not None:
        return record[f"valid_hr@{t.config.topk}"] > best["valid_hr"]
    return record[f"hr@{t.config.topk}"] > best["hr"]


def validation_split(config: NcfConfig, data: NCFData, rank: int, world_size: int, device: torch.device):
    """``(data to train on, validation EvalSet or None, popularity's validation HR or None)``: with ``--select_on
    validation`` (training only), each user's latest training row held out (:func:`neumf.data.hold_out_validation`);
    else the data as it is."""
    if config.select_on != "validation" or config.mode != "train":
        return data, None, None
    training, validation = hold_out_validation(data)
    if len(validation.test_users) == 0:
        raise ConfigurationError(f"{config.data}: --select_on validation: no user has two training rows to hold one "
                                 f"out; pass --select_on test")
    return training, EvalSet(validation, rank, world_size, device), popularity_metrics(validation, config.topk)["hr"]


def warn_below_popularity(summary: Dict, popularity_valid_hr: Optional[float], topk: int, rank: int) -> None:
    """Record popularity's validation HR in ``summary`` and say so when the chosen epoch does not beat it: on very
    sparse data the default NeuMF can fall below popularity (RESULTS.md), which only the validation split shows."""
    if popularity_valid_hr is None:
        return
    summary[f"popularity_valid_hr@{topk}"] = popularity_valid_hr
    chosen = summary.get(f"best_valid_hr@{topk}", -1.0)
    if chosen <= popularity_valid_hr and rank == 0:
        print(f"ncf.py: warning: the chosen epoch's validation HR@{topk} {chosen:.4f} does not beat popularity's "
              f"{popularity_valid_hr:.4f} on the same validation series: try --tune (more negatives, other factors, "
              f"other rates)", flush=True)


def run(args: argparse.Namespace, given: Optional[frozenset] = None) -> Dict:
    """Everything :func:`main` does with the flags ``args`` (``given``: the ones the user typed, which the CPU
    defaults leave alone; None: none chosen); returns the summary (also logged). Raises on bad input."""
    rank, world_size, device = init_distributed(args.device, args.local_rank)
    data = load_dataset(args.data, args.feature_spec_file)
    config, checkpoints, resume_state = settle_run(args, given, data, device, rank)
    seed = agree_on_seed(config.seed, device)
    torch.manual_seed(seed)
    architecture = model_config(config.model, data.num_users, data.num_items, config.factors, list(config.layers),
                                config.dropout)
    model = build_and_load_model(config, data, device, checkpoints, resumed=resume_state is not None)
    autocast, scaler = autocast_for(config, device)
    optimizer = make_optimizer(config, model)
    progress = (restore(resume_state, checkpoints.resume_path, architecture, model, optimizer, scaler)
                if resume_state is not None else Progress())
    logger = open_log(config, rank, resume_state is not None, seed=seed, world_size=world_size, device=str(device),
                      num_users=data.num_users, num_items=data.num_items, train_positives=len(data.train_users),
                      test_samples_per_series=data.samples_per_series)
    test = EvalSet(data, rank, world_size, device)
    data, valid, popularity_valid_hr = validation_split(config, data, rank, world_size, device)
    try:
        if config.mode == "test":
            return test_only(config, model, test, autocast, device, logger)
        ddp_model = model if world_size == 1 else nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
        train = TrainEpochs(data.train_users, data.train_items, data.num_items, config.negative_samples,
                            config.batch_size, rank, world_size, device, exclude_positives=config.exclude_positives)
        trainer = Trainer(config, model, ddp_model, optimizer, scaler, autocast, architecture, checkpoints, logger,
                          seed, rank, world_size, device, valid)
        summary = train_epochs(trainer, train, test, progress)
        warn_below_popularity(summary, popularity_valid_hr, config.topk, rank)
        logger.log_summary(summary)
    finally:
        logger.close()
    if dist.is_initialized():
        dist.barrier()  # rank 0's checkpoint is complete before any rank returns
    return summary


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    """Train or evaluate (see :mod:`neumf.cli`); returns the summary. Raises :data:`INPUT_ERRORS` for input it
    cannot use and a diverged loss. Tears the process group down on every exit, a refusal or an error included (then
    without the barrier: see :func:`neumf.distributed.shutdown_distributed`)."""
    args = parse_args(argv)
    given = frozenset(given_flags(build_parser(), argv))
    keep_freed_memory()  # before the first big allocation: see its docstring (page faults at -b 1048576)
    succeeded = False
    try:
        summary = tuned_run(run, args, given) if args.tune else run(args, given)
        succeeded = True
        return summary
    finally:
        shutdown_distributed(barrier=succeeded)


# What `python ncf.py` reports in one line with exit status 2 (a diverged loss too, as before the shared runner).
INPUT_ERRORS = (InputError, DatasetError, FeatureSpecError, CheckpointError, ConfigurationError,
                TrainingDivergedError)
