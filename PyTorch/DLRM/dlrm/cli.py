"""The flags of ``python -m dlrm.scripts.main`` and the one frozen :class:`DlrmConfig` a run is built from.

    argv -> read_flags -> (flag values, given_flags) -> settle(..., device, world size, dataset info) -> DlrmConfig

:func:`dlrm.train.main` reads the flags, sets up the processes and parses the dataset's FeatureSpec (once; the parsed
``info`` is handed down), then settles the configuration, once per run; :func:`parse` does both steps for tools.

Flags and defaults follow NVIDIA's recipe (the 2020 seed, plus the later flags of reference A.4); see the README for
what differs and why. :func:`settle` builds the configuration once, after choosing the CPU defaults (issue 18):

NVIDIA's ``--batch_size 32768`` with ``--lr 28 --warmup_steps 6400 --decay_start_step 64000 --decay_steps 80000``
made a 100k-row CPU run take 3 optimizer steps, all inside the warmup (test AUC 0.511). On a CPU, when the command
line does not set ``--batch_size``, :func:`choose_cpu_defaults` picks the batch with the repository's one rule
(:func:`recsys_common.cpu_defaults.choose_batch_defaults`), scales ``--lr`` with it (linear for SGD, NVIDIA's
optimizer; square root when ``--Adam_MLP_optimizer`` or ``--Adam_embedding_optimizer`` is on), and lays the
step-based schedule over this run as NVIDIA lays it over one Criteo-1TB epoch
(:func:`recsys_common.cpu_defaults.choose_schedule_defaults`). ``--test_batch_size``, when not given, is bounded by
memory only. Flags given (``given_flags``) are kept; a GPU keeps NVIDIA's values.
"""
from __future__ import annotations

import dataclasses
import sys
from types import MappingProxyType
from typing import AbstractSet, Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from absl import flags

from recsys_common import cpu_defaults
from recsys_common.datasets import count_rows

PROG = "dlrm.scripts.main"   # NVIDIA's command name: the CPU defaults line and errors start with it

NVIDIA_BATCH_SIZE = 32768
NVIDIA_LR = 28.0
CRITEO_1TB_TRAIN_ROWS = 4_195_197_692          # days 0-22 (reference: TorchRec's TOTAL_TRAINING_SAMPLES)
NVIDIA_RUN_STEPS = CRITEO_1TB_TRAIN_ROWS // NVIDIA_BATCH_SIZE   # 128027: NVIDIA trains one epoch
# Peak RSS per row of the batch, an upper bound: the whole 1.63 GB peak of NVIDIA's defaults (dim 128, MLPs
# 512-256-128 / 1024-1024-512-256-1) at --batch_size 32768 on 100k rows, divided by the batch (/usr/bin/time -v,
# 2026-11-25, AMD EPYC), scaled by the model's width.
BYTES_PER_ROW_NVIDIA_DLRM = 1.63e9 / NVIDIA_BATCH_SIZE
NVIDIA_DLRM_WIDTH = 26 * 128 + (512 + 256 + 128) + (1024 + 1024 + 512 + 256 + 1)
SCHEDULE_FLAGS = ("warmup_steps", "decay_start_step", "decay_steps")
# MLPerf Training's DLRM-DCNv2 (mlcommons/training recommendation_v2/torchrec_dlrm, README "Running the MLPerf DLRM v2
# benchmark"): what --mlperf_dcnv2 sets, except where the command line sets the flag itself. The per-table hotness
# (3,2,1,2,6,...) is the dataset's (its FeatureSpec's max_hotness), as MLPerf's materialized multi-hot data has it.
MLPERF_BATCH_SIZE = 65536
MLPERF_LR = 0.005
MLPERF_TABLE_CAP = 40_000_000
MLPERF_DCNV2: Mapping[str, Any] = MappingProxyType({
    "interaction_op": "dcn", "dcn_num_layers": 3, "dcn_low_rank_dim": 512, "embedding_dim": 128,
    "bottom_mlp_sizes": ("512", "256", "128"), "top_mlp_sizes": ("1024", "1024", "512", "256", "1"),
    "adagrad": True, "lr": MLPERF_LR, "batch_size": MLPERF_BATCH_SIZE, "test_batch_size": MLPERF_BATCH_SIZE,
    "warmup_steps": 0, "decay_steps": 0, "decay_start_step": 0,
    "max_table_size": MLPERF_TABLE_CAP, "hash_indices": True})


def build_parser() -> flags.FlagValues:
    """A fresh flag registry holding every flag (our own, never absl's global one), NVIDIA's names and defaults."""
    f = flags.FlagValues()
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
    d.DEFINE_float("embedding_memory_budget_gb", None, "RAM for the embedding tables (and their Adagrad state) per "
                   "process: the smallest tables that fit stay in RAM, the others live in files under "
                   "--embedding_storage_dir, memory-mapped (CPU, --embedding_type multi_table); under torchrun every "
                   "table is split by rows over the processes, each holding its rows", flag_values=f)
    d.DEFINE_string("embedding_storage_dir", None, "Directory on local disk for the tables that "
                    "--embedding_memory_budget_gb puts in files (created; reused by a resumed run, which needs the "
                    "same number of processes; process r of several uses rank_<r>/ in it)", flag_values=f)
    d.DEFINE_enum("sharding_type", "auto", ["auto", "table_wise", "row_wise"],
                  "How TorchRec's planner may shard embedding tables over processes (auto: it chooses per table)",
                  flag_values=f)
    d.DEFINE_integer("embedding_dim", 128, "Dimensionality of embedding space for categorical features",
                     flag_values=f)
    d.DEFINE_list("top_mlp_sizes", ["1024", "1024", "512", "256", "1"], "Linear layer sizes for the top MLP",
                  flag_values=f)
    d.DEFINE_list("bottom_mlp_sizes", ["512", "256", "128"], "Linear layer sizes for the bottom MLP", flag_values=f)
    d.DEFINE_enum("interaction_op", "dot", ["dot", "cat", "dcn"],
                  "Type of interaction operation to perform. Supported choices: 'dot', 'cat' or 'dcn' (DCN V2's "
                  "low-rank cross network, as MLPerf's DLRM-DCNv2)", flag_values=f)
    d.DEFINE_integer("dcn_num_layers", 3, "Number of DCN layers in the interaction (only with --interaction_op dcn)",
                     lower_bound=1, flag_values=f)
    d.DEFINE_integer("dcn_low_rank_dim", 512, "Low rank dimension of each DCN layer (only with --interaction_op "
                     "dcn)", lower_bound=1, flag_values=f)
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
    d.DEFINE_boolean("adagrad", False, "Use Adagrad for the MLPs and the embeddings (MLPerf DLRM-DCNv2's optimizer: "
                     "eps 1e-10, no decay)", flag_values=f)
    d.DEFINE_boolean("mlperf_dcnv2", False, "MLPerf's DLRM-DCNv2 configuration, each part overridable by its own flag: "
                     + ", ".join(f"--{k} {_flag_text(v)}" for k, v in MLPERF_DCNV2.items()), flag_values=f)
    return f


def _flag_text(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


FLAGS = build_parser()  # the registry read_flags parses into (and --help and the README's table read)


def flag_names() -> List[str]:
    """Every flag's name, not its short alias (``--shuffle``)."""
    return [name for name in FLAGS if FLAGS[name].name == name]


def ints(values: Sequence[str], flag: str) -> List[int]:
    """``["512", "256"]`` -> ``[512, 256]``; a bad entry is an error naming ``--flag``."""
    try:
        return [int(v) for v in values]
    except ValueError:
        raise ValueError(f"--{flag} must be a comma-separated list of integers, got {','.join(values)}") from None


class _DerivedSettings:
    """What a :class:`DlrmConfig` derives from its flags (mixed into the class :func:`_config_class` makes)."""

    @property
    def synthetic(self) -> bool:
        """Random batches instead of --dataset: --synthetic_dataset or --dataset_type synthetic_gpu."""
        return self.synthetic_dataset or self.dataset_type == "synthetic_gpu"

    def local_batch_size(self, world_size: int) -> int:
        """This process's share of --batch_size (global, over all processes)."""
        return max(self.batch_size // world_size, 1)

    @property
    def lr_schedule(self) -> Dict[str, Any]:
        """``LearningRateSchedule(**config.lr_schedule)``: NVIDIA's warmup, then polynomial decay."""
        return {"base_lr": self.lr, "warmup_steps": self.warmup_steps, "warmup_factor": self.warmup_factor,
                "decay_start_step": self.decay_start_step, "decay_steps": self.decay_steps,
                "decay_power": self.decay_power, "end_lr": self.decay_end_lr}

    def parameters(self) -> Dict[str, Any]:
        """Every setting, for the log (``given_flags`` sorted)."""
        return {**dataclasses.asdict(self), "given_flags": sorted(self.given_flags)}


FLAG_TYPES = {"int": int, "float": float, "bool": bool}


def _config_class() -> type:
    """The frozen dataclass of a run's settings: one field per flag of :func:`build_parser` (the one list of their
    names, types and defaults; a list flag is a tuple of its strings), then ``given_flags``."""
    fields: List[Tuple[str, Any, Any]] = []
    for name in flag_names():
        flag = FLAGS[name]
        kind = Tuple[str, ...] if isinstance(flag.default, list) else FLAG_TYPES.get(flag.flag_type(), str)
        fields.append((name, kind if flag.default is not None else Optional[kind], dataclasses.field()))
    fields.append(("given_flags", FrozenSet[str], dataclasses.field(default=frozenset())))
    doc = ("One run's settings, built once by :func:`settle`: every flag (``build_parser``; the README's "
           "\"Parameters\") with the CPU defaults chosen in, and ``given_flags``, the flags the command line set.")
    return dataclasses.make_dataclass("DlrmConfig", fields, bases=(_DerivedSettings,), frozen=True,
                                      namespace={"__doc__": doc, "__module__": __name__})


DlrmConfig = _config_class()


def read_flags(argv: Optional[Sequence[str]] = None) -> Tuple[Mapping[str, Any], FrozenSet[str]]:
    """Parse ``argv`` (without the program name; None: ``sys.argv[1:]``): ``(flag values, given_flags)``, the
    values read-only (list flags as tuples) and ``given_flags`` the flags the command line set, even to their
    default value (the CPU defaults never replace those)."""
    FLAGS.unparse_flags()
    FLAGS([PROG] + list(argv if argv is not None else sys.argv[1:]))
    names = flag_names()
    values = {name: tuple(FLAGS[name].value) if isinstance(FLAGS[name].value, list) else FLAGS[name].value
              for name in names}
    given = frozenset(name for name in names if FLAGS[name].present)
    if values["mlperf_dcnv2"]:
        values.update({name: value for name, value in MLPERF_DCNV2.items() if name not in given})
    return MappingProxyType(values), given


def model_width(flag_values: Mapping[str, Any], num_tables: int) -> int:
    """Activation values per row (the memory rule's unit): embeddings, MLP layers, and the DCN's layers."""
    bottom = ints(flag_values["bottom_mlp_sizes"], "bottom_mlp_sizes")
    width = num_tables * int(flag_values["embedding_dim"]) + sum(bottom) + sum(ints(flag_values["top_mlp_sizes"],
                                                                                      "top_mlp_sizes"))
    if flag_values["interaction_op"] == "dcn":   # each cross layer holds x_l, U V x_l and the rank-r projection
        cross = num_tables * int(flag_values["embedding_dim"]) + bottom[-1]
        width += int(flag_values["dcn_num_layers"]) * (2 * cross + int(flag_values["dcn_low_rank_dim"]))
    return width


def train_rows(flag_values: Mapping[str, Any], info) -> Optional[int]:
    """Rows an epoch trains on: the synthetic entries, or the training files' rows (sizes only) x --dataset_subset."""
    if flag_values["synthetic_dataset"] or flag_values["dataset_type"] == "synthetic_gpu":
        return int(flag_values["synthetic_dataset_num_entries"])
    rows = count_rows(info.spec, "train")
    subset = flag_values["dataset_subset"]
    return max(1, int(rows * subset)) if subset is not None else rows


def choose_cpu_defaults(flag_values: Mapping[str, Any], given_flags: AbstractSet[str], device_type: Optional[str],
                        world_size: int, info, memory_bytes: Optional[int] = None
                        ) -> Tuple[Dict[str, Any], Optional[str]]:
    """On a CPU, the values of ``--batch_size`` / ``--test_batch_size`` / ``--lr`` / the schedule steps that the
    command line left at NVIDIA's defaults (those not in ``given_flags``), and the line to print (None: no change).
    Returns its choices; writes nothing."""
    if device_type != "cpu":
        return {}, None
    adaptive = flag_values["Adam_MLP_optimizer"] or flag_values["Adam_embedding_optimizer"] or flag_values["adagrad"]
    mlperf = flag_values["mlperf_dcnv2"]   # the reference batch and rate are MLPerf's, its schedule flat
    recipe = cpu_defaults.RecipeBatch(MLPERF_BATCH_SIZE if mlperf else NVIDIA_BATCH_SIZE,
                                      MLPERF_LR if mlperf else NVIDIA_LR, "sqrt" if adaptive else "linear",
                                      "batch_size", "lr", "test_batch_size", "MLPerf" if mlperf else "NVIDIA")
    training = flag_values["mode"] == "train"
    rows = (train_rows(flag_values, info) if cpu_defaults.training_batch_wanted(given_flags, recipe, training)
            else None)
    width = model_width(flag_values, len(info.cardinalities))
    batch = cpu_defaults.choose_batch_defaults(
        given_flags, recipe, world_size=world_size, training=training, train_rows=rows, memory_bytes=memory_bytes,
        given_learning_rate=flag_values["lr"], bytes_per_row=BYTES_PER_ROW_NVIDIA_DLRM * width / NVIDIA_DLRM_WIDTH)
    chosen, parts = dict(batch.values), list(batch.parts)
    if batch.choice is not None:
        run_steps = (rows // batch.choice.batch) * flag_values["epochs"]   # training drops the last partial batch
        if flag_values["max_steps"]:
            run_steps = min(run_steps, flag_values["max_steps"])
        moved, part = cpu_defaults.choose_schedule_defaults(
            given_flags | (set(SCHEDULE_FLAGS) if mlperf else set()), {dest: flag_values[dest] for dest in SCHEDULE_FLAGS}, batch.choice.batch, NVIDIA_BATCH_SIZE,
            NVIDIA_RUN_STEPS, run_steps)
        chosen.update(moved)
        if part:
            parts.append(part)
    return chosen, cpu_defaults.defaults_line(PROG, parts, "--batch_size")


def settle(flag_values: Mapping[str, Any], given_flags: AbstractSet[str], *, device_type: Optional[str],
           world_size: int = 1, info=None, memory_bytes: Optional[int] = None
           ) -> Tuple[DlrmConfig, Optional[str]]:
    """The run's configuration, built once: the flag values with the CPU defaults (:func:`choose_cpu_defaults`;
    ``device_type`` None or not ``"cpu"``: none) chosen in, and the line saying what was chosen (None: nothing).
    ``info``: the dataset's :class:`dlrm.data.DatasetInfo` (needed on a CPU)."""
    chosen, line = choose_cpu_defaults(flag_values, given_flags, device_type, world_size, info, memory_bytes)
    return DlrmConfig(**{**flag_values, **chosen}, given_flags=frozenset(given_flags)), line


def parse(argv: Optional[Sequence[str]] = None, *, device_type: Optional[str] = None, world_size: int = 1,
          info=None, memory_bytes: Optional[int] = None) -> DlrmConfig:
    """``argv`` -> :class:`DlrmConfig` (:func:`read_flags`, then :func:`settle`); without ``device_type`` the flags
    as given, with NVIDIA's defaults."""
    flag_values, given_flags = read_flags(argv)
    return settle(flag_values, given_flags, device_type=device_type, world_size=world_size, info=info,
                  memory_bytes=memory_bytes)[0]


def help_text(doc: str) -> str:
    """``--help``: the command's docstring and every flag."""
    return f"{doc}\n{FLAGS.get_help()}"


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in ("--help", "-h", "--helpfull") for a in argv)
