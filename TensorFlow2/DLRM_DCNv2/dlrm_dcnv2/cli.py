"""The command line of ``dlrm.py`` / ``dcnv2.py`` / ``main.py``: flags -> one frozen :class:`DlrmDcnv2Config`.

``build_parser(model)`` holds every flag of NVIDIA's TF2 recipe (reference A.3) with the model's defaults, plus ours;
``parameter_table(model)`` is the README's flag table, generated from that parser so that the two never drift.

A run settles its configuration once, in two steps, because the CPU defaults need the machine::

    args, given_flags = read_flags(argv, model)      the flags as typed, checked (before TensorFlow starts)
    config, cpu_line = settle(args, given_flags, model, on_gpu=..., world_size=...)
        the feature spec parsed once (DataConfig), the embedding widths resolved against it, the CPU defaults
        chosen (dlrm_dcnv2.cpu_defaults, returned, never written into the flags), then the one frozen config

``parse(argv, model, on_gpu=..., world_size=...)`` does both for a caller that knows the machine. Nothing here
imports TensorFlow. Errors the user can fix raise :class:`UsageError` (a ``recsys_common.cli.InputError``) naming the
flag.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from dlrm_dcnv2.cpu_defaults import choose_cpu_defaults
from dlrm_dcnv2.data import DATASET_TYPES, DataConfig
from recsys_common.cli import InputError
from recsys_common.cpu_defaults import given_flags as command_line_flags

MODELS = ("dlrm", "dcnv2")

# Model-specific defaults (NVIDIA's dlrm.py / dcnv2.py, reference A.3). Everything else is shared.
MODEL_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "dlrm": {"optimizer": "sgd", "interaction": "dot_custom_cuda", "learning_rate": 24.0, "warmup_steps": 8000},
    "dcnv2": {"optimizer": "adam", "interaction": "cross", "learning_rate": 0.0001, "warmup_steps": 100},
}

INTERACTIONS = ("dot_custom_cuda", "dot_tensorflow", "cross")
DIST_STRATEGIES = ("memory_balanced", "basic", "memory_optimized")


class UsageError(InputError):
    """A flag or a combination of flags that cannot work; the message names the flag(s)."""


# ------------------------------------------------------------------------------------------------------- parser
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


def _boolean(text: str) -> bool:
    value = str(text).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _add_bool(parser: argparse.ArgumentParser, name: str, default: bool, help_text: str) -> None:
    """``--name``, ``--name=true|false`` and ``--noname``: the spellings absl's boolean flags accept (NVIDIA's CLI)."""
    parser.add_argument(f"--{name}", dest=name, nargs="?", const=True, default=default, type=_boolean,
                        metavar="BOOL", help=help_text)
    parser.add_argument(f"--no{name}", dest=name, action="store_false", help=argparse.SUPPRESS)


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def _optional_float(text: str) -> Optional[float]:
    if str(text).strip().lower() in ("", "none"):
        return None
    return float(text)


def build_parser(model: str = "dlrm") -> argparse.ArgumentParser:
    """The command line of ``dlrm.py`` (``model="dlrm"``) or ``dcnv2.py`` (``model="dcnv2"``).

    Flag names and defaults are NVIDIA's (reference A.3); ``--checkpoint_every_steps``, ``--checkpoint_every_minutes``,
    ``--keep_checkpoints``, ``--overwrite`` and the ``--inference_*`` flags are this recipe's additions.
    """
    if model not in MODELS:
        raise UsageError(f"model {model!r}: expected one of {', '.join(MODELS)}")
    d = MODEL_DEFAULTS[model]
    p = argparse.ArgumentParser(
        prog=f"{model}.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=f"Train, evaluate or benchmark {'DLRM' if model == 'dlrm' else 'DCNv2'} (TensorFlow 2, "
                    f"hybrid-parallel embeddings over Horovod).")

    g = p.add_argument_group("run")
    g.add_argument("--mode", choices=("train", "eval", "inference"), default="train",
                   help="train (with evaluations), eval (evaluate the test split once) or inference (latency and "
                        "throughput benchmark)")
    _add_bool(g, "run_eagerly", False, "run the steps eagerly, without tf.function (debugging)")
    _add_bool(g, "tfdata_debug", False, "NVIDIA's tf.data debug mode; refused here: no input pipeline of this recipe "
              "uses tf.data (the readers are plain Python/NumPy; debug them with --run_eagerly)")
    g.add_argument("--seed", type=int, default=None,
                   help="random seed of the weights, TensorFlow and the synthetic dataset (None: weights drawn at "
                        "random, synthetic data from seed 12345)")
    g.add_argument("--epochs", type=int, default=1, help="passes over the training split")
    g.add_argument("--max_steps", type=int, default=-1, help="stop after this many training steps (-1: no limit)")
    g.add_argument("--evals_per_epoch", type=int, default=1, help="evaluations of the test split per epoch")
    g.add_argument("--print_freq", type=int, default=100, help="training steps between progress lines")
    g.add_argument("--log_path", default="dlrm_tf_log.json",
                   help="DLLogger-style JSON log, rank 0 (an existing log is kept as <path>.N; empty: no log)")
    g.add_argument("--profiler_start_step", type=int, default=None,
                   help="start the TensorFlow profiler at this step (10 steps, trace next to --log_path)")
    g.add_argument("--profiled_rank", type=int, default=1, help="the rank that runs the profiler")
    g.add_argument("--reliability_plot", default=None, metavar="PATH",
                   help="extension: write a reliability diagram (PNG; predicted vs observed CTR per log-spaced "
                        "bucket, every rank's rows) of the final evaluation here")
    _add_bool(g, "overwrite", False,
              "replace the checkpoints of an earlier run under --save_checkpoint_path (refused otherwise; an "
              "existing --log_path is always kept as <path>.N)")

    g = p.add_argument_group("data")
    g.add_argument("--dataset_path", default=None, help="directory of the dataset (split binary, split TFRecords)")
    g.add_argument("--feature_spec", default="feature_spec.yaml",
                   help="feature spec file, relative to --dataset_path unless absolute")
    g.add_argument("--dataset_type", choices=DATASET_TYPES, default="tf_raw",
                   help="tf_raw (NVIDIA split binary), synthetic (generated on the fly) or split_tfrecords "
                        "(prebatched multi-hot TFRecords)")
    _add_bool(g, "data_parallel_input", False,
              "NVIDIA's fully data-parallel input; refused here: each rank always reads whole-batch ids of its own "
              "tables plus its slice of the rest (the placement's input)")
    _add_bool(g, "synthetic_dataset_use_feature_spec", False,
              "take the synthetic dataset's shape from --feature_spec instead of the --synthetic_dataset_* flags")
    g.add_argument("--synthetic_dataset_train_batches", type=int, default=64008,
                   help="training batches of the synthetic dataset")
    g.add_argument("--synthetic_dataset_valid_batches", type=int, default=1350,
                   help="evaluation batches of the synthetic dataset")
    g.add_argument("--synthetic_dataset_cardinalities", type=_int_list, default=[1000] * 26,
                   help="comma-separated table sizes of the synthetic dataset (default 26 x 1000)")
    g.add_argument("--synthetic_dataset_hotness", type=_int_list, default=[20] * 26,
                   help="comma-separated ids per sample of each synthetic categorical feature (default 26 x 20)")
    g.add_argument("--synthetic_dataset_num_numerical_features", type=int, default=13,
                   help="numerical features of the synthetic dataset")

    g = p.add_argument_group("model")
    g.add_argument("--batch_size", type=int, default=65536,
                   help="global training batch size (all ranks); on a CPU, when not given, chosen from the data and "
                        "RAM with the learning rate and schedule (first line of output)")
    g.add_argument("--valid_batch_size", type=int, default=65536,
                   help="global evaluation batch size (all ranks); on a CPU, when not given, chosen from the RAM")
    g.add_argument("--top_mlp_dims", type=_int_list, default=[1024, 1024, 512, 256, 1],
                   help="comma-separated widths of the top MLP (the last must be 1)")
    g.add_argument("--bottom_mlp_dims", type=_int_list, default=[512, 256, 128],
                   help="comma-separated widths of the bottom MLP (DLRM: the last must equal the embedding dim)")
    g.add_argument("--embedding_dim", default="128",
                   help="embedding width: one integer, a comma-separated list (one per table) or a JSON file "
                        "holding such a list")
    g.add_argument("--interaction", choices=INTERACTIONS, default=d["interaction"],
                   help="dot_custom_cuda (NVIDIA's CUDA kernel when installed, else dot_tensorflow), "
                        "dot_tensorflow, or cross (DCNv2's low-rank cross network)")
    g.add_argument("--num_cross_layers", type=int, default=3, help="cross layers of --interaction cross")
    g.add_argument("--cross_layer_projection_dim", type=int, default=512,
                   help="low-rank projection width of each cross layer")
    _add_bool(g, "embedding_zeros_initializer", False, "initialise the tables with zeros (testing)")
    _add_bool(g, "embedding_trainable", True, "train the embedding tables")
    _add_bool(g, "concat_embedding", False,
              "NVIDIA's single-GPU concatenated-table optimisation; refused here: lookups are per table")

    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", choices=("sgd", "adam"), default=d["optimizer"],
                   help="sgd (momentum 0, dense and embeddings) or adam (Keras Adam for the MLPs, lazy Adam for "
                        "the embeddings)")
    g.add_argument("--learning_rate", type=float, default=d["learning_rate"], help="peak learning rate")
    g.add_argument("--beta1", type=float, default=0.9, help="Adam beta1")
    g.add_argument("--beta2", type=float, default=0.999, help="Adam beta2")
    g.add_argument("--warmup_steps", type=int, default=d["warmup_steps"],
                   help="linear warm-up steps of the learning rate (from 0)")
    g.add_argument("--decay_start_step", type=int, default=48000,
                   help="step at which the polynomial (power 2) decay starts")
    g.add_argument("--decay_steps", type=int, default=24000, help="steps of the decay to 0")

    g = p.add_argument_group("precision and performance")
    _add_bool(g, "amp", False,
              "mixed precision: mixed_float16 with a static loss scale on GPU, mixed_bfloat16 on CPU")
    g.add_argument("--loss_scale", type=float, default=65536.0, help="static loss scale of --amp on GPU")
    _add_bool(g, "xla", False, "compile the training and evaluation steps with XLA")
    _add_bool(g, "cpu", False, "run on the CPU even when a GPU is visible")
    g.add_argument("--inter_op_parallelism", type=int, default=None, help="TensorFlow inter-op threads")
    g.add_argument("--intra_op_parallelism", type=int, default=None, help="TensorFlow intra-op threads")
    g.add_argument("--auc_thresholds", type=int, default=8000,
                   help="thresholds of the approximate AUC (tf.keras.metrics.AUC); the exact AUC is reported too")

    g = p.add_argument_group("embedding placement (hybrid parallel)")
    _add_bool(g, "use_mde_embeddings", True,
              "use Merlin Distributed Embeddings when installed (NGC image), else this recipe's placement")
    g.add_argument("--dist_strategy", choices=DIST_STRATEGIES, default="memory_balanced",
                   help="how tables are spread over ranks")
    g.add_argument("--column_slice_threshold", type=_optional_float, default=5e9,
                   help="tables with more elements are split by columns over ranks")
    g.add_argument("--row_slice_threshold", type=_optional_float, default=1e10,
                   help="tables with more elements are split by rows over ranks")
    g.add_argument("--data_parallel_threshold", type=_optional_float, default=None,
                   help="tables with fewer elements are replicated (data parallel) on every rank")
    g.add_argument("--cpu_offloading_threshold_gb", type=_optional_float, default=75.0,
                   help="a rank's tables beyond this many GiB live in host memory")

    g = p.add_argument_group("checkpoints")
    g.add_argument("--save_checkpoint_path", default=None,
                   help="directory of checkpoints (step_<N>/, written atomically; at the end of training and "
                        "periodically with --checkpoint_every_*)")
    g.add_argument("--restore_checkpoint_path", default=None,
                   help="checkpoint to start from: one step_<N> directory, or a directory of them (the newest)")
    g.add_argument("--checkpoint_every_steps", type=int, default=None,
                   help="also save a checkpoint every N training steps")
    g.add_argument("--checkpoint_every_minutes", type=float, default=None,
                   help="also save a checkpoint when this many minutes passed since the last one")
    g.add_argument("--keep_checkpoints", type=int, default=2, help="newest checkpoints kept (0: all)")

    g = p.add_argument_group("inference benchmark (--mode inference)")
    g.add_argument("--inference_batch_sizes", type=_int_list, default=None,
                   help="comma-separated global batch sizes to benchmark (default: --valid_batch_size)")
    g.add_argument("--inference_steps", type=int, default=100, help="timed steps per batch size")
    g.add_argument("--inference_warmup_steps", type=int, default=10,
                   help="untimed steps first (tracing, XLA compilation, caches), as NVIDIA drops the first 10")
    return p


def parameter_table(model: str = "dlrm") -> str:
    """Markdown table of every flag of ``model``'s parser: flag, default, description (for the README)."""
    rows = ["| flag | default | description |", "|---|---|---|"]
    for action in build_parser(model)._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.dest == "help":
            continue
        default = action.default
        if isinstance(default, list):
            default = ",".join(str(v) for v in default) if len(set(default)) > 1 or len(default) < 3 \
                else f"{len(default)}x{default[0]}"
        if action.choices:
            help_text = f"{{{','.join(action.choices)}}} {action.help}"
        else:
            help_text = action.help
        help_text = help_text.replace("|", "/").replace("<", "&lt;").replace(">", "&gt;")  # markdown-safe
        rows.append(f"| `{action.option_strings[0]}` | {default} | {help_text} |")
    return "\n".join(rows) + "\n"


def parse_embedding_dims(value: str, num_tables: int) -> List[int]:
    """``--embedding_dim``: one int, a comma list (one per table) or a JSON file with a list -> one dim per table."""
    text = str(value).strip()
    source = f"--embedding_dim {text}"
    if not text.replace(",", "").replace(" ", "").isdigit():
        if not os.path.isfile(text):
            raise UsageError(f"--embedding_dim {value!r}: expected an integer, a comma-separated list of integers "
                             f"or a JSON file (no such file)")
        try:
            with open(text) as f:
                loaded = json.load(f)
        except (OSError, ValueError) as error:
            raise UsageError(f"--embedding_dim {text}: not a JSON list of integers ({error})") from None
        dims = [loaded] if isinstance(loaded, int) else loaded
        if not isinstance(dims, list) or not all(isinstance(v, int) for v in dims):
            raise UsageError(f"{source}: expected a JSON integer or list of integers")
    else:
        dims = [int(v) for v in text.split(",") if v.strip()]
    if len(dims) == 1:
        dims = dims * num_tables
    if len(dims) != num_tables:
        raise UsageError(f"{source}: {len(dims)} dims for {num_tables} categorical features")
    if any(v < 1 for v in dims):
        raise UsageError(f"{source}: every dim must be at least 1, got {dims}")
    return dims




# ------------------------------------------------------------------------------------------------- reading flags
POSITIVE_FLAGS = ("batch_size", "valid_batch_size", "epochs", "evals_per_epoch", "print_freq", "auc_thresholds",
                  "inference_steps")
# NVIDIA's flags this recipe has no use for: a run that asked for them must not silently run without them.
REFUSED_FLAGS = {"tfdata_debug": "no input pipeline of this recipe uses tf.data (use --run_eagerly to debug)",
                 "data_parallel_input": "each rank reads whole-batch ids of its own tables and its slice of the rest",
                 "concat_embedding": "lookups are per table (a concatenated table would not change the results)"}


def read_flags(argv: Optional[Sequence[str]], model: str) -> Tuple[argparse.Namespace, FrozenSet[str]]:
    """``(the flags, given_flags)``: ``argv`` parsed with ``build_parser(model)`` and checked (:func:`check_flags`;
    raises ``UsageError``), and the destinations the command line set itself (the CPU defaults keep those)."""
    parser = build_parser(model)
    args = parser.parse_args(list(argv) if argv is not None else None)
    check_flags(args)
    return args, frozenset(command_line_flags(parser, argv))


def split_model(argv: Sequence[str]) -> Tuple[Optional[str], List[str]]:
    """``(model, remaining argv)`` from ``--model X`` / ``--model=X`` (NVIDIA's ``main.py``); model None when absent."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return None, argv


def parse_args(argv: Optional[Sequence[str]], model: str) -> argparse.Namespace:
    """The flags of :func:`read_flags` alone."""
    return read_flags(argv, model)[0]


def check_flags(args: argparse.Namespace) -> None:
    """What one flag alone cannot check (raises ``UsageError`` naming the flags)."""
    for name in POSITIVE_FLAGS:
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.max_steps == 0 or args.max_steps < -1:
        raise UsageError(f"--max_steps must be -1 (no limit) or at least 1, got {args.max_steps}")
    if args.inference_warmup_steps < 0:
        raise UsageError(f"--inference_warmup_steps must be 0 or more, got {args.inference_warmup_steps}")
    if args.top_mlp_dims[-1] != 1:
        raise UsageError(f"--top_mlp_dims {','.join(map(str, args.top_mlp_dims))}: the last layer must have width 1 "
                         f"(the click logit)")
    if not (args.learning_rate > 0 and math.isfinite(args.learning_rate)):
        raise UsageError(f"--learning_rate must be a positive number, got {args.learning_rate}")
    if args.amp and not args.loss_scale > 0:
        raise UsageError(f"--loss_scale must be positive, got {args.loss_scale}")
    if args.dataset_type != "synthetic" and not args.dataset_path:
        raise UsageError(f"--dataset_type {args.dataset_type} needs --dataset_path (or use --dataset_type synthetic)")
    if args.dataset_type == "synthetic" and not args.synthetic_dataset_use_feature_spec and \
            len(args.synthetic_dataset_hotness) not in (1, len(args.synthetic_dataset_cardinalities)):
        raise UsageError(f"--synthetic_dataset_hotness has {len(args.synthetic_dataset_hotness)} values for "
                         f"{len(args.synthetic_dataset_cardinalities)} --synthetic_dataset_cardinalities")
    if args.mode == "train" and (args.checkpoint_every_steps or args.checkpoint_every_minutes) \
            and not args.save_checkpoint_path:
        raise UsageError("--checkpoint_every_steps/--checkpoint_every_minutes need --save_checkpoint_path")
    for flag, reason in REFUSED_FLAGS.items():
        if getattr(args, flag):
            raise UsageError(f"--{flag} is NVIDIA's and not implemented by this recipe: {reason}; drop the flag")
    if args.use_mde_embeddings and (args.save_checkpoint_path or args.restore_checkpoint_path):
        # TensorFlow, imported late on purpose: only where this question is asked (sparse_model is TensorFlow code).
        from dlrm_dcnv2.model import sparse_model
        if sparse_model.mde_available():  # refused before any training, not at the first save after it
            raise UsageError("--use_mde_embeddings with --save_checkpoint_path/--restore_checkpoint_path: this "
                             "recipe's checkpoints hold its own placement's table shards, and Merlin Distributed "
                             "Embeddings (installed here, so used by default) keeps its tables in its own layers; "
                             "pass --nouse_mde_embeddings (this recipe's placement, same threshold flags) to save "
                             "or restore checkpoints")


def check_model_flags(args, embedding_dims: List[int]) -> None:
    """The model flags against the data's tables (raises ``UsageError``)."""
    if not embedding_dims:
        raise UsageError("the feature spec has no categorical feature: DLRM and DCNv2 interact embeddings and need at "
                         "least one embedding table (a numericals-only spec trains with TensorFlow2/WideAndDeep)")
    if args.interaction.startswith("dot") and len(set(embedding_dims)) > 1:
        raise UsageError(f"--interaction {args.interaction} needs one embedding width for every table, got "
                         f"--embedding_dim {args.embedding_dim} ({sorted(set(embedding_dims))}); use one value, or "
                         f"--interaction cross (dcnv2.py)")
    if args.interaction.startswith("dot") and args.bottom_mlp_dims[-1] != embedding_dims[0]:
        raise UsageError(f"--bottom_mlp_dims {','.join(map(str, args.bottom_mlp_dims))} ends with "
                         f"{args.bottom_mlp_dims[-1]} but --embedding_dim is {embedding_dims[0]}: the dot "
                         f"interaction needs them equal")


# ---------------------------------------------------------------------------------------------- the one config
@dataclass(frozen=True)
class DlrmDcnv2Config:
    """One run's configuration, settled once (:func:`settle`): every flag (by its name; lists as tuples) as typed
    or as the CPU defaults chose it, then what was settled from the data. Nothing rewrites it afterwards."""
    # run
    mode: str
    run_eagerly: bool
    tfdata_debug: bool
    seed: Optional[int]
    epochs: int
    max_steps: int                      # -1: no limit
    evals_per_epoch: int
    print_freq: int
    log_path: str
    profiler_start_step: Optional[int]
    profiled_rank: int
    reliability_plot: Optional[str]
    overwrite: bool
    # data (read through ``data`` below)
    dataset_path: Optional[str]
    feature_spec: str
    dataset_type: str
    data_parallel_input: bool
    synthetic_dataset_use_feature_spec: bool
    synthetic_dataset_train_batches: int
    synthetic_dataset_valid_batches: int
    synthetic_dataset_cardinalities: Tuple[int, ...]
    synthetic_dataset_hotness: Tuple[int, ...]
    synthetic_dataset_num_numerical_features: int
    # model
    batch_size: int                     # global, all ranks
    valid_batch_size: int
    top_mlp_dims: Tuple[int, ...]
    bottom_mlp_dims: Tuple[int, ...]
    embedding_dim: str                  # the flag's text; the widths per table are ``embedding_dims``
    interaction: str
    num_cross_layers: int
    cross_layer_projection_dim: int
    embedding_zeros_initializer: bool
    embedding_trainable: bool
    concat_embedding: bool
    # optimizer
    optimizer: str
    learning_rate: float
    beta1: float
    beta2: float
    warmup_steps: int
    decay_start_step: int
    decay_steps: int
    # precision and performance
    amp: bool
    loss_scale: float
    xla: bool
    cpu: bool
    inter_op_parallelism: Optional[int]
    intra_op_parallelism: Optional[int]
    auc_thresholds: int
    # embedding placement
    use_mde_embeddings: bool
    dist_strategy: str
    column_slice_threshold: Optional[float]
    row_slice_threshold: Optional[float]
    data_parallel_threshold: Optional[float]
    cpu_offloading_threshold_gb: Optional[float]
    # checkpoints
    save_checkpoint_path: Optional[str]
    restore_checkpoint_path: Optional[str]
    checkpoint_every_steps: Optional[int]
    checkpoint_every_minutes: Optional[float]
    keep_checkpoints: int
    # inference benchmark
    inference_batch_sizes: Optional[Tuple[int, ...]]
    inference_steps: int
    inference_warmup_steps: int
    # settled from the model name, the command line and the data
    model: str                          # "dlrm" or "dcnv2"
    given_flags: FrozenSet[str]         # the flags the command line set (the CPU defaults kept them)
    data: DataConfig                    # where the rows come from, the feature spec parsed once
    table_sizes: Tuple[int, ...]
    hotness: Tuple[int, ...]
    num_numerical: int
    embedding_dims: Tuple[int, ...]     # one per table

    def flags(self) -> Dict[str, Any]:
        """Every flag's value by its name (what the log's parameters record, with ``model`` and ``given_flags``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in SETTLED_FIELDS}

    @property
    def profile_dir(self) -> str:
        """Where ``--profiler_start_step`` writes its trace: ``profile/`` next to ``--log_path``."""
        return os.path.join(os.path.dirname(self.log_path or "") or ".", "profile")

    @property
    def inference_sizes(self) -> Tuple[int, ...]:
        """The global batch sizes ``--mode inference`` measures (default: ``--valid_batch_size``)."""
        return tuple(self.inference_batch_sizes or (self.valid_batch_size,))

    def model_config(self) -> Dict[str, Any]:
        """What must match between a checkpoint and the model restoring it (its ``state.json``'s ``config``)."""
        cross = self.interaction == "cross"
        return {"model": self.model, "table_sizes": list(self.table_sizes),
                "embedding_dims": list(self.embedding_dims), "hotness": list(self.hotness),
                "num_numerical_features": int(self.num_numerical),
                "interaction": "dot" if self.interaction.startswith("dot") else self.interaction,
                "bottom_mlp_dims": list(self.bottom_mlp_dims), "top_mlp_dims": list(self.top_mlp_dims),
                "num_cross_layers": self.num_cross_layers if cross else None,
                "cross_layer_projection_dim": self.cross_layer_projection_dim if cross else None}

    def resume_settings(self, world_size: int) -> Dict[str, Any]:
        """The settings a resumed run may change, with a warning (checkpointing.TRAINING_FIELDS)."""
        return {"batch_size": self.batch_size, "learning_rate": self.learning_rate,
                "warmup_steps": self.warmup_steps, "decay_start_step": self.decay_start_step,
                "decay_steps": self.decay_steps, "world_size": world_size}


SETTLED_FIELDS = ("model", "given_flags", "data", "table_sizes", "hotness", "num_numerical", "embedding_dims")


def settle(args: argparse.Namespace, given_flags: FrozenSet[str], model: str, *, on_gpu: bool, world_size: int,
           memory_bytes: Optional[int] = None) -> Tuple[DlrmDcnv2Config, Optional[str]]:
    """The run's one configuration and the CPU-defaults line to print (None: nothing chosen).

    Reads the feature spec once (:class:`DataConfig`), resolves ``--embedding_dim`` against its tables, checks the
    model flags against them, chooses the CPU defaults (``on_gpu`` False: no GPU visible, or ``--cpu``) for the
    flags not in ``given_flags``, then builds the frozen config from the flags overlaid with those choices."""
    data = DataConfig.from_flags(args)
    table_sizes, hotness, num_numerical = data.shape()
    embedding_dims = parse_embedding_dims(args.embedding_dim, len(table_sizes))
    check_model_flags(args, embedding_dims)
    chosen, line = choose_cpu_defaults(args, model, given_flags, data, on_gpu=on_gpu, world_size=world_size,
                                       embedding_dims=embedding_dims,
                                       gpu_learning_rate=MODEL_DEFAULTS[model]["learning_rate"],
                                       memory_bytes=memory_bytes)
    values = {name: tuple(value) if isinstance(value, list) else value
              for name, value in {**vars(args), **chosen}.items()}
    config = DlrmDcnv2Config(**values, model=model, given_flags=frozenset(given_flags), data=data,
                             table_sizes=tuple(table_sizes), hotness=tuple(hotness), num_numerical=num_numerical,
                             embedding_dims=tuple(embedding_dims))
    return config, line


def parse(argv: Optional[Sequence[str]], model: str = "dlrm", *, on_gpu: bool, world_size: int = 1,
          memory_bytes: Optional[int] = None) -> DlrmDcnv2Config:
    """:func:`read_flags` then :func:`settle`, for a caller that knows the machine (the training program reads the
    flags first and settles once TensorFlow and Horovod have told it ``on_gpu`` and ``world_size``)."""
    args, given = read_flags(argv, model)
    return settle(args, given, model, on_gpu=on_gpu, world_size=world_size, memory_bytes=memory_bytes)[0]
