"""Command-line flags of ``main.py``: NVIDIA's Wide & Deep flags and defaults (reference A.2), plus a few extensions.

``build_parser()`` returns the parser; ``parameter_table()`` renders its flags as the README's markdown table (a test
checks the README against it). The parsed namespace stays in ``run.py``: library modules take explicit arguments.
"""
from __future__ import annotations

import argparse

DEFAULT_EMBEDDING_SIZES = "data/outbrain/embedding_sizes.json"


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
