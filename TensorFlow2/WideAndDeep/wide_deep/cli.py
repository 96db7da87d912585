"""``main.py``'s flags -> one frozen :class:`WideDeepConfig` per run, with the CPU defaults chosen before it is built.

NVIDIA's Wide & Deep flags and defaults (reference A.2), plus a few extensions. ``build_parser()`` returns the
parser; ``parameter_table()`` renders its flags as the README's markdown table (a test checks the README against it).

How a run's configuration is settled (``wide_deep.train.main``): :func:`parse_flags` reads the command line (the
values and ``given_flags``, the destinations the user typed); the launcher, the device and the feature spec are
found; :func:`build_config` chooses the CPU defaults (below) and builds the one frozen config; :func:`parse` does
both for callers that know the device and world size.

CPU defaults (issue 18): NVIDIA's GPU batch and learning rates replaced on a CPU. NVIDIA's ``--global_batch_size
131072 --eval_batch_size 131072`` refused a 105k-row CPU run before its first step (the trainer drops the last
partial batch, so the training set held no batch). On a CPU (``--cpu`` or no GPU visible), when the command line
does not set ``--global_batch_size``, :func:`choose_cpu_defaults` picks the batch with the repository's one rule
(``recsys_common.cpu_defaults.choose_batch_defaults``) and scales both learning rates with it by the square root
(FTRL for the wide part and RMSprop for the deep part are adaptive optimizers, like Adam). The deep warmup is in
epochs, so it needs no rescaling. ``--eval_batch_size``, when not given, is bounded by memory only. Flags given on
the command line are kept; a GPU keeps NVIDIA's values.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict, FrozenSet, Optional, Sequence, Tuple

from recsys_common import cpu_defaults
from recsys_common.cli import InputError
from recsys_common.datasets import count_rows

from .model.config import DEFAULT_EMBEDDING_SIZES, wide_deep_config

NVIDIA_BATCH_SIZE = 131072
NVIDIA_LINEAR_LR, NVIDIA_DEEP_LR = 0.02, 0.00012
# Peak bytes per row of the batch and per float of model width (embeddings + numericals + hidden units), taken from
# TF2 DLRM_DCNv2's measurement (196 KB per row at width 7041, same TensorFlow and Keras): 27.8 B. Checked here on the
# 105k-row run of the README (its peak at the chosen batch is below the estimate).
BYTES_PER_ROW_PER_WIDTH = 196e3 / 7041
# The deep learning rate is the one scaled with the batch; the wide one follows it (choose_cpu_defaults).
RECIPE = cpu_defaults.RecipeBatch(NVIDIA_BATCH_SIZE, NVIDIA_DEEP_LR, "sqrt", "global_batch_size",
                                  "deep_learning_rate", "eval_batch_size")
POSITIVE_FLAGS = ("global_batch_size", "eval_batch_size", "num_epochs", "benchmark_steps")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``main.py`` (seed flags with the seed's defaults; extensions are marked so in their help)."""
    p = argparse.ArgumentParser(description="Tensorflow2 WideAndDeep Model",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    loc = p.add_argument_group("location of datasets")
    loc.add_argument("--dataset_path", type=str, default="/outbrain/data",
                     help="Dataset directory, the base for paths in feature spec")
    loc.add_argument("--fspec_file", type=str, default="feature_spec.yaml",
                     help="Path to the feature spec file, relative to dataset_path")
    loc.add_argument("--embedding_sizes_file", type=str, default=DEFAULT_EMBEDDING_SIZES,
                     help="Path to the file containing a dictionary of embedding sizes for categorical features "
                          "(relative paths: the current directory, then wide_deep/)")
    loc.add_argument("--use_checkpoint", action="store_true", default=False,
                     help="Use checkpoint stored in model_dir path")
    loc.add_argument("--model_dir", type=str, default="/outbrain/checkpoints",
                     help="Destination where the model checkpoint will be saved")
    loc.add_argument("--results_dir", type=str, default="/results", help="Directory to store training results")
    loc.add_argument("--log_filename", type=str, default="log.json",
                     help="Name of the file to store dlloger output")

    tr = p.add_argument_group("training parameters")
    tr.add_argument("--global_batch_size", type=int, default=131072,
                    help="Total size of training batch; on a CPU, when not given, chosen from the data and RAM with "
                         "both learning rates (first line of output)")
    tr.add_argument("--eval_batch_size", type=int, default=131072,
                    help="Total size of evaluation batch; on a CPU, when not given, chosen from the RAM")
    tr.add_argument("--num_epochs", type=int, default=20, help="Number of training epochs")
    tr.add_argument("--cpu", action="store_true", default=False, help="Run computations on the CPU")
    tr.add_argument("--amp", action="store_true", default=False,
                    help="Enable automatic mixed precision conversion")
    tr.add_argument("--xla", action="store_true", default=False, help="Enable XLA conversion")
    tr.add_argument("--linear_learning_rate", type=float, default=0.02, help="Learning rate for linear model")
    tr.add_argument("--deep_learning_rate", type=float, default=0.00012, help="Learning rate for deep model")
    tr.add_argument("--deep_warmup_epochs", type=float, default=6,
                    help="Number of learning rate warmup epochs for deep model")

    mc = p.add_argument_group("model construction")
    mc.add_argument("--deep_hidden_units", type=int, default=[1024, 1024, 1024, 1024, 1024], nargs="+",
                    help="Hidden units per layer for deep model, separated by spaces")
    mc.add_argument("--deep_dropout", type=float, default=0.1, help="Dropout regularization for deep model")
    mc.add_argument("--combiner", type=str, default="sum", choices=["mean", "sum"],
                    help="Type of aggregation used for multi hot categorical features")

    rm = p.add_argument_group("run mode parameters")
    rm.add_argument("--num_auc_thresholds", type=int, default=8000,
                    help="Accepted for compatibility; the AUC here is exact (no thresholds)")
    rm.add_argument("--disable_map_calculation", action="store_true", default=False,
                    help="Do not compute MAP@12 during evaluation")
    rm.add_argument("--evaluate", action="store_true", default=False,
                    help="Only perform an evaluation on the validation dataset, don't train")
    rm.add_argument("--benchmark", action="store_true", default=False,
                    help="Run training or evaluation benchmark to collect performance metrics")
    rm.add_argument("--benchmark_warmup_steps", type=int, default=500,
                    help="Number of warmup steps before the start of the benchmark")
    rm.add_argument("--benchmark_steps", type=int, default=1000, help="Number of steps for performance benchmark")
    rm.add_argument("--affinity", type=str, default="unique_interleaved",
                    choices=["all", "single", "single_unique", "unique_interleaved", "unique_contiguous",
                             "disabled"],
                    help="Type of CPU affinity: the ranks of a node split the cores this process may use "
                         "(see README: NVIDIA's splits the cores of the GPU's socket)")

    ext = p.add_argument_group("extensions (not in NVIDIA's recipe)")
    ext.add_argument("--seed", type=int, default=0, help="Seed of weight initialisation, dropout and shuffling")
    ext.add_argument("--no_shuffle", action="store_true", default=False,
                     help="Read training batches in file order (reproducible runs, tests)")
    ext.add_argument("--checkpoint_every_steps", type=int, default=0,
                     help="Also save a checkpoint every N training steps (0: after each epoch only)")
    ext.add_argument("--print_freq", type=int, default=100, help="Log training loss every N steps")
    ext.add_argument("--reliability_plot", type=str, default=None, metavar="PATH",
                     help="Write a reliability diagram (PNG: predicted vs observed CTR per log-spaced bucket) of "
                          "the final evaluation here")
    return p


def parameter_table() -> str:
    """Markdown table ``| group | flag | default | description |`` of every flag of :func:`build_parser`."""
    parser = build_parser()
    lines = ["| group | flag | default | description |", "|---|---|---|---|"]
    for group in parser._action_groups:  # argparse has no public API for groups
        for action in group._group_actions:
            if not action.option_strings or action.dest == "help":
                continue
            default = action.default
            if isinstance(default, list):
                default = " ".join(str(v) for v in default)
            choices = f" {{{','.join(action.choices)}}}" if action.choices else ""
            lines.append(f"| {group.title} | `{action.option_strings[0]}`{choices} | `{default}` | {action.help} |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class WideDeepConfig:
    """One run's settings: every flag of :func:`build_parser` (the user's values, NVIDIA's defaults, or on a CPU the
    defaults :func:`choose_cpu_defaults` chose), and ``given_flags``, the flags the command line set itself."""
    dataset_path: str
    fspec_file: str
    embedding_sizes_file: str
    use_checkpoint: bool
    model_dir: str
    results_dir: str
    log_filename: str
    global_batch_size: int
    eval_batch_size: int
    num_epochs: int
    cpu: bool
    amp: bool
    xla: bool
    linear_learning_rate: float
    deep_learning_rate: float
    deep_warmup_epochs: float
    deep_hidden_units: Tuple[int, ...]
    deep_dropout: float
    combiner: str
    num_auc_thresholds: int
    disable_map_calculation: bool
    evaluate: bool
    benchmark: bool
    benchmark_warmup_steps: int
    benchmark_steps: int
    affinity: str
    seed: int
    no_shuffle: bool
    checkpoint_every_steps: int
    print_freq: int
    reliability_plot: Optional[str]
    given_flags: Tuple[str, ...]


def parse_flags(argv: Optional[Sequence[str]] = None) -> Tuple[argparse.Namespace, FrozenSet[str]]:
    """The command line's values (argparse's namespace, read only) and ``given_flags``: the destinations it set
    itself (``recsys_common.cpu_defaults.given_flags``; the CPU defaults never replace them). Raises
    :class:`InputError` for a count that must be positive."""
    parser = build_parser()
    flags = parser.parse_args(argv)
    for flag in POSITIVE_FLAGS:
        if getattr(flags, flag) < 1:
            raise InputError(f"--{flag} must be at least 1, got {getattr(flags, flag)}")
    return flags, frozenset(cpu_defaults.given_flags(parser, argv))


def model_width(spec, embedding_sizes_file: str, hidden_units) -> int:
    """Floats per row that a step's activations scale with: deep embeddings, numericals and hidden layers."""
    return wide_deep_config(spec, embedding_sizes_file, hidden_units, 0.0, "sum").width


def choose_cpu_defaults(flags: argparse.Namespace, given: FrozenSet[str], *, on_cpu: bool, world_size: int, spec,
                        memory_bytes: Optional[int] = None,
                        train_rows: Optional[int] = None) -> Tuple[Dict[str, Any], Optional[str]]:
    """On a CPU, the values of ``--global_batch_size`` / ``--eval_batch_size`` / both learning rates that the command
    line left to NVIDIA's defaults (see the module docstring), and the line to print; ``({}, None)`` on a GPU.
    ``train_rows``: the training rows (counted from the spec when needed and not given)."""
    if not on_cpu:
        return {}, None
    training = not flags.evaluate
    if train_rows is None and cpu_defaults.training_batch_wanted(given, RECIPE, training):
        train_rows = count_rows(spec, "train")
    chosen = cpu_defaults.choose_batch_defaults(
        given, RECIPE, world_size=world_size, training=training, train_rows=train_rows, memory_bytes=memory_bytes,
        given_learning_rate=flags.deep_learning_rate,
        bytes_per_row=BYTES_PER_ROW_PER_WIDTH * model_width(spec, flags.embedding_sizes_file, flags.deep_hidden_units))
    values, parts = dict(chosen.values), list(chosen.parts)
    if chosen.choice is not None and "linear_learning_rate" not in given:
        linear = cpu_defaults.scale_learning_rate(NVIDIA_LINEAR_LR, chosen.choice.batch, NVIDIA_BATCH_SIZE, "sqrt")
        values["linear_learning_rate"] = linear
        parts.insert(1, f"--linear_learning_rate {linear:g} (NVIDIA's {NVIDIA_LINEAR_LR} x "
                        f"sqrt({chosen.choice.batch}/{NVIDIA_BATCH_SIZE}))")
    return values, cpu_defaults.defaults_line("main.py", parts, "--global_batch_size")


def build_config(flags: argparse.Namespace, given: FrozenSet[str], *, on_cpu: bool, world_size: int, spec,
                 memory_bytes: Optional[int] = None,
                 train_rows: Optional[int] = None) -> Tuple[WideDeepConfig, Optional[str]]:
    """The run's one frozen config: the flags overlaid with the CPU defaults (:func:`choose_cpu_defaults`, chosen
    first); returns it with the line that says what the CPU defaults chose (None: nothing)."""
    values, line = choose_cpu_defaults(flags, given, on_cpu=on_cpu, world_size=world_size, spec=spec,
                                       memory_bytes=memory_bytes, train_rows=train_rows)
    settings = {**vars(flags), **values}
    settings["deep_hidden_units"] = tuple(settings["deep_hidden_units"])
    return WideDeepConfig(**settings, given_flags=tuple(sorted(given))), line


def parse(argv: Optional[Sequence[str]] = None, *, on_cpu: bool = False, world_size: int = 1,
          spec=None) -> WideDeepConfig:
    """:func:`parse_flags` then :func:`build_config`: ``argv`` as the config of a run on ``world_size`` ranks (on a
    CPU, with the CPU defaults; they need the feature ``spec``)."""
    flags, given = parse_flags(argv)
    return build_config(flags, given, on_cpu=on_cpu, world_size=world_size, spec=spec)[0]
