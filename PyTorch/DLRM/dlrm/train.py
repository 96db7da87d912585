"""Train, evaluate and benchmark DLRM: ``python -m dlrm.scripts.main --help``.

    python -m dlrm.scripts.main --mode train --dataset /data/dlrm/binary_dataset/
    python -m dlrm.scripts.main --mode test --dataset /data/dlrm/binary_dataset/ --load_checkpoint_path ckpt
    python -m dlrm.scripts.main --mode inference_benchmark --synthetic_dataset
    torchrun --nproc_per_node=8 -m dlrm.scripts.main --dataset ...     (hybrid parallel)

Flags and defaults follow NVIDIA's recipe (the 2020 seed, plus the later flags of reference A.4); see the README for
what differs and why. ``main(argv)`` returns a dict of results (AUC, loss, throughput, latencies) for tests.
"""
from __future__ import annotations

import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence

from absl import flags

FLAGS = flags.FlagValues()  # our own registry: importing this module never touches absl's global flags


def _define_flags(f: flags.FlagValues) -> None:
    d = flags
    d.DEFINE_enum("mode", "train", ["train", "test", "inference_benchmark"], "Select task to be performed", flag_values=f)
    d.DEFINE_integer("epochs", 1, "Number of epochs to train for", flag_values=f)
    d.DEFINE_integer("max_steps", None, "Stop training after doing this many optimization steps", flag_values=f)
    d.DEFINE_integer("batch_size", 32768, "Batch size used for training (global, over all processes)", flag_values=f)
    d.DEFINE_integer("test_batch_size", 32768, "Batch size used for testing/validation", flag_values=f)
    d.DEFINE_float("lr", 28.0, "Base learning rate", flag_values=f)
    d.DEFINE_integer("warmup_factor", 0, "Learning rate warmup factor. Must be a non-negative integer", flag_values=f)
    d.DEFINE_integer("warmup_steps", 6400, "Number of warmup optimization steps", flag_values=f)
    d.DEFINE_integer("decay_steps", 80000,
                     "Polynomial learning rate decay steps. If equal to 0 will not do any decaying", flag_values=f)
    d.DEFINE_integer("decay_start_step", 64000,
                     "Optimization step after which to start decaying the learning rate, if None will start decaying "
                     "right after the warmup phase is completed", flag_values=f)
    d.DEFINE_float("decay_power", 2.0, "Polynomial learning rate decay power", flag_values=f)
    d.DEFINE_float("decay_end_lr", 0.0, "Learning rate at the end of the decay", flag_values=f)
    d.DEFINE_enum("embedding_type", "auto", ["auto", "torchrec_fused", "multi_table"],
                  "torchrec_fused: TorchRec EmbeddingBagCollection sharded by DistributedModelParallel, FBGEMM "
                  "table-batched kernel with fused optimizer; multi_table: one torch.nn.EmbeddingBag per table "
                  "(PyTorch only); auto: torchrec_fused when TorchRec is installed and supports the optimizer here",
                  flag_values=f)
    d.DEFINE_enum("sharding_type", "auto", ["auto", "table_wise", "row_wise"],
                  "How TorchRec's planner may shard embedding tables over processes (auto: it chooses per table)",
                  flag_values=f)
    d.DEFINE_integer("embedding_dim", 128, "Dimensionality of embedding space for categorical features",
                     flag_values=f)
    d.DEFINE_list("top_mlp_sizes", ["1024", "1024", "512", "256", "1"], "Linear layer sizes for the top MLP",
                  flag_values=f)
    d.DEFINE_list("bottom_mlp_sizes", ["512", "256", "128"], "Linear layer sizes for the bottom MLP", flag_values=f)
    d.DEFINE_enum("interaction_op", "dot", ["dot", "cat"],
                  "Type of interaction operation to perform. Supported choices: 'dot' or 'cat'", flag_values=f)
    d.DEFINE_boolean("self_interaction", False, "Set to True to use self-interaction", flag_values=f)
    d.DEFINE_string("dataset", None, "Full path to the dataset directory (with its feature_spec.yaml)", flag_values=f)
    d.DEFINE_string("feature_spec", "feature_spec.yaml", "Name of the FeatureSpec file in the dataset directory",
                    flag_values=f)
    d.DEFINE_enum("dataset_type", "parametric", ["parametric", "synthetic_gpu"],
                  "parametric: read --dataset through its FeatureSpec; synthetic_gpu: random batches generated on "
                  "the device (same as --synthetic_dataset)", flag_values=f)
    d.DEFINE_float("dataset_subset", None, "Use only a subset of the training data. If None (default) will use all "
                   "of it. Must be either None, or a float in range [0,1]", flag_values=f)
    d.DEFINE_boolean("shuffle_batch_order", False, "Read batch in train dataset by random order", short_name="shuffle",
                     flag_values=f)
    d.DEFINE_integer("prefetch_batches", 2, "Batches of --dataset read ahead by a background thread (on CUDA also "
                     "copied on a side stream) while the model trains; 0 reads them on the training thread",
                     lower_bound=0, flag_values=f)
    d.DEFINE_integer("max_table_size", None, "Maximum number of rows per embedding table, by default equal to the "
                     "number of unique values for each categorical variable", flag_values=f)
    d.DEFINE_boolean("hash_indices", False, "If True the model will compute `index := index % table size` to ensure "
                     "that the indices match table sizes", flag_values=f)
    d.DEFINE_boolean("synthetic_dataset", False, "Use synthetic instead of real data for benchmarking purposes",
                     flag_values=f)
    d.DEFINE_integer("synthetic_dataset_num_entries", 2 ** 15 * 1024, "Number of samples per epoch for the "
                     "synthetic dataset", flag_values=f)
    d.DEFINE_list("synthetic_dataset_table_sizes", ["100000"] * 26,
                  "Embedding table sizes to use with the synthetic dataset", flag_values=f)
    d.DEFINE_integer("synthetic_dataset_numerical_features", 13,
                     "Number of numerical features of the synthetic dataset", flag_values=f)
    d.DEFINE_integer("num_numerical_features", 13, "Number of numerical features in the dataset. Defaults to 13 "
                     "for the Criteo Terabyte Dataset (the FeatureSpec's numerical channel is checked against it)",
                     flag_values=f)
    d.DEFINE_string("load_checkpoint_path", None, "Path from which to load a checkpoint: one checkpoint, or a "
                    "--save_checkpoint_path directory (its newest complete checkpoint); --mode train resumes from it",
                    flag_values=f)
    d.DEFINE_string("save_checkpoint_path", None, "Directory to which to save the training checkpoints "
                    "(step_<N>/ per checkpoint; the final one when training ends)", flag_values=f)
    d.DEFINE_integer("checkpoint_every_steps", None, "Also save a checkpoint every this many optimization steps "
                     "(needs --save_checkpoint_path)", flag_values=f)
    d.DEFINE_float("checkpoint_every_minutes", None, "Also save a checkpoint when this many minutes have passed "
                   "since the last one (needs --save_checkpoint_path)", flag_values=f)
    d.DEFINE_integer("keep_checkpoints", 2, "Keep only the newest this many checkpoints in --save_checkpoint_path "
                     "(0 keeps all)", flag_values=f)
    d.DEFINE_string("log_path", "./log.json", "Destination for the log file with various results and statistics",
                    flag_values=f)
    d.DEFINE_integer("test_freq", None,
                     "Number of optimization steps between validations. If None will test after each epoch",
                     flag_values=f)
    d.DEFINE_float("test_after", 0.0, "Don't test the model unless this many epochs has been completed",
                   flag_values=f)
    d.DEFINE_integer("print_freq", 200, "Number of optimizations steps between printing training status to stdout",
                     flag_values=f)
    d.DEFINE_integer("benchmark_warmup_steps", 0, "Number of initial iterations to exclude from throughput "
                     "measurements", flag_values=f)
    d.DEFINE_string("base_device", "cuda", "Device to run the majority of the model operations (cuda falls back "
                    "to cpu with a warning when CUDA is absent)", flag_values=f)
    d.DEFINE_enum("backend", None, ["nccl", "gloo"], "torch.distributed backend (default: nccl on CUDA, gloo on CPU)",
                  flag_values=f)
    d.DEFINE_boolean("fp16", True, "If True (default) use Automatic Mixed Precision where the hardware runs it "
                     "natively: on CUDA, and on a CPU with bfloat16 instructions (AVX512-BF16 or AMX); --nofp16 "
                     "trains in float32", flag_values=f)
    d.DEFINE_boolean("amp", False, "Use Automatic Mixed Precision on any device, also a CPU without bfloat16 "
                     "instructions (bfloat16 autocast on a CPU)", flag_values=f)
    d.DEFINE_enum("amp_dtype", None, ["float16", "bfloat16"], "Half type of AMP (default: float16 with the loss "
                  "scaler on CUDA, bfloat16 on a CPU; float16 on a CPU runs the loss-scaled CUDA code path, slowly); "
                  "embeddings stay float32", flag_values=f)
    d.DEFINE_float("loss_scale", 8192.0, "Static loss scale for Mixed Precision Training (float16 only)",
                   flag_values=f)
    d.DEFINE_boolean("cuda_graphs", False, "Capture the MLPs of the training and inference steps in CUDA graphs "
                     "(CUDA only)", flag_values=f)
    d.DEFINE_boolean("compile", False, "torch.compile the bottom MLP, interaction and top MLP for training (the "
                     "embeddings stay eager); compilation takes tens of seconds per batch shape at the start",
                     flag_values=f)
    d.DEFINE_boolean("tf32", True, "On CUDA, let float32 matmuls use TF32 tensor cores (as NVIDIA's FP32 figures do "
                     "on A100 and newer); --notf32 keeps full float32 matmuls", flag_values=f)
    d.DEFINE_list("inference_benchmark_batch_sizes", ["1", "64", "4096"],
                  "Batch sizes for inference throughput and latency measurements", flag_values=f)
    d.DEFINE_integer("inference_benchmark_steps", 200, "Number of steps for measuring inference latency and "
                     "throughput", flag_values=f)
    d.DEFINE_float("auc_threshold", None, "Stop the training after achieving this AUC", flag_values=f)
    d.DEFINE_string("reliability_plot", None, "Write a reliability diagram (PNG: predicted vs observed CTR per "
                    "bucket of predicted probability) of the final evaluation here", flag_values=f)
    d.DEFINE_integer("seed", 12345, "Random seed", flag_values=f)
    d.DEFINE_boolean("Adam_embedding_optimizer", False, "Use Adam for the embeddings (default SGD)", flag_values=f)
    d.DEFINE_boolean("Adam_MLP_optimizer", False, "Use Adam for the MLPs (default SGD)", flag_values=f)


_define_flags(FLAGS)


# ----------------------------------------------------------------------------------------------------------- setup
def _ints(values: Sequence[str], flag: str) -> List[int]:
    try:
        return [int(v) for v in values]
    except ValueError:
        raise ValueError(f"--{flag} must be a comma-separated list of integers, got {','.join(values)}") from None


@dataclass(frozen=True)
class DataSettings:
    """What the dataset and its loaders take from the flags, built once by :meth:`from_flags` (after the CPU defaults
    have set the batch sizes)."""
    synthetic: bool                     # --synthetic_dataset or --dataset_type synthetic_gpu
    dataset: Optional[str]
    feature_spec: str
    num_numerical_features: int
    synthetic_table_sizes: Sequence[str]   # as given; checked only when synthetic
    synthetic_numerical_features: int
    synthetic_num_entries: int
    batch_size: int
    test_batch_size: int
    seed: int
    shuffle_batch_order: bool
    dataset_subset: Optional[float]
    hash_indices: bool
    prefetch_batches: int

    @classmethod
    def from_flags(cls, args) -> "DataSettings":
        return cls(args.synthetic_dataset or args.dataset_type == "synthetic_gpu", args.dataset, args.feature_spec,
                   args.num_numerical_features, tuple(args.synthetic_dataset_table_sizes),
                   args.synthetic_dataset_numerical_features, args.synthetic_dataset_num_entries, args.batch_size,
                   args.test_batch_size, args.seed, args.shuffle_batch_order, args.dataset_subset, args.hash_indices,
                   args.prefetch_batches)


def _dataset_info(data: DataSettings):
    """The dataset's tables and features (the synthetic ones, or the FeatureSpec's), checked against the flags."""
    from dlrm.data import dataset_info, default_synthetic_info
    if data.synthetic:
        return default_synthetic_info(_ints(data.synthetic_table_sizes, "synthetic_dataset_table_sizes"),
                                      data.synthetic_numerical_features)
    if not data.dataset:
        raise ValueError("--dataset is required (or pass --synthetic_dataset for random benchmark data)")
    info = dataset_info(data.dataset, data.feature_spec)
    if info.num_numerical_features != data.num_numerical_features and data.num_numerical_features != 13:
        raise ValueError(f"--num_numerical_features {data.num_numerical_features} but {info.spec.origin} has "
                         f"{info.num_numerical_features} numerical features")
    return info


def _data_loaders(data: DataSettings, info, ctx):
    """``(train_data, test_data)``: functions returning this rank's training batches (new each epoch) and its test
    batches (opened once, on first use)."""
    from dlrm.data import SplitBinaryBatches, SyntheticBatches

    def train_data():
        if data.synthetic:
            return SyntheticBatches(info, data.synthetic_num_entries, data.batch_size, ctx.device, ctx.rank,
                                    ctx.world_size, seed=data.seed)
        return SplitBinaryBatches(info, "train", data.batch_size, ctx.device, ctx.rank, ctx.world_size,
                                  training=True, shuffle=data.shuffle_batch_order, seed=data.seed,
                                  subset=data.dataset_subset, hash_indices=data.hash_indices,
                                  prefetch=data.prefetch_batches)

    cache = {}

    def test_data():
        if "test" not in cache:
            cache["test"] = make_test_data()
        return cache["test"]

    def make_test_data():
        if data.synthetic:
            return SyntheticBatches(info, max(data.synthetic_num_entries // 8, data.test_batch_size),
                                    data.test_batch_size, ctx.device, ctx.rank, ctx.world_size, seed=data.seed + 1,
                                    training=False)
        return SplitBinaryBatches(info, "test", data.test_batch_size, ctx.device, ctx.rank, ctx.world_size,
                                  training=False, hash_indices=data.hash_indices, prefetch=data.prefetch_batches)
    return train_data, test_data


def _table_sizes(info, max_table_size: Optional[int], hash_indices: bool) -> List[int]:
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


def cpu_runs_bfloat16_natively(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU has bfloat16 arithmetic instructions: AVX512-BF16 or AMX-BF16 (Linux CPU flags).

    torch 2.13 reports only the vector width (``torch.backends.cpu.get_cpu_capability()`` says ``AVX512`` with or
    without BF16), so the kernel's flag list is read; where it cannot be read the answer is False (float32).
    """
    from recsys_common.machine import cpu_bf16_instructions
    return cpu_bf16_instructions(cpuinfo) in ("amx", "avx512_bf16")


class _Amp:
    """Autocast and (float16 only) a static loss scaler, as NVIDIA's recipe: scale 8192, never grown."""

    def __init__(self, enabled: bool, device, amp_dtype: Optional[str], loss_scale: float):
        import torch
        self.enabled = enabled
        self.device_type = device.type
        if amp_dtype is None:  # NVIDIA's float16 on CUDA; a CPU runs bfloat16 natively (AVX512-BF16, AMX), not float16
            amp_dtype = "float16" if device.type == "cuda" else "bfloat16"
        self.dtype = torch.float16 if amp_dtype == "float16" else torch.bfloat16
        self.scaler = None
        if enabled and self.dtype == torch.float16:
            # torch.amp.GradScaler(device) is torch >= 2.3 (a CPU scaler too); older 2.x have torch.cuda.amp's only.
            scaler_class = getattr(torch.amp, "GradScaler", None)
            if scaler_class is not None:
                self.scaler = scaler_class(device.type, init_scale=loss_scale, growth_interval=1_000_000_000)
            elif device.type == "cuda":
                self.scaler = torch.cuda.amp.GradScaler(init_scale=loss_scale, growth_interval=1_000_000_000)
            else:
                raise ValueError(f"--amp_dtype float16 on a CPU needs torch >= 2.3 (a CPU loss scaler); this is "
                                 f"torch {torch.__version__}: use --amp_dtype bfloat16")

    def autocast(self):
        import torch
        # cache_enabled=False: required when parts of the step are captured in CUDA graphs, harmless otherwise.
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled, cache_enabled=False)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "") if self.enabled else "float32"


# ------------------------------------------------------------------------------------------------------ evaluation
def evaluate(trainable, data, amp: _Amp, negative_downsampling_rate: float = 1.0) -> Dict[str, Any]:
    """Exact AUC, mean BCE and the click-model metrics over the whole mapping, every process scoring its own rows.

    No process gathers every logit: the AUC all-gathers only the smaller class (``distributed_roc_auc_score``); log
    loss, normalized entropy, calibration and the reliability buckets are sums all-reduced once (``ClickMetrics``).
    ``negative_downsampling_rate`` < 1 also reports ``normalized_entropy_corrected`` / ``calibration_corrected``.
    ``ctr_sums`` and ``reliability_sums`` (lists) are the summed sums, for the log and the reliability diagram."""
    import torch
    from dlrm.utils.distributed import all_reduce_sum
    from dlrm.utils.metrics import ClickMetrics, binary_cross_entropy_sum, distributed_roc_auc_score
    model = trainable.core  # no DDP wrapper: evaluation needs no gradient sync
    model.eval()
    click = ClickMetrics(negative_downsampling_rate)
    logits_parts, label_parts = [], []
    with torch.no_grad():
        for numerical, categorical, label, valid in data:
            with amp.autocast():
                logits = model(numerical, categorical)
            logits_parts.append(logits[:valid].float())
            label_parts.append(label[:valid])
            click.add(label_parts[-1], logits=logits_parts[-1])
    model.train()
    device = data.device if hasattr(data, "device") else torch.device("cpu")
    logits = torch.cat(logits_parts) if logits_parts else torch.zeros(0, device=device)
    labels = torch.cat(label_parts) if label_parts else torch.zeros(0, device=device)
    loss_sum, count = all_reduce_sum([binary_cross_entropy_sum(logits, labels).item(), float(labels.numel())],
                                     logits.device)
    click.all_reduce(logits.device)
    stats: Dict[str, int] = {}
    auc = distributed_roc_auc_score(labels, logits, stats)
    return {"auc": auc, "loss": loss_sum / max(count, 1.0), "samples": int(count),
            "auc_rows_gathered": stats["rows_gathered"], **click.metrics(),
            "ctr_sums": click.ctr_sums.tolist(), "reliability_sums": click.reliability_sums.tolist()}


# Evaluation keys that are figures (logged, and in the summary with a ``test_`` prefix), next to auc and loss.
CLICK_METRIC_KEYS = ("log_loss", "normalized_entropy", "calibration", "normalized_entropy_corrected",
                     "calibration_corrected")


def _click_metric_entries(metrics: Dict[str, Any]) -> Dict[str, float]:
    """``test_<key>`` of the click metrics an evaluation has (``CLICK_METRIC_KEYS``)."""
    return {f"test_{k}": metrics[k] for k in CLICK_METRIC_KEYS if k in metrics}


def _final_evaluation_entries(metrics: Dict[str, Any], reliability_plot: Optional[str], ctx) -> Dict[str, Any]:
    """The summary's entries of the final evaluation beyond AUC and loss: the click metrics, the summed
    ``test_ctr_sums`` and ``test_reliability_sums`` (lists; ``recsys_common.plot_log`` draws the reliability diagram
    from them), and the diagram itself at ``reliability_plot`` (rank 0 writes it)."""
    out = {**_click_metric_entries(metrics), "test_ctr_sums": metrics["ctr_sums"],
           "test_reliability_sums": metrics["reliability_sums"]}
    if reliability_plot and ctx.is_main and metrics["samples"] > 0:
        from recsys_common.metrics import plot_reliability
        os.makedirs(os.path.dirname(os.path.abspath(reliability_plot)), exist_ok=True)
        out["reliability_plot"] = plot_reliability(metrics["reliability_sums"], reliability_plot,
                                                   f"DLRM test, {metrics['samples']} rows:", metrics["ctr_sums"])
    return out


# -------------------------------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class TrainConfig:
    """The training loop's settings, read once from the flags (:meth:`from_flags`); the loop sees nothing else.

    ``schedule``: the learning-rate schedule's arguments (``LearningRateSchedule(**schedule)``: NVIDIA's warmup, then
    polynomial decay); ``test_freq`` None evaluates after each epoch; ``print_freq`` 0 never prints.
    """
    epochs: int = 1
    max_steps: Optional[int] = None
    batch_size: int = 32768
    schedule: Dict[str, float] = field(default_factory=dict)
    print_freq: int = 200
    test_freq: Optional[int] = None
    test_after: float = 0.0
    auc_threshold: Optional[float] = None
    benchmark_warmup_steps: int = 0
    cuda_graphs: bool = False
    negative_downsampling_rate: float = 1.0   # the dataset's (DatasetInfo), for the evaluations' logit correction

    @classmethod
    def from_flags(cls, args, negative_downsampling_rate: float = 1.0) -> "TrainConfig":
        return cls(epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size,
                   schedule={"base_lr": args.lr, "warmup_steps": args.warmup_steps,
                             "warmup_factor": args.warmup_factor, "decay_start_step": args.decay_start_step,
                             "decay_steps": args.decay_steps, "decay_power": args.decay_power,
                             "end_lr": args.decay_end_lr},
                   print_freq=args.print_freq, test_freq=args.test_freq, test_after=args.test_after,
                   auc_threshold=args.auc_threshold, benchmark_warmup_steps=args.benchmark_warmup_steps,
                   cuda_graphs=args.cuda_graphs, negative_downsampling_rate=negative_downsampling_rate)


class _LossWindow:
    """The losses since the last progress line, per process, kept on the device (no host sync per step); a
    checkpoint saves them, so the first line printed after a resume equals the uninterrupted run's."""

    def __init__(self, device, rank: int, world_size: int, saved: Optional[Dict[str, Any]] = None):
        import torch
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
        return _mean_over_ranks(self.sum.item(), self.count, self.device)

    def reset(self) -> None:
        self.sum.zero_()
        self.count = 0

    def saved(self) -> Dict[str, Any]:
        """Collective: every process's sum, for a checkpoint."""
        from dlrm.utils.distributed import all_gather_1d
        return {"sums": all_gather_1d(self.sum.reshape(1).double()).tolist(), "count": self.count}


class _StepTimer:
    """Training throughput over the steps after ``--benchmark_warmup_steps`` (counted from the resumed step)."""

    def __init__(self, warmup_steps: int, first_step: int, device):
        self.warmup_end = first_step + warmup_steps if warmup_steps else None
        self.device = device
        self.start = time.perf_counter() if not warmup_steps else None
        self.steps = 0

    def step(self, global_step: int) -> None:
        if global_step == self.warmup_end:
            _sync(self.device)
            self.start, self.steps = time.perf_counter(), 0
        elif self.start is not None:
            self.steps += 1

    def results(self, batch_size: int) -> Dict[str, float]:
        if self.start is None or self.steps == 0:
            return {}
        elapsed = time.perf_counter() - self.start
        return {"train_throughput": self.steps * batch_size / elapsed, "train_step_time": elapsed / self.steps}


def train(config: TrainConfig, ctx, trainable, amp: _Amp, train_data, test_data, logger, start: Dict[str, Any],
          checkpoints=None) -> Dict[str, Any]:
    """Train from position ``start`` (empty, or a checkpoint's); ``checkpoints``: a ``CheckpointSaver`` or None.

    Each step: forward/backward/update -> progress line every ``print_freq`` -> evaluation every ``test_freq``
    (or at each epoch's end) -> checkpoint when its policy says so. Returns the evaluations, the last mean loss,
    the throughput and the position reached.
    """
    import torch
    from dlrm.utils.distributed import barrier
    from dlrm.utils.lr_schedule import LearningRateSchedule
    from recsys_common.logger import Progress, check_finite, hms
    schedule = LearningRateSchedule(**config.schedule)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    steps_per_epoch = len(train_data)
    global_step = start.get("global_step", 0)
    epoch = start.get("epoch", 0)
    # A checkpoint taken at an epoch's last step (step_in_epoch == steps_per_epoch) resumes into that epoch's end:
    # the loop below then reads no batch and runs the end-of-epoch evaluation the killed run may not have reached.
    step_in_epoch = start.get("step_in_epoch", 0)
    results: Dict[str, Any] = {"evaluations": []}
    stop = config.max_steps is not None and global_step >= config.max_steps
    last_eval_step = -1
    losses = _LossWindow(ctx.device, ctx.rank, ctx.world_size, start.get("loss_window"))
    nonfinite = _NonFiniteLoss(ctx.device, checkpoints)
    timer = _StepTimer(config.benchmark_warmup_steps, global_step, ctx.device)
    graphs = _maybe_graph_mlps(config.cuda_graphs, ctx, trainable, amp, train_data)
    window = Progress("train", steps_per_epoch, unit="steps", out=False)  # the figures of one print window

    def training_step(numerical, categorical, label):
        trainable.zero_grad(amp.scaler)  # with a scaler, also unscales the fused tables' gradient in backward
        with amp.autocast():
            logits = graphs.forward(numerical, categorical) if graphs else trainable.module(numerical, categorical)
        loss = loss_fn(logits.float(), label)
        (amp.scaler.scale(loss) if amp.scaler is not None else loss).backward()
        trainable.step(amp.scaler)  # the scaler steps only optimizers with .grad (not TorchRec's fused one)
        return loss

    def print_progress(lr: float) -> None:
        """NVIDIA's line: ``Epoch:[e/E] [s/S] eta: H:MM:SS loss: ... step_time: ... lr: ...``."""
        nonfinite.check()
        mean_loss = losses.mean_over_ranks()
        window.total = steps_per_epoch - step_in_epoch + losses.count  # the eta: what is left of the epoch
        window.set(losses.count)
        step_time = 1.0 / window.rate()
        if ctx.is_main:
            print(f"Epoch:[{epoch}/{config.epochs}] [{step_in_epoch}/{steps_per_epoch}] "
                  f"eta: {hms(window.seconds_left())} loss: {mean_loss:.4f} step_time: {step_time:.6f} lr: {lr:.4f}",
                  flush=True)
        logger.log(step=(epoch, global_step), data={"loss": mean_loss, "lr": lr, "step_time": step_time})
        results["train_loss"] = mean_loss
        losses.reset()
        window.restart()
        check_finite(mean_loss, "training loss became {value} at step {step}; lower --lr or lengthen "
                                "--warmup_steps", step=global_step)

    def evaluate_now(tag_epoch: int) -> bool:
        """Evaluate at ``global_step``; True when ``--auc_threshold`` is reached (stop)."""
        nonlocal last_eval_step
        nonfinite.check()
        last_eval_step = global_step
        metrics = evaluate(trainable, test_data(), amp, config.negative_downsampling_rate)
        results["evaluations"].append({"step": global_step, **metrics})
        logger.log(step=(tag_epoch, global_step), data={"test_auc": metrics["auc"], "test_loss": metrics["loss"],
                                                        **_click_metric_entries(metrics)})
        return config.auc_threshold is not None and metrics["auc"] >= config.auc_threshold

    def position() -> Dict[str, Any]:
        """Where training stands, to resume from (collective): data position (the LR schedule follows
        global_step) and the losses accumulated since the last progress line."""
        return {"epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": global_step,
                "loss_window": losses.saved()}

    while not stop and epoch < config.epochs:
        train_data.set_epoch(epoch)
        for numerical, categorical, label, _ in train_data.iterate(step_in_epoch):
            if config.max_steps is not None and global_step >= config.max_steps:
                stop = True
                break
            global_step += 1
            step_in_epoch += 1
            lr = schedule.apply(trainable.optimizers, global_step)
            loss = training_step(numerical, categorical, label)
            losses.add(loss)
            nonfinite.record(loss, global_step)
            timer.step(global_step)
            if config.print_freq and global_step % config.print_freq == 0:
                print_progress(lr)
            if config.test_freq and global_step % config.test_freq == 0 and \
                    epoch + step_in_epoch / steps_per_epoch >= config.test_after and evaluate_now(epoch):
                logger.log(step=(epoch, global_step), data={"early_stop": f"AUC >= {config.auc_threshold}"})
                stop = True
                break
            if checkpoints is not None and checkpoints.due(global_step):
                nonfinite.check()  # never save weights a non-finite loss has touched
                checkpoints.save(position())
        else:  # epoch finished
            epoch += 1
            step_in_epoch = 0
            if not config.test_freq and epoch >= config.test_after and last_eval_step != global_step:
                stop = evaluate_now(epoch - 1)
            continue
        break
    _sync(ctx.device)
    nonfinite.check()
    if losses.count:
        results["train_loss"] = losses.mean_over_ranks()
    results.update(timer.results(config.batch_size))
    if last_eval_step != global_step:
        evaluate_now(epoch)
    results["global_step"] = global_step
    results["position"] = position()
    barrier()
    return results


class _NonFiniteLoss:
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
        import torch
        self.device = device
        self.per_step = device.type != "cuda" if per_step is None else per_step
        self.checkpoints = checkpoints
        self._step = torch.zeros((), dtype=torch.int64, device=device)
        self._first_bad = torch.zeros((), dtype=torch.int64, device=device)  # 0: none (steps count from 1)

    def record(self, loss, global_step: int) -> None:
        import torch
        if self.per_step:
            from dlrm.utils.distributed import all_reduce_sum, group_active
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
            from dlrm.utils.distributed import all_reduce_min_int, group_active
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


def _mean_over_ranks(total: float, count: int, device) -> float:
    from dlrm.utils.distributed import all_reduce_sum
    total, count = all_reduce_sum([total, float(count)], device)
    return total / count


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    from dlrm.utils.cuda_graphs import GraphedDLRM
    return GraphedDLRM(trainable, amp, train_data.local_batch_size, len(trainable.core.table_sizes),
                       trainable.core.bottom_mlp.in_features, ctx.device)


# ---------------------------------------------------------------------------------------------- inference benchmark
def inference_benchmark(batch_sizes: Sequence[int], steps: int, ctx, trainable, amp: _Amp, info,
                        synthetic: bool, seed: int, hash_indices: bool) -> Dict[str, Any]:
    """Per batch size: samples/s and mean/p90/p95/p99 latency of forward passes (this process's batches).

    ``latencies_ms`` keeps every timed step's latency, so the figures can be checked against them; it goes into the
    returned results, not into the log's summary.
    """
    import numpy as np
    import torch
    from dlrm.data import SplitBinaryBatches, SyntheticBatches
    model = trainable.core
    model.eval()
    out = {}
    for batch_size in batch_sizes:
        global_batch = batch_size * ctx.world_size
        if synthetic:
            data = SyntheticBatches(info, global_batch * 4, global_batch, ctx.device, ctx.rank, ctx.world_size,
                                    seed=seed, pool_size=4)
        else:
            data = SplitBinaryBatches(info, "test", global_batch, ctx.device, ctx.rank, ctx.world_size,
                                      training=True, hash_indices=hash_indices)
        batches = [b for _, b in zip(range(4), data)]
        latencies = []
        with torch.no_grad():
            for step in range(steps + 10):
                numerical, categorical, _, _ = batches[step % len(batches)]
                _sync(ctx.device)
                begin = time.perf_counter()
                with amp.autocast():
                    model(numerical, categorical)
                _sync(ctx.device)
                if step >= 10:  # warmup
                    latencies.append(time.perf_counter() - begin)
        lat = np.array(latencies) * 1000.0
        out[str(batch_size)] = {
            "throughput": batch_size / (lat.mean() / 1000.0),
            "latency_mean_ms": float(lat.mean()), "latency_p90_ms": float(np.percentile(lat, 90)),
            "latency_p95_ms": float(np.percentile(lat, 95)), "latency_p99_ms": float(np.percentile(lat, 99)),
            "latencies_ms": lat.tolist(),
        }
    model.train()
    return out


# ------------------------------------------------------------------------------------------------------------ main
def run(args) -> Dict[str, Any]:
    """Everything after flag parsing; ``args`` is a namespace with one attribute per flag."""
    import torch
    from recsys_common.logger import Logger
    from dlrm.model.parallel import ModelConfig, build_trainable_model, resolve_embedding_type
    from dlrm.utils import checkpointing
    from dlrm.utils.distributed import resolve_device, setup, teardown

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(args.base_device, local_rank)
    embedding_type = resolve_embedding_type(args.embedding_type, device, args.Adam_embedding_optimizer)
    ctx = setup(args.base_device, args.backend, need_group=embedding_type == "torchrec_fused")
    logger = Logger(args.log_path, rank=ctx.rank, stdout=True,
                    append=bool(args.load_checkpoint_path and args.mode == "train"))
    try:
        torch.manual_seed(args.seed)
        info = _dataset_info(DataSettings.from_flags(args))
        from dlrm.utils.cpu_defaults import apply_cpu_defaults  # issue 18: NVIDIA's GPU batch is not a CPU default
        cpu_line = apply_cpu_defaults(args, ctx.device.type, ctx.world_size, info)
        if cpu_line and ctx.rank == 0:
            print(cpu_line, flush=True)
        train_data, test_data = _data_loaders(DataSettings.from_flags(args), info, ctx)  # with the batch sizes chosen
        table_sizes = _table_sizes(info, args.max_table_size, args.hash_indices)
        config = ModelConfig(info.num_numerical_features, table_sizes, info.categorical_features,
                             args.embedding_dim, _ints(args.bottom_mlp_sizes, "bottom_mlp_sizes"),
                             _ints(args.top_mlp_sizes, "top_mlp_sizes"), args.interaction_op, args.self_interaction,
                             args.hash_indices, list(info.hotness))
        # --fp16 (default on, as NVIDIA's) turns AMP on where it is native: CUDA, and CPUs with bfloat16 instructions,
        # where bfloat16 autocast measured faster than float32 at the same AUC (README, "Speed"). Elsewhere a CPU
        # emulates bfloat16, so there it takes an explicit --amp.
        amp_on = args.amp or (args.fp16 and (ctx.device.type == "cuda" or cpu_runs_bfloat16_natively()))
        amp = _Amp(amp_on, ctx.device, args.amp_dtype, args.loss_scale)
        local_batch = max(args.batch_size // ctx.world_size, 1)
        trainable = build_trainable_model(config, embedding_type, ctx.device, ctx.world_size, args.lr,
                                          args.Adam_MLP_optimizer, args.Adam_embedding_optimizer,
                                          args.sharding_type, local_batch)
        if ctx.device.type == "cuda":  # TF32 for float32 matmuls and convolutions (Ampere and newer)
            torch.backends.cuda.matmul.allow_tf32 = args.tf32
            torch.backends.cudnn.allow_tf32 = args.tf32
        if args.compile and args.cuda_graphs:
            raise ValueError("--compile and --cuda_graphs cannot be combined: pick one for the MLPs")
        if args.compile and args.mode == "train":
            from dlrm.utils.compile import compile_dense
            compile_dense(trainable.core)  # in place: the module classes and state_dict keys are unchanged
        params = {k: v for k, v in vars(args).items()}
        params.update({"resolved_embedding_type": embedding_type, "device": str(ctx.device),
                       "world_size": ctx.world_size, "amp_dtype_used": amp.dtype_name,
                       "table_sizes": table_sizes})
        logger.log_parameters(params)
        start: Dict[str, Any] = {}
        training = {"batch_size": args.batch_size, "lr": args.lr}
        resumed_from = None
        if args.load_checkpoint_path:
            # A different model configuration is refused (naming the field); a changed batch size, learning rate or
            # world size only warns. Resuming also restores optimizers, loss scaler and every process's RNG state.
            meta = checkpointing.load_checkpoint(args.load_checkpoint_path, trainable, amp.scaler,
                                                 load_optimizer=args.mode == "train", config=config.to_dict(),
                                                 training=training if args.mode == "train" else None,
                                                 rank=ctx.rank, world_size=ctx.world_size)
            if args.mode == "train":
                start = dict(meta["position"])
                resumed_from = meta["path"]
                logger.log(step=(start.get("epoch", 0), start.get("global_step", 0)),
                           data={"resumed_from": resumed_from})
        saver = None
        if args.mode == "train":
            saver = _checkpoint_saver(args.save_checkpoint_path, args.checkpoint_every_steps,
                                      args.checkpoint_every_minutes, args.keep_checkpoints, ctx, trainable, amp,
                                      config.to_dict(), training, resumed_from)
        results: Dict[str, Any] = {"mode": args.mode, "embedding_type": embedding_type,
                                   "world_size": ctx.world_size, "device": str(ctx.device),
                                   "amp": amp.dtype_name}
        if args.mode in ("train", "test"):
            test_data()  # open (and so check) the test mapping before spending time on training
        if args.mode == "train":
            results.update(train(TrainConfig.from_flags(args, info.negative_downsampling_rate), ctx, trainable, amp,
                                 train_data(), test_data, logger, start, saver))
            if results["evaluations"]:
                last = results["evaluations"][-1]
                results["auc"], results["test_loss"] = last["auc"], last["loss"]
                results["test_samples"] = last["samples"]
                results["test_auc_rows_gathered"] = last["auc_rows_gathered"]
                results["best_auc"] = max(e["auc"] for e in results["evaluations"])
                results.update(_final_evaluation_entries(last, args.reliability_plot, ctx))
            if saver is not None:  # the final checkpoint (no second copy when the last step was just saved)
                results["checkpoint"] = saver.save(results["position"])
        elif args.mode == "test":
            metrics = evaluate(trainable, test_data(), amp, info.negative_downsampling_rate)
            results.update({"auc": metrics["auc"], "test_loss": metrics["loss"], "test_samples": metrics["samples"],
                            "test_auc_rows_gathered": metrics["auc_rows_gathered"],
                            **_final_evaluation_entries(metrics, args.reliability_plot, ctx)})
        else:
            results["inference"] = inference_benchmark(
                _ints(args.inference_benchmark_batch_sizes, "inference_benchmark_batch_sizes"),
                args.inference_benchmark_steps, ctx, trainable, amp, info,
                synthetic=args.synthetic_dataset or args.dataset_type == "synthetic_gpu", seed=args.seed,
                hash_indices=args.hash_indices)
        summary = {k: v for k, v in results.items() if k not in ("evaluations", "position")}
        if "inference" in summary:  # the per-step latencies stay out of the log
            summary["inference"] = {b: {k: v for k, v in r.items() if k != "latencies_ms"}
                                    for b, r in summary["inference"].items()}
        logger.log_summary(summary)
        return results
    finally:
        logger.close()
        # The model (DMP / DDP) and the checkpoint saver hold the process group: drop them so that teardown can
        # release the group's gloo threads now rather than race the interpreter's exit (an abort after a good run).
        trainable = saver = None  # noqa: F841
        _drop_frames_of_failed_call()
        teardown(ctx)


def _drop_frames_of_failed_call() -> None:
    """While an exception propagates, its traceback keeps the frames it passed through alive, and train()'s frame holds
    the model (and so the process group): clear the locals of those finished frames so teardown can release it. The
    traceback's lines, and so the error report, stay as they were."""
    import traceback
    error = sys.exc_info()[1]
    if error is not None and error.__traceback__ is not None and error.__traceback__.tb_next is not None:
        traceback.clear_frames(error.__traceback__.tb_next)


def _checkpoint_saver(root: Optional[str], every_steps: Optional[int], every_minutes: Optional[float], keep: int,
                      ctx, trainable, amp, config: Dict[str, Any], training: Dict[str, Any],
                      resumed_from: Optional[str]):
    """The ``CheckpointSaver`` of a training run saving under ``root`` (--save_checkpoint_path), else None (checking
    the flags)."""
    from dlrm.utils import checkpointing
    if not root:
        if every_steps is not None or every_minutes is not None:
            raise ValueError("--checkpoint_every_steps/--checkpoint_every_minutes need --save_checkpoint_path")
        return None
    # First, and on every rank: a multi-node job needs the directory on a shared file system.
    checkpointing.check_shared_root(root, ctx.rank, ctx.world_size, ctx.device)
    existing = checkpointing.list_checkpoints(root)
    # Checkpoints of another run in the same directory would interleave with ours, and resuming from the directory
    # would pick whichever has the highest step: only the run resumed from the newest of them may add to it.
    if existing and (resumed_from is None or os.path.realpath(resumed_from) != os.path.realpath(existing[-1][1])):
        raise checkpointing.CheckpointError(
            f"{root}: already holds checkpoints of another run (newest: {existing[-1][1]}); pass "
            f"--load_checkpoint_path {root} to resume that run, or choose a new --save_checkpoint_path")
    saver = checkpointing.CheckpointSaver(root, trainable, config, training, ctx.rank, ctx.world_size, ctx.device,
                                          amp.scaler, every_steps, every_minutes, keep)
    if existing:  # resumed from the newest checkpoint here: its step is saved already
        saver.last_step, saver.last_path = existing[-1][0], existing[-1][1]
    return saver


def parse(argv: Optional[Sequence[str]]) -> SimpleNamespace:
    """Parse ``argv`` (without the program name) into a fresh namespace; flags not given take their defaults."""
    FLAGS.unparse_flags()
    FLAGS(["dlrm.scripts.main"] + list(argv if argv is not None else sys.argv[1:]))
    # flags_given: what the command line set (even to the default value); the CPU defaults never replace those
    return SimpleNamespace(**FLAGS.flag_values_dict(), flags_given=sorted(n for n in FLAGS if FLAGS[n].present))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Entry point for tests and scripts: ``main(["--mode", "train", "--dataset", d])`` returns the results dict."""
    return run(parse(argv))


def _cli() -> int:
    """The command line's exit status (recsys_common.cli): 2 for a bad flag or bad input (a dataset, a spec, a
    checkpoint), 1 for a failed run (a diverged loss, a path that cannot be written, a missing dependency)."""
    from dlrm.data import DataError
    from dlrm.utils.checkpointing import CheckpointError
    from recsys_common.cli import exit_status
    from recsys_common.datasets import DatasetError
    from recsys_common.feature_spec import FeatureSpecError
    if any(a in ("--help", "-h", "--helpfull") for a in sys.argv[1:]):
        print(__doc__)
        print(FLAGS.get_help())
        return 0
    return exit_status(main, prog="dlrm.scripts.main", hint="run with --help for the flags",
                       hint_errors=(flags.Error,),
                       input_errors=(flags.Error, DataError, DatasetError, FeatureSpecError, CheckpointError),
                       failures=(ValueError, FloatingPointError, RuntimeError, OSError))


if __name__ == "__main__":
    sys.exit(_cli())
