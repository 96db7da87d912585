"""ncf.py's command line, checked, and settled once into the frozen :class:`NcfConfig` that a run is handed.

    args = parse_args(argv)                     # the flags as typed (NVIDIA's defaults filled in)
    given = given_flags(build_parser(), argv)   # which of them the user typed
    config, line = settle(args, given, device, train_rows)   # + the CPU defaults: what the run uses

Nothing after :func:`settle` rewrites a setting: the training loop, checkpoints and the log read ``config``.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import FrozenSet, Optional, Sequence, Tuple

import torch

from recsys_common import cpu_defaults
from recsys_common.cli import InputError

from .checkpointing import RESUME_CHECKPOINT
from .model import MODEL_NAMES


class ConfigurationError(InputError):
    """Flags that cannot give a meaningful result with this dataset (e.g. ``-k`` >= candidates per user)."""


def build_parser() -> argparse.ArgumentParser:
    """ncf.py's command line: NVIDIA's flags and defaults, then this recipe's additions."""
    p = argparse.ArgumentParser(description="Train a Neural Collaborative Filtering model")
    p.add_argument("--data", type=str, required=True, help="Path to the directory with the feature spec and data files")
    p.add_argument("--feature_spec_file", type=str, default="feature_spec.yaml",
                   help="Name of the feature spec file inside --data")
    p.add_argument("-e", "--epochs", type=int, default=30, help="Number of epochs for training")
    p.add_argument("-b", "--batch_size", type=int, default=2 ** 20,
                   help="Number of examples for each iteration (global, over all processes); "
                        "on CPU, when not given, chosen from the data (see the first line of output)")
    p.add_argument("--valid_batch_size", type=int, default=2 ** 20, help="Number of examples in each validation chunk")
    p.add_argument("-f", "--factors", type=int, default=64,
                   help="Number of predictive factors (on CPU, when none of -b -l -f --layers --dropout -b1 -b2 is given: 16, the published NeuMF's model)")
    p.add_argument("--layers", nargs="+", type=int, default=[256, 256, 128, 64],
                   help="Sizes of hidden layers for MLP (on CPU, when none of -b -l -f --layers --dropout -b1 -b2 is given: 64 32 16 8)")
    p.add_argument("-n", "--negative_samples", type=int, default=4, help="Number of negative examples per interaction")
    p.add_argument("-l", "--learning_rate", type=float, default=0.0045,
                   help="Learning rate for optimizer; on CPU, when none of -b -l -f --layers --dropout -b1 -b2 is given: 0.001 at -b 256 (the published NeuMF's), "
                        "else, when -b is not given, 0.002 x sqrt(batch / 1024) up to 0.004 (measured on CPUs; see "
                        "RESULTS.md)")
    p.add_argument("-k", "--topk", type=int, default=10, help="Rank for test examples to be considered a hit")
    p.add_argument("--seed", "-s", type=int, default=None, help="Manually set random seed for torch")
    p.add_argument("--threshold", "-t", type=float, default=1.0, help="Stop training early at threshold")
    p.add_argument("--beta1", "-b1", type=float, default=0.25, help="Beta1 for Adam (on CPU, when none of -b -l -f --layers --dropout -b1 -b2 is given: 0.9)")
    p.add_argument("--beta2", "-b2", type=float, default=0.5, help="Beta2 for Adam (on CPU, when none of -b -l -f --layers --dropout -b1 -b2 is given: 0.999)")
    p.add_argument("--eps", type=float, default=1e-8, help="Epsilon for Adam")
    p.add_argument("--dropout", type=float, default=0.5,
                   help="Dropout probability, if equal to 0 will not use dropout at all (on CPU, when none of -b -l -f --layers --dropout -b1 -b2 is given: 0)")
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
    p.add_argument("--select_on", choices=("auto", "validation", "test"), default="auto",
                   help="How the best epoch (model.pth, the summary's best_hr) is chosen. validation: each user's "
                        "latest training interaction is held out with sampled negatives (the NCF paper's protocol), "
                        "the epoch with the best validation HR is kept, its test HR reported, and training stops "
                        "after --early_stop_patience epochs without improvement; test: the best test HR, trained on "
                        "every training row (NVIDIA's, for comparisons with their figures); auto: validation on "
                        "CPU, test on GPU")
    p.add_argument("--early_stop_patience", type=int, default=5,
                   help="With --select_on validation: stop after this many epochs without a better validation HR "
                        "(0: never)")
    p.add_argument("--tune", action="store_true",
                   help="Before training, try a few learning rates (then negatives and factors) for --tune_epochs "
                        "epochs each on the validation split within --tune_budget_s, print the table, and train the "
                        "best for -e epochs (one process)")
    p.add_argument("--tune_budget_s", type=float, default=600.0,
                   help="With --tune: seconds the search may take (a trial starts only if it fits)")
    p.add_argument("--tune_epochs", type=int, default=3, help="With --tune: epochs of each trial")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None,
                   help="Set by torch.distributed.launch; LOCAL_RANK from the environment is used otherwise")
    return p



given_flags = cpu_defaults.given_flags  # the one implementation, shared with the other recipes


@dataclass(frozen=True)
class NcfConfig:
    """One run's settings: the flags of :func:`build_parser` (same names) after the CPU defaults, plus what settled
    them. Built once by :func:`settle`; frozen, so no part of the run can change another part's view of it."""
    data: str
    feature_spec_file: str
    epochs: int
    batch_size: int
    valid_batch_size: int
    factors: int
    layers: Tuple[int, ...]
    negative_samples: int
    learning_rate: float
    topk: int
    seed: Optional[int]
    threshold: float
    beta1: float
    beta2: float
    eps: float
    dropout: float
    checkpoint_dir: str
    load_checkpoint_path: Optional[str]
    mode: str
    grads_accumulated: int
    amp: bool
    log_path: str
    model: str
    amp_dtype: str
    resume: bool
    device: str
    apex_fused_adam: bool
    compile: bool
    exclude_positives: bool
    optimizer: str
    l2_embedding: float
    pretrained_gmf: Optional[str]
    pretrained_mlp: Optional[str]
    alpha: float
    learning_rate_decay: float
    embedding_init_std: float
    gmf_dot_product: bool
    select_on: str               # "validation" or "test" once settled ("auto" resolved by the device)
    early_stop_patience: int
    tune: bool
    tune_budget_s: float
    tune_epochs: int
    local_rank: Optional[int]
    given_flags: FrozenSet[str] = frozenset()   # the flags the user typed (the CPU defaults leave these alone)
    cpu_defaults: Optional[str] = None          # the line saying what the CPU defaults chose (None: nothing)

    def log_parameters(self) -> dict:
        """The settings as the log's PARAMETER record holds them (NVIDIA's flag names, lists as lists)."""
        params = dataclasses.asdict(self)
        params.pop("given_flags")
        params["layers"] = list(self.layers)
        return params


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The flags the user gave (argparse's namespace, NVIDIA's defaults filled in), each checked; a bad one exits
    with argparse's usage line. :func:`settle` turns them into the run's :class:`NcfConfig`."""
    p = build_parser()
    args = p.parse_args(argv)
    checks = [(args.epochs >= 0, "--epochs must be >= 0"), (args.batch_size > 0, "--batch_size must be > 0"),
              (args.valid_batch_size > 0, "--valid_batch_size must be > 0"), (args.factors > 0, "--factors must be > 0"),
              (all(s > 0 for s in args.layers), "--layers must be positive"),
              (args.negative_samples >= 0, "--negative_samples must be >= 0"), (args.topk > 0, "--topk must be > 0"),
              (0 <= args.dropout < 1, "--dropout must be in [0, 1)"),
              (args.grads_accumulated > 0, "--grads_accumulated must be > 0"),
              (args.early_stop_patience >= 0, "--early_stop_patience must be >= 0"),
              (args.tune_budget_s > 0, "--tune_budget_s must be > 0"),
              (args.tune_epochs > 0, "--tune_epochs must be > 0")]
    for ok, message in checks:
        if not ok:
            p.error(message)
    if args.tune and args.select_on == "test":
        p.error("--tune chooses on the validation split: it cannot be combined with --select_on test")
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



# The rule is recsys_common.cpu_defaults' (shared by every recipe); NCF supplies NVIDIA's values and its memory model.
NVIDIA_BATCH_SIZE, NVIDIA_LEARNING_RATE = 2 ** 20, 0.0045  # tuned for one 32-80 GB GPU on ML-20m
CPU_MIN_STEPS_PER_EPOCH = cpu_defaults.MIN_STEPS_PER_EPOCH
CPU_MEMORY_FRACTION = cpu_defaults.MEMORY_FRACTION
CPU_MIN_BATCH = cpu_defaults.MIN_BATCH
# Peak RSS of one training step per row and per float of width (2 f + L0 + sum(layers)): 5.30 GB at -b 2**20 with
# NVIDIA's model (width 1088) on ML-100k, measured with /usr/bin/time -v (2026-11-25, AMD EPYC): 4.6 bytes.
BYTES_PER_ROW_PER_WIDTH = 4.6
machine_memory_bytes = cpu_defaults.machine_memory_bytes
# The learning rate of NVIDIA's model on CPU (when a flag of CPU_MODEL_FLAGS other than -b / -l was given) is scaled
# from a rate measured on CPUs, not from NVIDIA's: NVIDIA's 0.0045 at 2**20 rows, scaled by sqrt(batch / 2**20) to a
# CPU batch (1e-4 to 6e-4), left NeuMF barely above popularity on sparse data (issue 35). CPU_ANCHOR_LEARNING_RATE at
# CPU_ANCHOR_BATCH rows, scaled by sqrt(batch / CPU_ANCHOR_BATCH), was the best rate for NVIDIA's model over five
# datasets of 0.3-6.3 % density (RESULTS.md, "CPU defaults"; benchmarks/cpu_rules.py).
CPU_ANCHOR_LEARNING_RATE, CPU_ANCHOR_BATCH = 0.002, 1024
CPU_MAX_LEARNING_RATE = 0.004   # the best rate measured at -b 4096 and 16384: larger batches keep it (not measured)

# With none of CPU_MODEL_FLAGS on the command line, a CPU run trains the published NeuMF's model and optimizer (He et
# al.'s code, which the NCF, DeepCF and ConvNCF papers ran) instead of NVIDIA's, which are tuned for a 1M batch on
# GPUs (64 factors, MLP 256-256-128-64, dropout 0.5, Adam (0.25, 0.5)). Against NVIDIA's model at the measured rate,
# on six datasets of 0.25-6.3 % density: the same or a higher test HR@10 on the three where any model beat
# popularity (ML-1M a tie, reached in fewer epochs; ML-100K +0.007; a 1.4 % set +0.025; means of two seeds),
# popularity's level like every candidate on the three where none did, at 1/5 of the floats per row (RESULTS.md,
# "CPU defaults"; benchmarks/cpu_rules.py's paper-f* candidates).
CPU_MODEL = {"factors": 16, "layers": (64, 32, 16, 8), "dropout": 0.0, "beta1": 0.9, "beta2": 0.999}
CPU_MODEL_BATCH, CPU_MODEL_LEARNING_RATE = 256, 0.001   # the paper code's -b and -l
# Above this many steps per epoch the batch doubles (and -l grows by sqrt(2), up to CPU_MAX_LEARNING_RATE): -b 256
# on ML-20m would be 390k steps per epoch. ML-1M (2.4M rows, 9.5k steps) stays at 256.
CPU_MODEL_MAX_STEPS_PER_EPOCH = 20_000
CPU_MODEL_FLAGS = frozenset({"batch_size", "learning_rate", *CPU_MODEL})
_FLAG_NAMES = {"batch_size": "-b", "learning_rate": "-l", "factors": "-f", "layers": "--layers", "dropout": "--dropout",
               "beta1": "-b1", "beta2": "-b2"}


def choose_cpu_model(train_rows: int, grads_accumulated: int = 1) -> Tuple[dict, str]:
    """``({dest: value}, reason)``: the published NeuMF's settings (``CPU_MODEL``, -b 256, -l 0.001), the batch
    doubled while an epoch would take more than ``CPU_MODEL_MAX_STEPS_PER_EPOCH`` optimizer steps (-l x sqrt(2) each
    time, up to ``CPU_MAX_LEARNING_RATE``), and never more than the training rows.

    >>> choose_cpu_model(99057 * 5)[0]["batch_size"], choose_cpu_model(19_861_770 * 5)[0]["batch_size"]
    (256, 8192)
    """
    batch = CPU_MODEL_BATCH
    while train_rows / (batch * grads_accumulated) > CPU_MODEL_MAX_STEPS_PER_EPOCH and batch < NVIDIA_BATCH_SIZE:
        batch *= 2
    why = f"at most {CPU_MODEL_MAX_STEPS_PER_EPOCH} steps over {train_rows} training rows per epoch"
    if train_rows < batch * grads_accumulated:
        batch, why = max(train_rows // grads_accumulated, 1), f"the whole training set of {train_rows} rows"
    scaled = CPU_MODEL_LEARNING_RATE * math.sqrt(max(batch, CPU_MODEL_BATCH) / CPU_MODEL_BATCH)
    lr = float(f"{min(scaled, CPU_MAX_LEARNING_RATE):.3g}")
    values = dict(CPU_MODEL, batch_size=batch, learning_rate=lr)
    model = " ".join(f"{_FLAG_NAMES[k]} {' '.join(map(str, v)) if isinstance(v, tuple) else f'{v:g}'}"
                     for k, v in CPU_MODEL.items())
    reason = (f"the published NeuMF's settings: {model}, -b {batch} ({why}) and -l {lr:g}"
              + ("" if batch <= CPU_MODEL_BATCH else f" ({CPU_MODEL_LEARNING_RATE:g} x sqrt({batch}/{CPU_MODEL_BATCH})"
                 f"{', capped' if scaled > CPU_MAX_LEARNING_RATE else ''})"))
    return values, reason


def choose_cpu_batch(train_rows: int, factors: int, layers: Sequence[int], memory_bytes: int,
                     grads_accumulated: int = 1, given_learning_rate: Optional[float] = None):
    """(batch_size, learning_rate, reason): a CPU default for -b / -l in place of NVIDIA's GPU values.

    :func:`recsys_common.cpu_defaults.choose_cpu_batch` with NVIDIA's -b 2**20 bounding the batch, this model's
    activations per row (``BYTES_PER_ROW_PER_WIDTH`` x its widths) and the square-root rule (Adam) from the measured
    CPU anchor (``CPU_ANCHOR_LEARNING_RATE`` at ``CPU_ANCHOR_BATCH``). -b is global: ranks on one machine split its
    rows, so their activations add up to the same. An optimizer step sees ``-b x --grads_accumulated`` rows, which is
    what the step count and the rate use.

    >>> choose_cpu_batch(99057 * 5, 64, [256, 256, 128, 64], 16 * 2 ** 30)[:2]   # ML-100K's training rows
    (4096, 0.004)
    """
    width = 2 * factors + layers[0] + sum(layers)
    c = cpu_defaults.choose_cpu_batch(train_rows, gpu_batch=NVIDIA_BATCH_SIZE, gpu_learning_rate=NVIDIA_LEARNING_RATE,
                                      bytes_per_row=BYTES_PER_ROW_PER_WIDTH * width, memory_bytes=memory_bytes,
                                      lr_scaling="sqrt", batch_flag="-b", lr_flag="-l",
                                      given_learning_rate=given_learning_rate, steps_per_batch=grads_accumulated,
                                      cpu_anchor=(CPU_ANCHOR_LEARNING_RATE, CPU_ANCHOR_BATCH, "measured on CPUs:"),
                                      max_learning_rate=CPU_MAX_LEARNING_RATE)
    return c.batch, c.learning_rate, c.reason


def cpu_default_values(args: argparse.Namespace, given: Optional[FrozenSet[str]], device: torch.device,
                       train_rows: int, memory_bytes: Optional[int] = None) -> Tuple[dict, Optional[str]]:
    """On CPU, the settings in place of NVIDIA's GPU values: ``({dest: value}, line)``.

    * none of ``CPU_MODEL_FLAGS`` given (-b -l -f --layers --dropout -b1 -b2): :func:`choose_cpu_model`, the
      published NeuMF (also in ``--mode test``, so that the model matches the checkpoint a CPU run wrote);
    * one of them given, but not -b (training only): NVIDIA's model at :func:`choose_cpu_batch`'s -b and -l (-l given
      alone is kept);
    * -b given: nothing (NVIDIA's -l unless -l is given too).

    ``given`` is None for flags built in code (nothing typed: nothing chosen). Returns ``({}, None)`` when nothing is
    chosen; writes nothing.
    """
    if device.type != "cpu" or given is None:
        return {}, None
    if not given & CPU_MODEL_FLAGS:
        values, reason = choose_cpu_model(train_rows, args.grads_accumulated)
        return values, (f"ncf.py: CPU defaults: {reason}; none of -b -l -f --layers --dropout -b1 -b2 was given. "
                        "Pass any of them for NVIDIA's model.")
    if "batch_size" in given or args.mode != "train":
        return {}, None
    given_lr = args.learning_rate if "learning_rate" in given else None
    batch, lr, reason = choose_cpu_batch(train_rows, args.factors, args.layers,
                                         memory_bytes or machine_memory_bytes(), args.grads_accumulated, given_lr)
    typed = ", ".join(_FLAG_NAMES[k] for k in sorted(given & CPU_MODEL_FLAGS))
    return ({"batch_size": batch, "learning_rate": lr},
            f"ncf.py: CPU defaults: NVIDIA's model ({typed} given) at {reason}. Pass -b (and -l) to choose.")


def selection_protocol(select_on: str, device: torch.device) -> str:
    """``--select_on auto``: "validation" on CPU (the protocol a user's own data needs: no test peeking), "test" on
    a GPU (NVIDIA's, whose published figures are best-of-test)."""
    if select_on != "auto":
        return select_on
    return "validation" if device.type == "cpu" else "test"


def settle(args: argparse.Namespace, given: Optional[FrozenSet[str]], device: torch.device, train_rows: int,
           seed: Optional[int] = None, memory_bytes: Optional[int] = None) -> NcfConfig:
    """The run's :class:`NcfConfig`: the flags, with the CPU defaults (:func:`cpu_default_values`) and ``seed`` (the
    resumed run's, when ``--seed`` was not given) in place."""
    chosen, line = cpu_default_values(args, given, device, train_rows, memory_bytes)
    values = dict(vars(args), layers=tuple(args.layers), select_on=selection_protocol(args.select_on, device))
    values.update(chosen)
    if seed is not None:
        values["seed"] = seed
    return NcfConfig(**values, given_flags=frozenset(given or ()), cpu_defaults=line)
