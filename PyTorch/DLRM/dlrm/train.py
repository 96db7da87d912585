"""Train, evaluate and benchmark DLRM: ``python -m dlrm.scripts.main --help``.

    python -m dlrm.scripts.main --mode train --dataset /data/dlrm/binary_dataset/
    python -m dlrm.scripts.main --mode test --dataset /data/dlrm/binary_dataset/ --load_checkpoint_path ckpt
    python -m dlrm.scripts.main --mode inference_benchmark --synthetic_dataset
    torchrun --nproc_per_node=8 -m dlrm.scripts.main --dataset ...     (hybrid parallel)

Flags and defaults follow NVIDIA's recipe (the 2020 seed, plus the later flags of reference A.4); see the README for
what differs and why; they become one frozen configuration in :mod:`dlrm.cli`. ``main(argv)`` returns a dict of
results (AUC, loss, throughput, latencies) for tests; :func:`train` is the loop: step -> progress -> maybe evaluate
-> maybe checkpoint.
"""
from __future__ import annotations

import math
import os
import sys
import time
import traceback
import warnings
from typing import Any, Dict, List, Optional, Sequence

import torch
from absl import flags

from dlrm import checkpointing, cli
from dlrm.checkpointing import CheckpointError
from dlrm.cli import DlrmConfig
from dlrm.data import DataError, SplitBinaryBatches, SyntheticBatches, dataset_info, default_synthetic_info
from dlrm.evaluation import click_metric_entries, evaluate, final_evaluation_entries, inference_benchmark, sync
from dlrm.model import parallel
from dlrm.model.parallel import ModelConfig, resolve_embedding_type
from dlrm.utils.amp import Amp, cpu_runs_bfloat16_natively
from dlrm.utils.compile import compile_dense
from dlrm.utils.cuda_graphs import GraphedDLRM
from dlrm.utils.distributed import (all_gather_1d, all_reduce_min_int, all_reduce_sum, barrier, group_active,
                                    resolve_device, setup, teardown)
from dlrm.utils.lr_schedule import LearningRateSchedule
from recsys_common.cli import exit_status
from recsys_common.datasets import DatasetError
from recsys_common.feature_spec import FeatureSpecError
from recsys_common.logger import Logger, Progress, check_finite, hms


# ------------------------------------------------------------------------------------------------------------ main
def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Entry point for tests and scripts: ``main(["--mode", "train", "--dataset", d])`` returns the results dict.

    The flags are read, the processes set up and the dataset's FeatureSpec parsed (once: ``info`` is handed down);
    then the CPU defaults are chosen and the one :class:`~dlrm.cli.DlrmConfig` of the run is built."""
    flag_values, given_flags = cli.read_flags(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(flag_values["base_device"], local_rank)
    embedding_type = resolve_embedding_type(flag_values["embedding_type"], device,
                                            flag_values["Adam_embedding_optimizer"],
                                            tables_in_files=flag_values["embedding_memory_budget_gb"] is not None)
    ctx = setup(flag_values["base_device"], flag_values["backend"], need_group=embedding_type == "torchrec_fused")
    try:
        torch.manual_seed(flag_values["seed"])
        info = load_dataset_info(flag_values)
        config, cpu_line = cli.settle(flag_values, given_flags, device_type=ctx.device.type,
                                      world_size=ctx.world_size, info=info)
        if cpu_line and ctx.rank == 0:
            print(cpu_line, flush=True)
        return run(config, ctx, info, embedding_type)
    finally:
        # The model (DMP / DDP) and the checkpoint saver hold the process group: run() has dropped them, so that
        # teardown can release the group's gloo threads now rather than race the interpreter's exit.
        _drop_frames_of_failed_call()
        teardown(ctx)


def command_line() -> int:
    """The command line's exit status (recsys_common.cli): 2 for a bad flag or bad input (a dataset, a spec, a
    checkpoint), 1 for a failed run (a diverged loss, a path that cannot be written, a missing dependency)."""
    if cli.wants_help(sys.argv[1:]):
        print(cli.help_text(__doc__))
        return 0
    return exit_status(main, prog=cli.PROG, hint="run with --help for the flags", hint_errors=(flags.Error,),
                       input_errors=(flags.Error, DataError, DatasetError, FeatureSpecError, CheckpointError),
                       failures=(ValueError, FloatingPointError, RuntimeError, OSError))


def load_dataset_info(flag_values):
    """The dataset's tables and features (the synthetic ones, or the FeatureSpec's, parsed here once per run),
    checked against the flags."""
    if flag_values["synthetic_dataset"] or flag_values["dataset_type"] == "synthetic_gpu":
        return default_synthetic_info(cli.ints(flag_values["synthetic_dataset_table_sizes"],
                                               "synthetic_dataset_table_sizes"),
                                      flag_values["synthetic_dataset_numerical_features"])
    if not flag_values["dataset"]:
        raise ValueError("--dataset is required (or pass --synthetic_dataset for random benchmark data)")
    info = dataset_info(flag_values["dataset"], flag_values["feature_spec"])
    wanted = flag_values["num_numerical_features"]
    if info.num_numerical_features != wanted and wanted != 13:
        raise ValueError(f"--num_numerical_features {wanted} but {info.spec.origin} has "
                         f"{info.num_numerical_features} numerical features")
    return info


def run(config: DlrmConfig, ctx, info, embedding_type: str) -> Dict[str, Any]:
    """Everything after the configuration: build the model, resume or load a checkpoint, then train, test or
    time inference (``config.mode``), and log the summary."""
    logger = Logger(config.log_path, rank=ctx.rank, stdout=True,
                    append=bool(config.load_checkpoint_path and config.mode == "train"))
    trainable = saver = None
    try:
        train_data, test_data = data_loaders(config, info, ctx)
        trainable, model_config, amp = build_model(config, ctx, info, embedding_type)
        logger.log_parameters({**config.parameters(), "resolved_embedding_type": embedding_type,
                               "device": str(ctx.device), "world_size": ctx.world_size,
                               "amp_dtype_used": amp.dtype_name, "table_sizes": model_config.table_sizes})
        training = {"batch_size": config.batch_size, "lr": config.lr}
        start, resumed_from = load_checkpoint(config, ctx, trainable, amp, model_config, training, logger)
        if config.mode == "train":
            saver = checkpointing.open_saver(config.save_checkpoint_path, config.checkpoint_every_steps,
                                             config.checkpoint_every_minutes, config.keep_checkpoints, ctx,
                                             trainable, amp.scaler, model_config.to_dict(), training, resumed_from)
        results: Dict[str, Any] = {"mode": config.mode, "embedding_type": embedding_type,
                                   "world_size": ctx.world_size, "device": str(ctx.device), "amp": amp.dtype_name}
        if config.mode in ("train", "test"):
            test_data()  # open (and so check) the test mapping before spending time on training
        if config.mode == "train":
            results.update(train(config, ctx, trainable, amp, train_data(), test_data, logger, start, saver,
                                 info.negative_downsampling_rate))
            results.update(_final_results(results, config.reliability_plot, ctx))
            if saver is not None:  # the final checkpoint (no second copy when the last step was just saved)
                results["checkpoint"] = saver.save(results["position"])
        elif config.mode == "test":
            metrics = evaluate(trainable, test_data(), amp, info.negative_downsampling_rate)
            results.update({"auc": metrics["auc"], "test_loss": metrics["loss"], "test_samples": metrics["samples"],
                            "test_auc_rows_gathered": metrics["auc_rows_gathered"],
                            **final_evaluation_entries(metrics, config.reliability_plot, ctx)})
        else:
            results["inference"] = inference_benchmark(
                cli.ints(config.inference_benchmark_batch_sizes, "inference_benchmark_batch_sizes"),
                config.inference_benchmark_steps, ctx, trainable, amp, info, synthetic=config.synthetic,
                seed=config.seed, hash_indices=config.hash_indices)
        logger.log_summary(_summary(results))
        return results
    finally:
        logger.close()
        trainable = saver = None  # noqa: F841 (the process group's holders: see main)


def _final_results(results: Dict[str, Any], reliability_plot: Optional[str], ctx) -> Dict[str, Any]:
    """A training run's last evaluation as the run's results (AUC, loss, best AUC, click metrics)."""
    if not results["evaluations"]:
        return {}
    last = results["evaluations"][-1]
    return {"auc": last["auc"], "test_loss": last["loss"], "test_samples": last["samples"],
            "test_auc_rows_gathered": last["auc_rows_gathered"],
            "best_auc": max(e["auc"] for e in results["evaluations"]),
            **final_evaluation_entries(last, reliability_plot, ctx)}


def _summary(results: Dict[str, Any]) -> Dict[str, Any]:
    """The log's summary: the results without the evaluations, the position and the per-step latencies."""
    summary = {k: v for k, v in results.items() if k not in ("evaluations", "position")}
    if "inference" in summary:
        summary["inference"] = {b: {k: v for k, v in r.items() if k != "latencies_ms"}
                                for b, r in summary["inference"].items()}
    return summary


def _drop_frames_of_failed_call() -> None:
    """While an exception propagates, its traceback keeps the frames it passed through alive, and train()'s frame holds
    the model (and so the process group): clear the locals of those finished frames so teardown can release it. The
    traceback's lines, and so the error report, stay as they were."""
    error = sys.exc_info()[1]
    if error is not None and error.__traceback__ is not None and error.__traceback__.tb_next is not None:
        traceback.clear_frames(error.__traceback__.tb_next)


# ----------------------------------------------------------------------------------------------------------- setup
def data_loaders(config: DlrmConfig, info, ctx):
    """``(train_data, test_data)``: functions returning this rank's training batches (new each epoch) and its test
    batches (opened once, on first use)."""

    def train_data():
        if config.synthetic:
            return SyntheticBatches(info, config.synthetic_dataset_num_entries, config.batch_size, ctx.device,
                                    ctx.rank, ctx.world_size, seed=config.seed)
        return SplitBinaryBatches(info, "train", config.batch_size, ctx.device, ctx.rank, ctx.world_size,
                                  training=True, shuffle=config.shuffle_batch_order, seed=config.seed,
                                  subset=config.dataset_subset, hash_indices=config.hash_indices,
                                  prefetch=config.prefetch_batches)

    cache = {}

    def test_data():
        if "test" not in cache:
            cache["test"] = make_test_data()
        return cache["test"]

    def make_test_data():
        if config.synthetic:
            return SyntheticBatches(info, max(config.synthetic_dataset_num_entries // 8, config.test_batch_size),
                                    config.test_batch_size, ctx.device, ctx.rank, ctx.world_size,
                                    seed=config.seed + 1, training=False)
        return SplitBinaryBatches(info, "test", config.test_batch_size, ctx.device, ctx.rank, ctx.world_size,
                                  training=False, hash_indices=config.hash_indices, prefetch=config.prefetch_batches)
    return train_data, test_data


def table_sizes(info, max_table_size: Optional[int], hash_indices: bool) -> List[int]:
    """The embedding tables' rows: the dataset's cardinalities, capped at ``max_table_size`` (which needs
    ``hash_indices``: ids of a capped table are taken modulo its size)."""
    sizes = list(info.cardinalities)
    if max_table_size is not None:
        capped = [(name, n) for name, n in zip(info.categorical_features, sizes) if n > max_table_size]
        if capped and not hash_indices:
            names = ", ".join(f"{name} ({n} rows)" for name, n in capped)
            raise ValueError(f"--max_table_size {max_table_size} caps {names}: their ids would overflow the "
                             f"capped tables; pass --hash_indices to map ids with id % table size")
        sizes = [min(n, max_table_size) for n in sizes]
    return sizes


def build_model(config: DlrmConfig, ctx, info, embedding_type: str):
    """``(trainable, model_config, amp)``: the model with its optimizers (compiled for training with --compile)
    and the run's mixed precision."""
    model_config = ModelConfig(info.num_numerical_features, table_sizes(info, config.max_table_size,
                                                                        config.hash_indices),
                               info.categorical_features, config.embedding_dim,
                               cli.ints(config.bottom_mlp_sizes, "bottom_mlp_sizes"),
                               cli.ints(config.top_mlp_sizes, "top_mlp_sizes"), config.interaction_op,
                               config.self_interaction, config.hash_indices, list(info.hotness),
                               config.dcn_num_layers, config.dcn_low_rank_dim)
    # --fp16 (default on, as NVIDIA's) turns AMP on where it is native: CUDA, and CPUs with bfloat16 instructions,
    # where bfloat16 autocast measured faster than float32 at the same AUC (RESULTS.md, "bf16 against float32 on a
    # CPU"). Elsewhere a CPU emulates bfloat16, so there it takes an explicit --amp.
    amp_on = config.amp or (config.fp16 and (ctx.device.type == "cuda" or cpu_runs_bfloat16_natively()))
    amp = Amp(amp_on, ctx.device, config.amp_dtype, config.loss_scale)
    trainable = parallel.build_trainable_model(model_config, embedding_type, ctx.device, ctx.world_size, config.lr,
                                               config.Adam_MLP_optimizer, config.Adam_embedding_optimizer,
                                               config.sharding_type, config.local_batch_size(ctx.world_size),
                                               adagrad=config.adagrad, table_budget_bytes=_budget_bytes(config),
                                               table_storage_dir=config.embedding_storage_dir)
    if ctx.device.type == "cuda":  # TF32 for float32 matmuls and convolutions (Ampere and newer)
        torch.backends.cuda.matmul.allow_tf32 = config.tf32
        torch.backends.cudnn.allow_tf32 = config.tf32
    if config.compile and config.cuda_graphs:
        raise ValueError("--compile and --cuda_graphs cannot be combined: pick one for the MLPs")
    if config.compile and config.mode == "train":
        compile_dense(trainable.core)  # in place: the module classes and state_dict keys are unchanged
    return trainable, model_config, amp


def _budget_bytes(config: DlrmConfig) -> Optional[float]:
    budget = config.embedding_memory_budget_gb
    if budget is not None and budget < 0:
        raise ValueError(f"--embedding_memory_budget_gb must be >= 0, got {budget}")
    return None if budget is None else budget * 2 ** 30


def load_checkpoint(config: DlrmConfig, ctx, trainable, amp: Amp, model_config: ModelConfig,
                    training: Dict[str, Any], logger):
    """Load ``--load_checkpoint_path`` when given: ``(start, resumed_from)``, the position to train from (empty: the
    beginning) and the checkpoint resumed (None unless training resumes)."""
    if not config.load_checkpoint_path:
        return {}, None
    # A different model configuration is refused (naming the field); a changed batch size, learning rate or
    # world size only warns. Resuming also restores optimizers, loss scaler and every process's RNG state.
    resuming = config.mode == "train"
    meta = checkpointing.load_checkpoint(config.load_checkpoint_path, trainable, amp.scaler, load_optimizer=resuming,
                                         config=model_config.to_dict(), training=training if resuming else None,
                                         rank=ctx.rank, world_size=ctx.world_size)
    if not resuming:
        return {}, None
    start = dict(meta["position"])
    logger.log(step=(start.get("epoch", 0), start.get("global_step", 0)), data={"resumed_from": meta["path"]})
    return start, meta["path"]


# -------------------------------------------------------------------------------------------------------- training
def train(config: DlrmConfig, ctx, trainable, amp: Amp, train_data, test_data, logger, start: Dict[str, Any],
          checkpoints=None, negative_downsampling_rate: float = 1.0) -> Dict[str, Any]:
    """Train from position ``start`` (empty, or a checkpoint's); ``checkpoints``: a ``CheckpointSaver`` or None.

    Each step: forward/backward/update -> progress line every ``print_freq`` -> evaluation every ``test_freq``
    (or at each epoch's end) -> checkpoint when its policy says so. Returns the evaluations, the last mean loss,
    the throughput and the position reached. ``negative_downsampling_rate``: the dataset's, for the evaluations'
    logit correction.
    """
    loop = TrainingLoop(config, ctx, trainable, amp, train_data, test_data, logger, start, checkpoints,
                        negative_downsampling_rate)
    stop = loop.max_steps_reached()
    while not stop and loop.epoch < config.epochs:
        train_data.set_epoch(loop.epoch)
        for numerical, categorical, label, _ in train_data.iterate(loop.step_in_epoch):
            if loop.max_steps_reached():
                stop = True
                break
            lr = loop.step(numerical, categorical, label)
            if config.print_freq and loop.global_step % config.print_freq == 0:
                loop.progress(lr)
            if loop.evaluation_due() and loop.evaluate(loop.epoch):
                logger.log(step=(loop.epoch, loop.global_step), data={"early_stop": f"AUC >= {config.auc_threshold}"})
                stop = True
                break
            if checkpoints is not None and checkpoints.due(loop.global_step):
                loop.checkpoint()
        else:  # epoch finished
            stop = loop.end_epoch()
            continue
        break
    return loop.finish()


class TrainingLoop:
    """The state of :func:`train`'s loop (position, losses, evaluations) and what it does at each point of a step."""

    def __init__(self, config: DlrmConfig, ctx, trainable, amp: Amp, train_data, test_data, logger,
                 start: Dict[str, Any], checkpoints, negative_downsampling_rate: float):
        self.config, self.ctx, self.trainable, self.amp = config, ctx, trainable, amp
        self.test_data, self.logger, self.checkpoints = test_data, logger, checkpoints
        self.negative_downsampling_rate = negative_downsampling_rate
        self.schedule = LearningRateSchedule(**config.lr_schedule)
        self.loss_fn = torch.nn.BCEWithLogitsLoss()
        self.steps_per_epoch = len(train_data)
        self.global_step = start.get("global_step", 0)
        self.epoch = start.get("epoch", 0)
        # A checkpoint taken at an epoch's last step (step_in_epoch == steps_per_epoch) resumes into that epoch's end:
        # the loop then reads no batch and runs the end-of-epoch evaluation the killed run may not have reached.
        self.step_in_epoch = start.get("step_in_epoch", 0)
        self.results: Dict[str, Any] = {"evaluations": []}
        self.last_eval_step = -1
        self.losses = LossWindow(ctx.device, ctx.rank, ctx.world_size, start.get("loss_window"))
        self.nonfinite = NonFiniteLoss(ctx.device, checkpoints)
        self.timer = StepTimer(config.benchmark_warmup_steps, self.global_step, ctx.device)
        self.graphs = _maybe_graph_mlps(config.cuda_graphs, ctx, trainable, amp, train_data)
        self.window = Progress("train", self.steps_per_epoch, unit="steps", out=False)  # one print window's figures

    def max_steps_reached(self) -> bool:
        return self.config.max_steps is not None and self.global_step >= self.config.max_steps

    def step(self, numerical, categorical, label) -> float:
        """One optimization step (forward, backward, update); returns its learning rate."""
        self.global_step += 1
        self.step_in_epoch += 1
        lr = self.schedule.apply(self.trainable.optimizers, self.global_step)
        trainable, amp = self.trainable, self.amp
        trainable.zero_grad(amp.scaler)  # with a scaler, also unscales the fused tables' gradient in backward
        with amp.autocast():
            logits = (self.graphs.forward(numerical, categorical) if self.graphs
                      else trainable.module(numerical, categorical))
        loss = self.loss_fn(logits.float(), label)
        (amp.scaler.scale(loss) if amp.scaler is not None else loss).backward()
        trainable.step(amp.scaler)  # the scaler steps only optimizers with .grad (not TorchRec's fused one)
        self.losses.add(loss)
        self.nonfinite.record(loss, self.global_step)
        self.timer.step(self.global_step)
        return lr

    def progress(self, lr: float) -> None:
        """NVIDIA's line: ``Epoch:[e/E] [s/S] eta: H:MM:SS loss: ... step_time: ... lr: ...``."""
        self.nonfinite.check()
        mean_loss = self.losses.mean_over_ranks()
        self.window.total = self.steps_per_epoch - self.step_in_epoch + self.losses.count  # the eta: the epoch's rest
        self.window.set(self.losses.count)
        step_time = 1.0 / self.window.rate()
        if self.ctx.is_main:
            print(f"Epoch:[{self.epoch}/{self.config.epochs}] [{self.step_in_epoch}/{self.steps_per_epoch}] "
                  f"eta: {hms(self.window.seconds_left())} loss: {mean_loss:.4f} step_time: {step_time:.6f} "
                  f"lr: {lr:.4f}", flush=True)
        self.logger.log(step=(self.epoch, self.global_step),
                        data={"loss": mean_loss, "lr": lr, "step_time": step_time})
        self.results["train_loss"] = mean_loss
        self.losses.reset()
        self.window.restart()
        check_finite(mean_loss, "training loss became {value} at step {step}; lower --lr or lengthen "
                                "--warmup_steps", step=self.global_step)

    def evaluation_due(self) -> bool:
        """Every --test_freq steps, once --test_after epochs are done."""
        config = self.config
        return bool(config.test_freq and self.global_step % config.test_freq == 0
                    and self.epoch + self.step_in_epoch / self.steps_per_epoch >= config.test_after)

    def evaluate(self, tag_epoch: int) -> bool:
        """Evaluate at the current step; True when ``--auc_threshold`` is reached (stop)."""
        self.nonfinite.check()
        self.last_eval_step = self.global_step
        metrics = evaluate(self.trainable, self.test_data(), self.amp, self.negative_downsampling_rate)
        self.results["evaluations"].append({"step": self.global_step, **metrics})
        self.logger.log(step=(tag_epoch, self.global_step), data={"test_auc": metrics["auc"],
                                                                 "test_loss": metrics["loss"],
                                                                 **click_metric_entries(metrics)})
        return self.config.auc_threshold is not None and metrics["auc"] >= self.config.auc_threshold

    def checkpoint(self) -> None:
        self.nonfinite.check()  # never save weights a non-finite loss has touched
        self.checkpoints.save(self.position())

    def end_epoch(self) -> bool:
        """After an epoch's last step: the evaluation of the epoch (without --test_freq); True to stop."""
        self.epoch += 1
        self.step_in_epoch = 0
        if not self.config.test_freq and self.epoch >= self.config.test_after and \
                self.last_eval_step != self.global_step:
            return self.evaluate(self.epoch - 1)
        return False

    def position(self) -> Dict[str, Any]:
        """Where training stands, to resume from (collective): data position (the LR schedule follows
        global_step) and the losses accumulated since the last progress line."""
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
                "loss_window": self.losses.saved()}

    def finish(self) -> Dict[str, Any]:
        """After the last step: the final evaluation (unless this step was just evaluated) and the results."""
        sync(self.ctx.device)
        self.nonfinite.check()
        if self.losses.count:
            self.results["train_loss"] = self.losses.mean_over_ranks()
        self.results.update(self.timer.results(self.config.batch_size))
        if self.last_eval_step != self.global_step:
            self.evaluate(self.epoch)
        self.results["global_step"] = self.global_step
        self.results["position"] = self.position()
        barrier()
        return self.results


class LossWindow:
    """The losses since the last progress line, per process, kept on the device (no host sync per step); a
    checkpoint saves them, so the first line printed after a resume equals the uninterrupted run's."""

    def __init__(self, device, rank: int, world_size: int, saved: Optional[Dict[str, Any]] = None):
        self.device, self.rank, self.world_size = device, rank, world_size
        self.sum = torch.zeros((), device=device)
        self.count = 0
        if saved:  # the unprinted losses of the killed run
            sums = saved["sums"]
            self.sum.fill_(sums[rank] if len(sums) == world_size else sum(sums) / len(sums))
            self.count = int(saved["count"])

    def add(self, loss) -> None:
        self.sum += loss.detach()
        self.count += 1

    def mean_over_ranks(self) -> float:
        total, count = all_reduce_sum([self.sum.item(), float(self.count)], self.device)
        return total / count

    def reset(self) -> None:
        self.sum.zero_()
        self.count = 0

    def saved(self) -> Dict[str, Any]:
        """Collective: every process's sum, for a checkpoint."""
        return {"sums": all_gather_1d(self.sum.reshape(1).double()).tolist(), "count": self.count}


class StepTimer:
    """Training throughput over the steps after ``--benchmark_warmup_steps`` (counted from the resumed step)."""

    def __init__(self, warmup_steps: int, first_step: int, device):
        self.warmup_end = first_step + warmup_steps if warmup_steps else None
        self.device = device
        self.start = time.perf_counter() if not warmup_steps else None
        self.steps = 0

    def step(self, global_step: int) -> None:
        if global_step == self.warmup_end:
            sync(self.device)
            self.start, self.steps = time.perf_counter(), 0
        elif self.start is not None:
            self.steps += 1

    def results(self, batch_size: int) -> Dict[str, float]:
        if self.start is None or self.steps == 0:
            return {}
        elapsed = time.perf_counter() - self.start
        return {"train_throughput": self.steps * batch_size / elapsed, "train_step_time": elapsed / self.steps}


class NonFiniteLoss:
    """Stops training at a NaN or infinite loss, naming the step, before any later evaluation or checkpoint.

    On the CPU every step's loss is checked at once (reading it costs nothing there). On CUDA a per-step check would
    stall the GPU on a host sync each step, so the first bad step is recorded on the device and checked at the points
    that sync anyway: every --print_freq, before each evaluation and checkpoint, and at the end. Training may then go
    on a few steps past the NaN, but nothing is saved from them: the newest checkpoint predates the bad step.

    With several processes the verdict is agreed (all-reduced, as NCF's ``check_finite_loss``): every rank stops at
    the same step, also when only one rank's loss went bad; a rank stopping alone would leave the others waiting in
    their next collective. On the CPU that is one all-reduce of one number per step.
    """

    def __init__(self, device, checkpoints=None, per_step: Optional[bool] = None):
        self.device = device
        self.per_step = device.type != "cuda" if per_step is None else per_step
        self.checkpoints = checkpoints
        self._step = torch.zeros((), dtype=torch.int64, device=device)
        self._first_bad = torch.zeros((), dtype=torch.int64, device=device)  # 0: none (steps count from 1)

    def record(self, loss, global_step: int) -> None:
        if self.per_step:
            value = float(loss.detach().item())
            bad_ranks = int(all_reduce_sum([float(not math.isfinite(value))], self.device)[0])
            if bad_ranks:
                self._fail(global_step, value if not math.isfinite(value) else None, bad_ranks if group_active()
                           else None)
            return
        self._step.fill_(global_step)  # a kernel argument: no host-to-device copy, no sync
        bad = (self._first_bad == 0) & ~torch.isfinite(loss.detach())
        self._first_bad = torch.where(bad, self._step, self._first_bad)

    def check(self) -> None:
        if not self.per_step:
            own = int(self._first_bad.item())
            none = 2 ** 62
            step = all_reduce_min_int(own or none, self.device)  # the first bad step of any rank
            if step != none:
                self._fail(step, None, "some" if group_active() else None)

    def _fail(self, step: int, value, ranks=None) -> None:
        what = f"became {value}" if value is not None else "became NaN or infinite"
        where = ""
        if ranks is not None:
            where = f" on {ranks} rank(s)" if isinstance(ranks, int) else " on at least one rank"
        kept = ""
        if self.checkpoints is not None and self.checkpoints.last_path:
            kept = (f"; the last good checkpoint, from step {self.checkpoints.last_step}, is "
                    f"{self.checkpoints.last_path}")
        raise FloatingPointError(f"training loss {what} at step {step}{where}: the model diverged (lower --lr or "
                                 f"lengthen --warmup_steps); nothing was saved after it{kept}")


def _maybe_graph_mlps(cuda_graphs: bool, ctx, trainable, amp, train_data):
    if not cuda_graphs:
        return None
    if ctx.device.type != "cuda":
        warnings.warn("--cuda_graphs needs CUDA; running without CUDA graphs on the CPU", stacklevel=2)
        return None
    if trainable.core.multi_hot:
        # a bag's size changes from batch to batch, and a CUDA graph replays fixed shapes
        warnings.warn("--cuda_graphs is not used with multi-hot features (bags of varying size per batch)",
                      stacklevel=2)
        return None
    return GraphedDLRM(trainable, amp, train_data.local_batch_size, len(trainable.core.table_sizes),
                       trainable.core.bottom_mlp.in_features, ctx.device)
