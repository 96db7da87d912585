"""The one training / evaluation / inference program behind ``dlrm.py`` and ``dcnv2.py``.

``main(argv, model="dlrm"|"dcnv2") -> dict`` of results; ``build_parser(model)`` is the command line (every flag
of NVIDIA's TF2 recipe, reference A.3, with the model's defaults, plus ours); ``parameter_table(model)`` is the
README's flag table, generated from that parser so that the two never drift.

What one run does, top to bottom::

    ctx = hvd_utils.init()                         one process, or one rank of horovodrun
    precision policy (--amp), --cpu, seeds
    data = create_input(...)                       this rank's batches (numerical, categorical tuple, labels)
    model = build_model(...)                       sparse half (tables placed over ranks) + dense half
    optimizers = create_optimizers(...)            dense + embedding optimizer, one LR schedule
    --mode train:     Trainer.train_step per batch, progress every --print_freq steps, evaluation
                      --evals_per_epoch times, periodic checkpoints (--checkpoint_every_*)
    --mode eval:      one evaluation of the test split (BCE, approximate and exact AUC)
    --mode inference: throughput and mean/p90/p95/p99 latency per batch size
    hvd_utils.shutdown()                           always, in ``finally``

Errors the user can fix (a bad flag, bad data, a diverged run) raise exceptions that name the flag, file or step;
the command-line wrapper :func:`cli` prints them as one line and exits non-zero.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from recsys_common.horovod_launch import LauncherMismatchError
from recsys_common.logger import hms

LOG = logging.getLogger("dlrm_dcnv2")

MODELS = ("dlrm", "dcnv2")

# Model-specific defaults (NVIDIA's dlrm.py / dcnv2.py, reference A.3). Everything else is shared.
MODEL_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "dlrm": {"optimizer": "sgd", "interaction": "dot_custom_cuda", "learning_rate": 24.0, "warmup_steps": 8000},
    "dcnv2": {"optimizer": "adam", "interaction": "cross", "learning_rate": 0.0001, "warmup_steps": 100},
}

INTERACTIONS = ("dot_custom_cuda", "dot_tensorflow", "cross")
DATASET_TYPES = ("tf_raw", "synthetic", "split_tfrecords")
DIST_STRATEGIES = ("memory_balanced", "basic", "memory_optimized")
# The synthetic dataset's hidden model when --seed is not given: fixed, so train and test always share it.
SYNTHETIC_SEED = 12345


class UsageError(ValueError):
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


def parse_args(argv: Optional[Sequence[str]], model: str) -> argparse.Namespace:
    """Parse ``argv`` with ``build_parser(model)`` and check what one flag alone cannot (raises ``UsageError``)."""
    parser = build_parser(model)
    args = parser.parse_args(list(argv) if argv is not None else None)
    args.model = model
    from recsys_common.cpu_defaults import given_flags
    args.flags_given = sorted(given_flags(parser, argv))  # flags the CPU defaults must not replace
    positive = ("batch_size", "valid_batch_size", "epochs", "evals_per_epoch", "print_freq", "auc_thresholds",
                "inference_steps")
    for name in positive:
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
    if args.mode == "train" and (args.checkpoint_every_steps or args.checkpoint_every_minutes) \
            and not args.save_checkpoint_path:
        raise UsageError("--checkpoint_every_steps/--checkpoint_every_minutes need --save_checkpoint_path")
    # NVIDIA's flags this recipe has no use for: a run that asked for them must not silently run without them.
    refused = {"tfdata_debug": "no input pipeline of this recipe uses tf.data (use --run_eagerly to debug)",
               "data_parallel_input": "each rank reads whole-batch ids of its own tables and its slice of the rest",
               "concat_embedding": "lookups are per table (a concatenated table would not change the results)"}
    for flag, reason in refused.items():
        if getattr(args, flag):
            raise UsageError(f"--{flag} is NVIDIA's and not implemented by this recipe: {reason}; drop the flag")
    if args.use_mde_embeddings and (args.save_checkpoint_path or args.restore_checkpoint_path):
        from dlrm_dcnv2.nn.sparse_model import mde_available
        if mde_available():  # refused before any training, not at the first save after it
            raise UsageError("--use_mde_embeddings with --save_checkpoint_path/--restore_checkpoint_path: this "
                             "recipe's checkpoints hold its own placement's table shards, and Merlin Distributed "
                             "Embeddings (installed here, so used by default) keeps its tables in its own layers; "
                             "pass --nouse_mde_embeddings (this recipe's placement, same threshold flags) to save "
                             "or restore checkpoints")
    return args


# ------------------------------------------------------------------------------------------------------ dataset
@dataclass(frozen=True)
class DataConfig:
    """Where the rows come from (the dataset, or the synthetic one), read once from the flags (:meth:`from_flags`)."""
    dataset_type: str = "tf_raw"
    dataset_path: Optional[str] = None
    feature_spec: str = "feature_spec.yaml"
    synthetic_train_batches: int = 64008
    synthetic_valid_batches: int = 1350
    synthetic_cardinalities: Sequence[int] = (1000,) * 26
    synthetic_hotness: Sequence[int] = (20,) * 26
    synthetic_num_numerical: int = 13
    synthetic_use_feature_spec: bool = False
    seed: int = SYNTHETIC_SEED

    @classmethod
    def from_flags(cls, args) -> "DataConfig":
        return cls(args.dataset_type, args.dataset_path, args.feature_spec, args.synthetic_dataset_train_batches,
                   args.synthetic_dataset_valid_batches, tuple(args.synthetic_dataset_cardinalities),
                   tuple(args.synthetic_dataset_hotness), args.synthetic_dataset_num_numerical_features,
                   args.synthetic_dataset_use_feature_spec, SYNTHETIC_SEED if args.seed is None else args.seed)


def dataset_shape(data: DataConfig):
    """``(table_sizes, hotness, num_numerical_features)`` of the data (feature spec, or the synthetic flags)."""
    if data.dataset_type == "synthetic" and not data.synthetic_use_feature_spec:
        sizes = list(data.synthetic_cardinalities)
        hotness = list(data.synthetic_hotness)
        if len(hotness) == 1:
            hotness = hotness * len(sizes)
        if len(hotness) != len(sizes):
            raise UsageError(f"--synthetic_dataset_hotness has {len(hotness)} values for "
                             f"{len(sizes)} --synthetic_dataset_cardinalities")
        return sizes, hotness, int(data.synthetic_num_numerical)
    from dlrm_dcnv2.dataloading.dataloader import load_spec, metadata_from_spec
    meta = metadata_from_spec(load_spec(data.dataset_path, data.feature_spec, "--feature_spec"))
    return list(meta.table_sizes), list(meta.hotness), int(meta.num_numerical)


def dataset_negative_downsampling_rate(data: DataConfig) -> float:
    """The probability a train negative was kept (the spec's ``metadata.negative_downsampling_rate``, written by
    ``recsys_common.prepare_clicks``); 1.0 for the synthetic data without a spec."""
    if data.dataset_type == "synthetic" and not data.synthetic_use_feature_spec:
        return 1.0
    from dlrm_dcnv2.dataloading.dataloader import load_spec, metadata_from_spec
    return metadata_from_spec(load_spec(data.dataset_path, data.feature_spec, "--feature_spec")
                              ).negative_downsampling_rate


def open_data(data: DataConfig, ctx, sparse_model, mapping: str, global_batch_size: int):
    """This rank's batches of ``mapping`` ("train" / "test"): an iterable with ``len()`` (and ``iterate(start)``)."""
    from dlrm_dcnv2.dataloading import create_input
    return create_input(data.dataset_type, data.dataset_path, data.feature_spec, mapping=mapping,
                        global_batch_size=global_batch_size, ctx=ctx, placement=sparse_model.placement,
                        synthetic_train_batches=data.synthetic_train_batches,
                        synthetic_valid_batches=data.synthetic_valid_batches,
                        synthetic_cardinalities=list(data.synthetic_cardinalities),
                        synthetic_hotness=list(data.synthetic_hotness),
                        synthetic_num_numerical=data.synthetic_num_numerical,
                        synthetic_use_feature_spec=data.synthetic_use_feature_spec, seed=data.seed)


# ------------------------------------------------------------------------------------------------------ running
def _configure_tensorflow(cpu: bool, amp: bool, inter_op_parallelism: Optional[int] = None,
                          intra_op_parallelism: Optional[int] = None):
    """Device visibility (``cpu``: hide the GPUs), threads, precision policy (``amp``); returns ``(policy name,
    on_gpu)``. Must run before any model is built."""
    import tensorflow as tf
    if cpu:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError as error:  # devices already initialised (a second run in the same process)
            if tf.config.get_visible_devices("GPU"):
                raise UsageError(f"--cpu: cannot hide the GPUs any more ({error})") from None
    for name, value, setter in (
            ("inter_op_parallelism", inter_op_parallelism, tf.config.threading.set_inter_op_parallelism_threads),
            ("intra_op_parallelism", intra_op_parallelism, tf.config.threading.set_intra_op_parallelism_threads)):
        if value is not None:
            try:
                setter(value)
            except RuntimeError as error:
                LOG.warning("--%s %d ignored: %s", name, value, error)
    on_gpu = bool(tf.config.get_visible_devices("GPU"))
    policy = "float32"
    if amp:
        # float16 has too few exponent bits without loss scaling and CPUs have no fast float16 kernels;
        # bfloat16 keeps float32's range and is what CPUs with AVX512-BF16/AMX accelerate.
        policy = "mixed_float16" if on_gpu else "mixed_bfloat16"
    if policy == "mixed_bfloat16":
        from recsys_common.machine import cpu_bf16_instructions
        instructions = cpu_bf16_instructions()
        if instructions in ("amx", "avx512_bf16"):
            LOG.info("--amp: mixed_bfloat16 on this CPU's %s instructions", instructions)
        else:
            # With AVX512-BF16 or AMX oneDNN runs bf16 GEMMs natively (README: the issue 18 figures); without them
            # it converts around every product, which is usually slower than float32.
            LOG.warning("--amp: this CPU has no bfloat16 instructions (no avx512_bf16 or amx_bf16 in /proc/cpuinfo): "
                        "mixed_bfloat16 is emulated and likely slower than float32; drop --amp for speed")
    tf.keras.mixed_precision.set_global_policy(policy)
    return policy, on_gpu


@dataclass(frozen=True)
class ModelFlags:
    """The model's shape as the flags give it (:meth:`from_flags`); ``embedding_dim`` is the flag's text, for
    messages (the per-table widths are resolved against the data)."""
    model: str = "dlrm"
    embedding_dim: str = "128"
    bottom_mlp_dims: Sequence[int] = (512, 256, 128)
    top_mlp_dims: Sequence[int] = (1024, 1024, 512, 256, 1)
    interaction: str = "dot_custom_cuda"
    num_cross_layers: int = 3
    cross_layer_projection_dim: int = 512

    @classmethod
    def from_flags(cls, args) -> "ModelFlags":
        return cls(args.model, args.embedding_dim, tuple(args.bottom_mlp_dims), tuple(args.top_mlp_dims),
                   args.interaction, args.num_cross_layers, args.cross_layer_projection_dim)


def _check_model_flags(flags: ModelFlags, embedding_dims: List[int]) -> None:
    if not embedding_dims:
        raise UsageError("the feature spec has no categorical feature: DLRM and DCNv2 interact embeddings and need at "
                         "least one embedding table (a numericals-only spec trains with TensorFlow2/WideAndDeep)")
    if flags.interaction.startswith("dot") and len(set(embedding_dims)) > 1:
        raise UsageError(f"--interaction {flags.interaction} needs one embedding width for every table, got "
                         f"--embedding_dim {flags.embedding_dim} ({sorted(set(embedding_dims))}); use one value, or "
                         f"--interaction cross (dcnv2.py)")
    if flags.interaction.startswith("dot") and flags.bottom_mlp_dims[-1] != embedding_dims[0]:
        raise UsageError(f"--bottom_mlp_dims {','.join(map(str, flags.bottom_mlp_dims))} ends with "
                         f"{flags.bottom_mlp_dims[-1]} but --embedding_dim is {embedding_dims[0]}: the dot "
                         f"interaction needs them equal")


def model_config(flags: ModelFlags, table_sizes, embedding_dims, hotness, num_numerical) -> Dict[str, Any]:
    """What must match between a checkpoint and the model restoring it."""
    cross = flags.interaction == "cross"
    return {"model": flags.model, "table_sizes": list(table_sizes), "embedding_dims": list(embedding_dims),
            "hotness": list(hotness), "num_numerical_features": int(num_numerical),
            "interaction": "dot" if flags.interaction.startswith("dot") else flags.interaction,
            "bottom_mlp_dims": list(flags.bottom_mlp_dims), "top_mlp_dims": list(flags.top_mlp_dims),
            "num_cross_layers": flags.num_cross_layers if cross else None,
            "cross_layer_projection_dim": flags.cross_layer_projection_dim if cross else None}


def eval_points(steps_per_epoch: int, evals_per_epoch: int) -> List[int]:
    """Steps within an epoch (1-based, after the step) after which to evaluate: evenly spaced, the last at the end."""
    evals = min(evals_per_epoch, steps_per_epoch)
    return sorted({max(1, round(steps_per_epoch * k / evals)) for k in range(1, evals + 1)})


def run(args) -> Dict[str, Any]:
    """Everything after parsing (``args``: the namespace of :func:`parse_args`); returns the results."""
    import tensorflow as tf
    from recsys_common.logger import Logger
    from dlrm_dcnv2.distributed import hvd_utils
    from dlrm_dcnv2.nn.evaluator import Evaluator, click_metrics_text
    from dlrm_dcnv2.nn.model import build_model
    from dlrm_dcnv2.utils import checkpointing

    ctx = hvd_utils.init()
    policy, on_gpu = _configure_tensorflow(args.cpu, args.amp, args.inter_op_parallelism, args.intra_op_parallelism)
    if args.seed is not None:
        tf.keras.utils.set_random_seed(args.seed)  # the same on every rank (replicated weights are broadcast anyway)
    data = DataConfig.from_flags(args)
    table_sizes, hotness, num_numerical = dataset_shape(data)
    embedding_dims = parse_embedding_dims(args.embedding_dim, len(table_sizes))
    model_flags = ModelFlags.from_flags(args)
    _check_model_flags(model_flags, embedding_dims)
    from dlrm_dcnv2.cpu_defaults import apply_cpu_defaults  # issue 18: NVIDIA's GPU batch is not a CPU default
    cpu_line = apply_cpu_defaults(args, on_gpu, ctx.world_size, embedding_dims,
                                  MODEL_DEFAULTS[args.model]["learning_rate"])
    if cpu_line and ctx.is_chief:
        print(cpu_line, flush=True)
    # build_model picks the interaction (nn.interaction.select_interaction): it raises for --xla with NVIDIA's
    # custom CUDA op and logs when dot_custom_cuda falls back to dot_tensorflow.

    # The Logger keeps an existing log as <path>.N (never overwritten).
    logger = Logger(args.log_path if args.log_path else None, rank=ctx.rank, stdout=False)
    try:
        params = {k: v for k, v in vars(args).items()}
        params.update(world_size=ctx.world_size, precision=policy, table_sizes=table_sizes, hotness=hotness)
        logger.log_parameters(params)
        for metric, unit in (("loss", None), ("auc", None), ("auc_exact", None), ("log_loss", None),
                             ("normalized_entropy", None), ("calibration", None), ("throughput", "samples/s"),
                             ("samples_per_s", "samples/s"), ("mean_step_time_ms", "ms")):
            logger.metadata(metric, {"unit": unit})  # DLLogger METADATA lines, as NVIDIA's log tools expect

        model = build_model(table_sizes=table_sizes, embedding_dims=embedding_dims,
                            bottom_mlp_dims=args.bottom_mlp_dims, top_mlp_dims=args.top_mlp_dims,
                            interaction=args.interaction, num_numerical_features=num_numerical, hotness=hotness,
                            num_cross_layers=args.num_cross_layers,
                            cross_layer_projection_dim=args.cross_layer_projection_dim, ctx=ctx, seed=args.seed,
                            xla=args.xla, dist_strategy=args.dist_strategy,
                            column_slice_threshold=args.column_slice_threshold,
                            row_slice_threshold=args.row_slice_threshold,
                            data_parallel_threshold=args.data_parallel_threshold,
                            cpu_offloading_threshold_gb=args.cpu_offloading_threshold_gb,
                            use_mde_embeddings=args.use_mde_embeddings,
                            embedding_zeros_initializer=args.embedding_zeros_initializer,
                            embedding_trainable=args.embedding_trainable)
        config = model_config(model_flags, table_sizes, embedding_dims, hotness, num_numerical)
        train_config = TrainConfig.from_flags(args, policy)
        training = train_config.resume_settings(ctx.world_size)
        evaluator = Evaluator(model, ctx, auc_thresholds=args.auc_thresholds, xla=args.xla,
                              run_eagerly=args.run_eagerly,
                              negative_downsampling_rate=dataset_negative_downsampling_rate(data))

        if args.mode in ("eval", "inference"):
            if args.restore_checkpoint_path:
                checkpointing.restore_checkpoint(args.restore_checkpoint_path, model, None, ctx, config=config,
                                                 load_optimizer=False)
            else:
                LOG.warning("--mode %s without --restore_checkpoint_path: the model is untrained", args.mode)
            if args.mode == "eval":
                test_data = open_data(data, ctx, model.sparse, "test", args.valid_batch_size)
                stats: Dict[str, Any] = {}
                results = evaluator.evaluate(test_data, stats)
                if ctx.is_chief:
                    print(f"eval: auc {results['auc']:.5f} | exact auc {results['auc_exact']:.5f} | loss "
                          f"{results['loss']:.5f}{click_metrics_text(results)} | {results['samples']} samples | "
                          f"{results['throughput']:,.0f} samples/s", flush=True)
                write_reliability_plot(args.reliability_plot, stats, ctx, f"{args.model} --mode eval")
            else:
                from dlrm_dcnv2.nn.inference import benchmark_inference
                sizes = args.inference_batch_sizes or [args.valid_batch_size]
                results = {"inference": benchmark_inference(
                    model, lambda size: open_data(data, ctx, model.sparse, "test", size), sizes, ctx,
                    steps=args.inference_steps, warmup_steps=args.inference_warmup_steps, xla=args.xla,
                    run_eagerly=args.run_eagerly)}
                if ctx.is_chief:
                    for size, r in results["inference"].items():
                        print(f"inference batch {size}: {r['throughput']:.0f} samples/s, latency mean "
                              f"{r['latency_mean_ms']:.3f} ms, p90 {r['latency_p90_ms']:.3f}, p95 "
                              f"{r['latency_p95_ms']:.3f}, p99 {r['latency_p99_ms']:.3f}", flush=True)
            results["mode"] = args.mode
            if args.mode == "eval":
                _log_reliability(logger, stats)
            logger.log_summary({k: v for k, v in results.items() if k != "inference"} if args.mode == "eval"
                               else _flatten_inference(results["inference"]))
            return results

        return _train(train_config, ctx, model, evaluator, config, training, logger, policy,
                      lambda mapping, batch: open_data(data, ctx, model.sparse, mapping, batch))
    finally:
        logger.close()


def _flatten_inference(per_size: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    return {f"{k}_bs{size}": v for size, r in per_size.items() for k, v in r.items() if k != "latencies_ms"}


@dataclass(frozen=True)
class TrainConfig:
    """The training loop's settings, read once from the flags (:meth:`from_flags`); the loop sees nothing else."""
    model: str = "dlrm"
    epochs: int = 1
    max_steps: int = -1                  # <= 0: no limit
    batch_size: int = 65536              # global
    valid_batch_size: int = 65536
    learning_rate: float = 24.0
    warmup_steps: int = 8000
    decay_start_step: int = 48000
    decay_steps: int = 24000
    optimizer: str = "sgd"
    beta1: float = 0.9
    beta2: float = 0.999
    loss_scale: Optional[float] = None   # float16 only
    xla: bool = False
    run_eagerly: bool = False
    print_freq: int = 100
    evals_per_epoch: int = 1
    profiler_start_step: Optional[int] = None
    profiled_rank: int = 0
    profile_dir: str = "profile"
    save_checkpoint_path: Optional[str] = None
    restore_checkpoint_path: Optional[str] = None
    checkpoint_every_steps: Optional[int] = None
    checkpoint_every_minutes: Optional[float] = None
    keep_checkpoints: int = 2
    overwrite: bool = False
    reliability_plot: Optional[str] = None

    @classmethod
    def from_flags(cls, args, policy: str) -> "TrainConfig":
        return cls(model=args.model, epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size,
                   valid_batch_size=args.valid_batch_size, learning_rate=args.learning_rate,
                   warmup_steps=args.warmup_steps, decay_start_step=args.decay_start_step,
                   decay_steps=args.decay_steps, optimizer=args.optimizer, beta1=args.beta1, beta2=args.beta2,
                   loss_scale=args.loss_scale if policy == "mixed_float16" else None, xla=args.xla,
                   run_eagerly=args.run_eagerly, print_freq=args.print_freq, evals_per_epoch=args.evals_per_epoch,
                   profiler_start_step=args.profiler_start_step, profiled_rank=args.profiled_rank,
                   profile_dir=os.path.join(os.path.dirname(args.log_path or "") or ".", "profile"),
                   save_checkpoint_path=args.save_checkpoint_path,
                   restore_checkpoint_path=args.restore_checkpoint_path,
                   checkpoint_every_steps=args.checkpoint_every_steps,
                   checkpoint_every_minutes=args.checkpoint_every_minutes, keep_checkpoints=args.keep_checkpoints,
                   overwrite=args.overwrite, reliability_plot=args.reliability_plot)

    def resume_settings(self, world_size: int) -> Dict[str, Any]:
        """The settings a resumed run may change, with a warning (checkpointing.TRAINING_FIELDS)."""
        return {"batch_size": self.batch_size, "learning_rate": self.learning_rate,
                "warmup_steps": self.warmup_steps, "decay_start_step": self.decay_start_step,
                "decay_steps": self.decay_steps, "world_size": world_size}


def _log_reliability(logger, stats: Dict[str, Any]) -> None:
    """The last evaluation's summed click sums and buckets as a ``RELIABILITY`` record of their own (the run's one
    summary keeps its metrics): ``recsys_common.plot_log`` draws the reliability diagram from it."""
    if "reliability_sums" in stats:
        from recsys_common.plot_log import RELIABILITY_STEP, reliability_entry
        logger.log(RELIABILITY_STEP, reliability_entry(stats["ctr_sums"], stats["reliability_sums"]))


def write_reliability_plot(path: Optional[str], stats: Dict[str, Any], ctx, title: str) -> None:
    """``--reliability_plot``: the chief draws the evaluation's summed reliability buckets (``Evaluator.evaluate``'s
    ``stats``) with ``recsys_common.metrics.plot_reliability``; nothing when ``path`` is None."""
    if not path or not ctx.is_chief:
        return
    from recsys_common.metrics import plot_reliability
    plot_reliability(stats["reliability_sums"], path, title=title, sums=stats["ctr_sums"])
    print(f"reliability diagram: {path}", flush=True)


class _Profiler:
    """``--profiler_start_step``: a TensorFlow profile of 10 steps of one rank (``--profiled_rank``)."""

    def __init__(self, start_step: Optional[int], on_this_rank: bool, directory: str):
        self.start_step = start_step if on_this_rank else None
        self.directory, self.active = directory, False

    def step(self, global_step: int) -> None:
        if self.start_step is None:
            return
        import tensorflow as tf
        if global_step == self.start_step:
            tf.profiler.experimental.start(self.directory)
            self.active = True
        elif self.active and global_step == self.start_step + 10:
            self.stop()

    def stop(self) -> None:
        if self.active:
            import tensorflow as tf
            tf.profiler.experimental.stop()
            self.active = False


class _Throughput:
    """Training time and samples: whole loop iterations (waiting for the batch + the step), not evaluations or
    checkpoint saves (:meth:`pause` after those); the run's first step (tracing / XLA compilation) is left out of
    the totals. The progress line's rate is over the print window (training time only, as the totals)."""

    def __init__(self, first_step: int, total_steps: int, batch_size: int):
        self.first_step, self.total_samples = first_step, total_steps * batch_size
        self.train_time, self.samples, self.steps = 0.0, 0, 0
        self.window_time, self.window_rows = 0.0, 0
        self.tick = time.perf_counter()

    def pause(self) -> None:
        self.tick = time.perf_counter()

    def step(self, global_step: int, rows: int) -> None:
        now = time.perf_counter()
        elapsed, self.tick = now - self.tick, now
        if global_step > self.first_step + 1:  # the first step traces/compiles
            self.train_time += elapsed
            self.samples += rows
            self.steps += 1
        self.window_time += elapsed
        self.window_rows += rows

    def window_figures(self, global_step: int, batch_size: int):
        """``(samples/s, seconds left)`` over the window since the last call; starts a new window."""
        rate = self.window_rows / max(self.window_time, 1e-9)
        left = (self.total_samples - global_step * batch_size) / max(rate, 1e-9)
        self.window_time, self.window_rows = 0.0, 0
        return rate, left

    def results(self) -> Dict[str, float]:
        return {"throughput": self.samples / self.train_time if self.train_time > 0 else float("nan"),
                "mean_step_time_ms": 1000.0 * self.train_time / self.steps if self.steps else float("nan")}


def _train(cfg: TrainConfig, ctx, model, evaluator, config, training, logger, policy,
           open_split) -> Dict[str, Any]:
    """The training loop of ``--mode train`` (see the module docstring); returns the results.

    ``open_split(mapping, global_batch)``: this rank's batches of a split. Each step: train step -> NaN check ->
    progress every ``print_freq`` -> evaluation at the epoch's evaluation points -> checkpoint when due.
    """
    import numpy as np
    from dlrm_dcnv2.distributed.gradients import broadcast_replicated_variables
    from dlrm_dcnv2.nn.evaluator import CLICK_METRICS, CORRECTED_CLICK_METRICS, click_metrics_text
    from dlrm_dcnv2.nn.lr_scheduler import WarmupPolyDecay
    from dlrm_dcnv2.nn.optimizers import create_optimizers
    from dlrm_dcnv2.nn.trainer import Trainer
    from dlrm_dcnv2.utils import checkpointing
    from recsys_common.logger import check_finite

    schedule = WarmupPolyDecay(cfg.learning_rate, cfg.warmup_steps, cfg.decay_start_step, cfg.decay_steps)
    dense_optimizer, embedding_optimizer = create_optimizers(cfg.optimizer, schedule, beta1=cfg.beta1,
                                                             beta2=cfg.beta2)
    optimizers = (dense_optimizer, embedding_optimizer)

    start_step, start_epoch, start_batch = 0, 0, 0
    if cfg.restore_checkpoint_path:
        state = checkpointing.restore_checkpoint(cfg.restore_checkpoint_path, model, optimizers, ctx,
                                                 config=config, training=training, load_optimizer=True)
        start_step = int(state.get("global_step", 0))
        start_epoch = int(state.get("epoch") or 0)
        start_batch = int(state.get("batch_in_epoch") or 0)
        if ctx.is_chief:
            print(f"resumed from {state['path']} at step {start_step} (epoch {start_epoch}, batch {start_batch})",
                  flush=True)
    else:
        # Replicated weights start equal on every rank (model-parallel shards are seeded per table already).
        broadcast_replicated_variables(model.trainable_variables, model.sparse.model_parallel_variables)

    manager = None
    if cfg.save_checkpoint_path:
        manager = checkpointing.CheckpointManager(
            cfg.save_checkpoint_path, model, optimizers, ctx, config, every_steps=cfg.checkpoint_every_steps,
            every_minutes=cfg.checkpoint_every_minutes, keep=cfg.keep_checkpoints, training=training,
            overwrite=cfg.overwrite, resumed_from=cfg.restore_checkpoint_path)

    trainer = Trainer(model, dense_optimizer, embedding_optimizer, ctx, loss_scale=cfg.loss_scale, xla=cfg.xla,
                      run_eagerly=cfg.run_eagerly)
    train_data = open_split("train", cfg.batch_size)
    test_data = open_split("test", cfg.valid_batch_size)
    steps_per_epoch = len(train_data)
    if steps_per_epoch == 0:
        raise UsageError(f"the training split has no full batch of --batch_size {cfg.batch_size}")
    total_steps = cfg.epochs * steps_per_epoch
    if cfg.max_steps > 0:
        total_steps = min(total_steps, cfg.max_steps)
    points = set(eval_points(steps_per_epoch, cfg.evals_per_epoch))
    chief = ctx.is_chief
    if chief:
        print(f"training {cfg.model}: {total_steps} steps ({steps_per_epoch} per epoch, global batch "
              f"{cfg.batch_size}, {ctx.world_size} rank(s), {policy}{', XLA' if cfg.xla else ''})", flush=True)

    evaluations: List[Dict[str, Any]] = []
    global_step = start_step
    timing = _Throughput(start_step, total_steps, cfg.batch_size)
    profiler = _Profiler(cfg.profiler_start_step, ctx.rank == cfg.profiled_rank % ctx.world_size, cfg.profile_dir)
    last_loss = float("nan")
    window_losses: List[float] = []

    def print_progress(epoch: int) -> None:
        nonlocal window_losses
        rate, left = timing.window_figures(global_step, cfg.batch_size)
        mean_loss = float(np.mean(window_losses))
        lr = float(schedule.learning_rate_at(global_step))
        if chief:
            print(f"epoch {epoch} step {global_step}/{total_steps} | loss {mean_loss:.5f} | lr {lr:.6g} | "
                  f"{rate:,.0f} samples/s | ETA {hms(left)}", flush=True)
        logger.log(step=(epoch, global_step), data={"loss": mean_loss, "learning_rate": lr, "samples_per_s": rate})
        window_losses = []

    last_stats: Dict[str, Any] = {}   # the last evaluation's summed sums, for --reliability_plot

    def evaluate_now(epoch: int) -> None:
        result = evaluator.evaluate(test_data, last_stats)
        result.update(step=global_step, epoch=epoch)
        evaluations.append(result)
        if chief:
            print(f"eval at step {global_step}: auc {result['auc']:.5f} | exact auc {result['auc_exact']:.5f} | "
                  f"loss {result['loss']:.5f}{click_metrics_text(result)} | {result['throughput']:,.0f} samples/s",
                  flush=True)
        logger.log(step=(epoch, global_step), data={f"eval_{k}": result[k] for k in
                                                    ("auc", "auc_exact", "loss", "throughput", *CLICK_METRICS,
                                                     *CORRECTED_CLICK_METRICS) if k in result})

    epoch = start_epoch
    position = (start_epoch, start_batch)
    while global_step < total_steps and epoch < cfg.epochs:
        skip = start_batch if epoch == start_epoch else 0
        batch_in_epoch = skip
        timing.pause()
        for batch in train_data.iterate(skip):
            if global_step >= total_steps:
                break
            profiler.step(global_step)
            loss = trainer.train_step(*batch)
            # The mean over ranks: every rank sees the same value and stops together. Fetching it every step
            # costs a host sync (small next to a GPU step at NVIDIA's batch sizes) but stops a diverged run at the
            # step it diverged, before a NaN weight reaches a checkpoint or another step.
            global_step += 1
            batch_in_epoch += 1
            position = (epoch, batch_in_epoch)
            last_loss = check_finite(
                float(loss), "training diverged: the loss is {value} at step {step} (epoch {epoch}, batch {batch}); "
                "lower --learning_rate (now {lr}), raise --warmup_steps, or check the data for NaN/inf",
                step=global_step, epoch=epoch, batch=batch_in_epoch, lr=cfg.learning_rate)
            timing.step(global_step, int(batch[2].shape[0]) * ctx.world_size)  # the last batch may be short
            window_losses.append(last_loss)
            if global_step % cfg.print_freq == 0 or global_step == total_steps:
                print_progress(epoch)
            if batch_in_epoch in points or global_step == total_steps:
                evaluate_now(epoch)
                timing.pause()  # evaluation time is not training time
            # Saved after the evaluation of the same step: a run killed in between redoes that evaluation on resume
            # instead of skipping it.
            if manager is not None:
                manager.maybe_save(global_step, epoch, batch_in_epoch)
                timing.pause()  # a save is not training time
        epoch += 1
    profiler.stop()
    if manager is not None:
        # The position of the next batch: (epoch, batches done in it); a finished epoch resumes at its end.
        manager.save(global_step, position[0], position[1])
    results: Dict[str, Any] = {"mode": "train", "global_step": global_step, "train_loss": last_loss,
                               **timing.results(), "precision": policy, "xla_jit_compiled": trainer.jit_compiled,
                               "world_size": ctx.world_size, "evaluations": evaluations}
    if evaluations:
        last = evaluations[-1]
        results.update(auc=last["auc"], auc_exact=last["auc_exact"], loss=last["loss"],
                       **{k: last[k] for k in CLICK_METRICS + CORRECTED_CLICK_METRICS if k in last},
                       eval_throughput=last["throughput"], best_auc=max(e["auc"] for e in evaluations))
        write_reliability_plot(cfg.reliability_plot, last_stats, ctx, f"{cfg.model} step {global_step}")
    if manager is not None and manager.last_path:
        results["checkpoint"] = manager.last_path
    if chief:
        summary = ", ".join(f"{k} {v:.5f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in results.items() if k not in ("evaluations",))
        print(f"done: {summary}", flush=True)
    _log_reliability(logger, last_stats)
    logger.log_summary({k: v for k, v in results.items() if k != "evaluations"})
    return results


def main(argv: Optional[Sequence[str]] = None, model: str = "dlrm") -> Dict[str, Any]:
    """Run ``model`` ("dlrm" or "dcnv2") with command-line ``argv``; returns the results dict.

    Raises ``UsageError`` (bad flags), data errors, ``FloatingPointError`` (diverged); always tears Horovod down.
    """
    args = parse_args(argv, model)  # before TensorFlow is imported: a flag error costs no TF start-up
    import tensorflow as tf
    from dlrm_dcnv2.distributed import hvd_utils
    previous_policy = tf.keras.mixed_precision.global_policy().name
    try:
        return run(args)
    finally:
        # A test (or notebook) calling main() again starts from a clean process state.
        tf.keras.mixed_precision.set_global_policy(previous_policy)
        hvd_utils.shutdown()


def split_model(argv: Sequence[str]):
    """``(model, remaining argv)`` from ``--model X`` / ``--model=X``; model None when absent."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return None, argv


def cli(argv: Optional[Sequence[str]] = None, model: Optional[str] = "dlrm") -> int:
    """The command line's exit status (recsys_common.cli): 2 for a bad flag (one ``error:`` line), 1 for a failed
    run (``error: FloatingPointError: ...``: diverged, bad data, a launcher mismatch). ``model`` None: ``--model``
    in ``argv`` picks it (NVIDIA's ``main.py``)."""
    from recsys_common.cli import exit_status
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    def run_model(argv: Sequence[str]) -> Dict[str, Any]:
        name, rest = (model, list(argv)) if model is not None else split_model(argv)
        if name not in MODELS:
            raise UsageError(f"main.py needs --model {{{','.join(MODELS)}}} (got {name!r}); or run dlrm.py / "
                             f"dcnv2.py, which set the model and its defaults")
        return main(rest, name)
    return exit_status(run_model, argv, input_errors=(UsageError,), with_type=True,
                       failures=(FloatingPointError, ValueError, OSError, LauncherMismatchError))


def command(model: Optional[str] = None) -> None:
    """``python dlrm.py`` / ``dcnv2.py`` / ``main.py --model X``: run and exit with :func:`cli`'s status."""
    sys.exit(cli(None, model))
