"""Build a DLRM and make it trainable on one or many processes: embeddings, optimizers, parallel wrappers.

Embedding types (``--embedding_type``):

* ``torchrec_fused``: TorchRec ``DistributedModelParallel`` (DMP). Its planner shards the tables over the processes
  (``--sharding_type table_wise`` / ``row_wise`` / ``auto``: the planner picks per table); each shard is an FBGEMM
  table-batched embedding whose optimizer (SGD, or Adam on CUDA) runs fused inside the backward pass. The MLPs are
  replicated and trained data-parallel (DMP wraps them in ``DistributedDataParallel``). This is hybrid parallelism:
  model-parallel embeddings, data-parallel MLPs, with all-to-all exchanges between them.
* ``multi_table``: one ``torch.nn.EmbeddingBag`` per table, replicated on every process; the whole model is
  data-parallel (``DistributedDataParallel``). Sparse gradients on a single process, dense ones when data-parallel.
  Needs only PyTorch.
* ``auto``: ``torchrec_fused`` when TorchRec imports and supports the requested optimizer on this device, otherwise
  ``multi_table``.

Training equals plain SGD on the global batch whatever the number of processes (a test checks it): DDP averages the
MLP gradients over the processes, and TorchRec divides the embedding gradients by the world size in the backward of its
all-to-all (``torchrec.distributed.comm_ops.GRADIENT_DIVISION``, on by default). With an fp16 loss scale, the fused
optimizer would see scaled gradients, so ``TorchRecEmbeddings.grad_multiplier`` divides them by the scale first, and
the loss scaler steps only the optimizers whose parameters have ``.grad`` (:meth:`TrainableModel.step`).
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from .dlrm import DLRM
from .embeddings import (FusedSGDTableEmbeddings, MultiTableEmbeddings, TorchRecEmbeddings, table_key,
                         torchrec_available)
from .table_files import (TableStorageError, TieredTableEmbeddings, check_budget_holds_a_batch, plan_tables,
                          step_page_allowance)
from .table_sharding import RowShardedEmbeddings, build_row_sharded, check_storage_layout

EMBEDDING_TYPES = ("auto", "torchrec_fused", "multi_table")
SHARDING_TYPES = ("auto", "table_wise", "row_wise")
# Adagrad's epsilon in MLPerf's DLRM-DCNv2 reference (mlcommons/training recommendation_v2/torchrec_dlrm: ADAGRAD_EPS;
# also no lr decay, no weight decay, zero initial accumulator: torch's defaults).
ADAGRAD_EPS = 1e-10


@dataclasses.dataclass
class ModelConfig:
    num_numerical_features: int
    table_sizes: List[int]
    feature_names: List[str]
    embedding_dim: int = 128
    bottom_mlp_sizes: List[int] = dataclasses.field(default_factory=lambda: [512, 256, 128])
    top_mlp_sizes: List[int] = dataclasses.field(default_factory=lambda: [1024, 1024, 512, 256, 1])
    interaction_op: str = "dot"
    self_interaction: bool = False
    hash_indices: bool = False
    hotness: Optional[List[int]] = None     # ids per row of each table; None: all 1 (single-hot)
    dcn_num_layers: int = 3                 # interaction_op "dcn": cross layers ...
    dcn_low_rank_dim: int = 512             # ... and the rank of each (MLPerf DLRM-DCNv2: 3 and 512)

    def __post_init__(self):
        # stored as the full list, so checkpoints and serving see one form (all ones for single-hot data)
        self.hotness = [1] * len(self.table_sizes) if self.hotness is None else [int(h) for h in self.hotness]

    @property
    def multi_hot(self) -> bool:
        return any(h > 1 for h in self.hotness)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def resolve_embedding_type(requested: str, device: torch.device, adam_embeddings: bool,
                           tables_in_files: bool = False) -> str:
    if requested not in EMBEDDING_TYPES:
        raise ValueError(f"--embedding_type must be one of {EMBEDDING_TYPES}, got {requested!r}")
    if tables_in_files:   # --embedding_memory_budget_gb: our file-backed tables (dlrm.model.table_files)
        if requested == "torchrec_fused":
            raise ValueError("--embedding_memory_budget_gb keeps tables in files with --embedding_type multi_table "
                             "(or auto), not torchrec_fused")
        return "multi_table"
    fused_adam_ok = device.type == "cuda"  # FBGEMM's CPU kernels have fused SGD and Adagrad, not Adam
    if requested == "torchrec_fused":
        if not torchrec_available():
            raise RuntimeError("--embedding_type torchrec_fused needs torchrec and fbgemm-gpu (CPU: fbgemm-gpu-cpu); "
                               "install them or use --embedding_type multi_table")
        if adam_embeddings and not fused_adam_ok:
            raise ValueError("--Adam_embedding_optimizer with --embedding_type torchrec_fused needs CUDA: FBGEMM's CPU "
                             "kernels have no fused Adam. Use --embedding_type multi_table (torch SparseAdam) on CPU")
        return requested
    if requested == "auto":
        if torchrec_available() and (fused_adam_ok or not adam_embeddings):
            return "torchrec_fused"
        return "multi_table"
    return requested


class _CpuRowWiseSharder:
    """TorchRec's EmbeddingBagCollection sharder, also offering row-wise sharding on CPU.

    TorchRec 1.8 lists row-wise sharding for CUDA only, but its CPU path (FBGEMM CPU kernels + gloo all-to-all and
    reduce-scatter) works; tests compare it against single-process training.
    """

    def __new__(cls):
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

        class Sharder(EmbeddingBagCollectionSharder):
            def sharding_types(self, compute_device_type: str) -> List[str]:
                types = super().sharding_types(compute_device_type)
                if compute_device_type == "cpu" and "row_wise" not in types:
                    types = types + ["row_wise"]
                return types

        return Sharder()


@dataclasses.dataclass
class TrainableModel:
    """The wrapped model to call, the bare DLRM inside it, and its optimizers."""
    module: nn.Module                       # call this: DMP, DDP or the DLRM itself
    core: DLRM                              # the DLRM (its embeddings may be sharded)
    embedding_type: str
    dense_optimizer: torch.optim.Optimizer
    embedding_optimizer: Optional[object]   # plain: torch optimizer; torchrec: DMP's fused KeyedOptimizer
    table_state_keys: List[str]             # state_dict key of table i (canonical: unwrapped names)
    plan: Optional[object] = None

    @property
    def optimizers(self) -> list:
        return [o for o in (self.dense_optimizer, self.embedding_optimizer) if o is not None]

    def zero_grad(self, scaler=None) -> None:
        """Clear the gradients before a step's forward pass; ``scaler``: the float16 loss scaler, if any.

        The fused TorchRec tables are updated by FBGEMM inside the backward pass, before any ``scaler.step`` could
        unscale their gradient, so with a scaler their incoming gradient is multiplied by ``1 / scale`` in the
        backward instead (``TorchRecEmbeddings.grad_multiplier``, read when the forward pass runs): the tables then
        take the same update as without loss scaling.
        """
        self.dense_optimizer.zero_grad(set_to_none=True)
        if self.embedding_optimizer is not None:
            # For the fused optimizer this also pushes the current learning rate into the FBGEMM kernel.
            self.embedding_optimizer.zero_grad()
        if self.embedding_type == "torchrec_fused" or self.fused_sgd:
            self.core.embeddings.grad_multiplier = 1.0 / loss_scale(scaler) if scaler is not None else 1.0
        if self.fused_sgd:  # the tables' update runs in backward, at the learning rate the schedule just set
            self.core.embeddings.lr = self.embedding_optimizer.param_groups[0]["lr"]

    def step(self, scaler=None) -> None:
        """Apply the optimizers after the backward pass of ``scaler.scale(loss)`` (or of ``loss`` without scaler).

        ``GradScaler.step`` unscales the ``.grad`` of an optimizer's parameters and skips the step when one is inf or
        NaN. The fused TorchRec optimizer has no ``.grad`` to unscale (its update already happened in the backward
        pass, see :meth:`zero_grad`), and ``GradScaler.step`` on it fails with "No inf checks were recorded for this
        optimizer". So the scaler steps the MLP optimizer and the plain embedding optimizer; the fused optimizer's
        own ``step`` only pushes the learning rate into the kernel. On an fp16 overflow the MLP step is skipped and
        the scale halved, while the fused tables take the step with the non-finite gradient entries zeroed.
        """
        if isinstance(self.core.embeddings, (TieredTableEmbeddings, RowShardedEmbeddings)):
            self.core.embeddings.after_step()   # the tables in files: keep the resident set bounded
        if scaler is None:
            for optimizer in self.optimizers:
                optimizer.step()
            return
        scaler.step(self.dense_optimizer)
        if self.embedding_optimizer is not None:
            if self.embedding_type == "torchrec_fused" or self.fused_sgd:  # updated in backward: no .grad to unscale
                self.embedding_optimizer.step()
            else:
                scaler.step(self.embedding_optimizer)
        scaler.update()

    def state_dict(self) -> Dict[str, object]:
        """State with the wrapper prefixes removed (``module.``, ``_dmp_wrapped_module.``)."""
        return {_canonical(k): v for k, v in self.module.state_dict().items()}

    @property
    def fused_sgd(self) -> bool:
        """True when the tables take their step inside the backward pass (:class:`FusedSGDTableEmbeddings`, or
        :class:`TieredTableEmbeddings` with SGD or Adagrad, also row-sharded over processes)."""
        return isinstance(self.core.embeddings, (FusedSGDTableEmbeddings, TieredTableEmbeddings, RowShardedEmbeddings))

    def dense_named_parameters(self):
        return [(n, p) for n, p in self.core.named_parameters() if not n.startswith("embeddings.")]


def loss_scale(scaler):
    """The scaler's current scale: a device tensor once it has scaled a loss (no host sync), else a float."""
    scale = getattr(scaler, "_scale", None)
    return scale if scale is not None else scaler.get_scale()


def _canonical(key: str) -> str:
    for prefix in ("_dmp_wrapped_module.", "module."):
        while key.startswith(prefix):
            key = key[len(prefix):]
    return key


def build_trainable_model(config: ModelConfig, embedding_type: str, device: torch.device, world_size: int,
                          lr: float, adam_mlp: bool = False, adam_embeddings: bool = False,
                          sharding_type: str = "auto", local_batch_size: int = 512,
                          grad_multiplier: float = 1.0, fused_sgd: Optional[bool] = None,
                          adagrad: bool = False, table_budget_bytes: Optional[float] = None,
                          table_storage_dir: Optional[str] = None) -> TrainableModel:
    """Create the DLRM for ``embedding_type`` (already resolved) and wrap it for ``world_size`` processes.

    ``fused_sgd`` (``multi_table`` only; default: on with one process and SGD embeddings): the tables share one
    buffer and take their SGD step inside the backward pass (:class:`FusedSGDTableEmbeddings`); False keeps one
    ``nn.EmbeddingBag`` per table with sparse gradients stepped by ``torch.optim.SGD``.

    ``adagrad``: Adagrad for the MLPs and the tables, as MLPerf's DLRM-DCNv2 reference trains (``torch.optim.Adagrad``
    with ``eps`` :data:`ADAGRAD_EPS`, no decay, zero initial accumulator; FBGEMM's exact Adagrad for fused tables).

    ``table_budget_bytes`` (``--embedding_memory_budget_gb``): tables beyond it live in files under
    ``table_storage_dir`` (:mod:`dlrm.model.table_files`), ``multi_table`` on the CPU only; with several processes
    every table is split by rows over them (:mod:`dlrm.model.table_sharding`), the budget applying per process.

    A process group must exist when ``embedding_type == "torchrec_fused"`` or ``world_size > 1``.
    """
    if table_budget_bytes is not None:
        return _build_tiered(config, embedding_type, device, world_size, lr, adam_mlp, adam_embeddings, adagrad,
                             table_budget_bytes, table_storage_dir, local_batch_size)
    if embedding_type == "torchrec_fused" and not config.table_sizes:
        embedding_type = "multi_table"   # numerical features only: no table to shard
    if embedding_type == "torchrec_fused":
        return _build_torchrec(config, device, world_size, lr, adam_mlp, adam_embeddings, sharding_type,
                               local_batch_size, grad_multiplier, adagrad)
    if embedding_type != "multi_table":
        raise ValueError(f"unresolved embedding type {embedding_type!r}")
    sparse = world_size == 1
    if fused_sgd is None:
        fused_sgd = sparse and not (adam_embeddings or adagrad) and bool(config.table_sizes)
    if fused_sgd and not (sparse and not (adam_embeddings or adagrad)):
        raise ValueError("fused_sgd needs one process and SGD for the embeddings")
    if fused_sgd:  # one gather for all tables, SGD applied inside the backward pass (same update as sparse SGD)
        embeddings = FusedSGDTableEmbeddings(config.table_sizes, config.embedding_dim, device=device,
                                             hotness=config.hotness)
    else:
        embeddings = MultiTableEmbeddings(config.table_sizes, config.embedding_dim, sparse=sparse, device=device,
                                          hotness=config.hotness)
    core = _dlrm(config, embeddings).to(device)
    if device.type == "cuda" and hasattr(core.interaction, "pad_multiple"):
        core.interaction.pad_multiple = 8  # tensor-core friendly batched matmul in the dot interaction
    dense_params = [p for n, p in core.named_parameters() if not n.startswith("embeddings.")]
    dense_optimizer = _dense_optimizer(dense_params, lr, adam_mlp, device, adagrad)
    table_params = list(embeddings.parameters())
    if not table_params:   # numerical features only: no table, no table optimizer
        embedding_optimizer = None
    elif adagrad:   # torch's Adagrad takes the sparse gradients of one process as they are
        embedding_optimizer = torch.optim.Adagrad(table_params, lr=lr, eps=ADAGRAD_EPS)
    elif adam_embeddings:
        embedding_optimizer = torch.optim.SparseAdam(table_params, lr=lr) if sparse else torch.optim.Adam(table_params, lr=lr)
    else:
        embedding_optimizer = torch.optim.SGD(table_params, lr=lr)
    module: nn.Module = core
    if world_size > 1:
        module = nn.parallel.DistributedDataParallel(
            core, device_ids=[device] if device.type == "cuda" else None, broadcast_buffers=False)
    keys = [f"embeddings.tables.{i}.weight" for i in range(len(config.table_sizes))]
    return TrainableModel(module, core, "multi_table", dense_optimizer, embedding_optimizer, keys)


def _build_tiered(config, embedding_type, device, world_size, lr, adam_mlp, adam_embeddings, adagrad, budget_bytes,
                  storage_dir, local_batch_size) -> TrainableModel:
    """The DLRM with :class:`TieredTableEmbeddings`: tables in RAM or in files by the budget, updated in backward;
    with several processes, split by rows over them (:class:`RowShardedEmbeddings`) and the MLPs under DDP."""
    if embedding_type != "multi_table" or device.type != "cpu":
        raise ValueError("--embedding_memory_budget_gb needs CPU processes and --embedding_type multi_table (or "
                         f"auto); got {embedding_type}, {device.type}")
    if adam_embeddings:
        raise ValueError("--embedding_memory_budget_gb: the file-backed tables take SGD or --adagrad, not "
                         "--Adam_embedding_optimizer")
    plan = _table_budget(config, budget_bytes, adagrad, local_batch_size * world_size)
    if world_size == 1:
        problem = check_storage_layout(storage_dir, world_size)
        if problem:
            raise TableStorageError(problem)
        in_files, mapped_limit = plan(config.table_sizes)
        embeddings = TieredTableEmbeddings(config.table_sizes, config.embedding_dim, in_files, storage_dir,
                                           adagrad=adagrad, eps=ADAGRAD_EPS, hotness=config.hotness,
                                           mapped_limit_bytes=mapped_limit)
    else:
        import torch.distributed as dist
        embeddings = build_row_sharded(config.table_sizes, config.embedding_dim, dist.get_rank(), world_size, plan,
                                       storage_dir, adagrad=adagrad, eps=ADAGRAD_EPS, hotness=config.hotness)
    core = _dlrm(config, embeddings)
    dense_params = [p for n, p in core.named_parameters() if not n.startswith("embeddings.")]
    dense_optimizer = _dense_optimizer(dense_params, lr, adam_mlp, device, adagrad)
    # holds the tables' learning rate for the schedule; the update itself runs in the backward pass
    lr_holder = torch.optim.SGD(list(embeddings.parameters()), lr=lr)
    module: nn.Module = core
    prefix = "embeddings."
    if world_size > 1:
        # The tables are this process's shards, updated in the backward pass: DDP must neither broadcast them from
        # process 0 nor wait for their gradients. The other buffers are equal everywhere: no sync per forward.
        ignored = [f"embeddings.{name}" for name, _ in [*embeddings.named_parameters(), *embeddings.named_buffers()]]
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(core, ignored)
        module = nn.parallel.DistributedDataParallel(core, forward_sync_buffers=False)
        prefix = "embeddings.local."
    keys = [f"{prefix}tables.{i}.weight" for i in range(len(config.table_sizes))]
    return TrainableModel(module, core, "multi_table", dense_optimizer, lr_holder, keys)


def _table_budget(config: ModelConfig, budget_bytes: float, adagrad: bool, lookup_batch: int):
    """``plan(table_sizes) -> (in_files, mapped_limit_bytes)`` of a process's tables under ``budget_bytes``: the
    smallest tables stay in RAM while they fit beside a step's working set of ``lookup_batch`` rows (a process of
    several looks up the rows it owns for the whole global batch: at worst all of them), the rest go to files,
    whose mapped pages get what the budget leaves (:class:`dlrm.model.table_files.PageBudget`)."""
    dim, hotness = config.embedding_dim, config.hotness
    working_set = check_budget_holds_a_batch(budget_bytes, lookup_batch, hotness, dim)

    def plan(table_sizes: Sequence[int]):
        in_files = plan_tables(table_sizes, dim, budget_bytes, adagrad, working_set)
        in_ram = sum(n for n, f in zip(table_sizes, in_files) if not f) * dim * 4 * (1 + adagrad)
        return in_files, budget_bytes - in_ram - (working_set - step_page_allowance(lookup_batch, hotness))
    return plan


def _dlrm(config: ModelConfig, embeddings: nn.Module) -> DLRM:
    return DLRM(config.num_numerical_features, config.table_sizes, config.embedding_dim, config.bottom_mlp_sizes,
                config.top_mlp_sizes, embeddings, config.interaction_op, config.self_interaction,
                config.hash_indices, config.hotness, config.dcn_num_layers, config.dcn_low_rank_dim)


def _dense_optimizer(params: Sequence[nn.Parameter], lr: float, adam: bool, device: torch.device,
                     adagrad: bool = False):
    if adagrad:
        return torch.optim.Adagrad(params, lr=lr, eps=ADAGRAD_EPS)
    if adam:
        return torch.optim.Adam(params, lr=lr, fused=device.type == "cuda")
    return torch.optim.SGD(params, lr=lr)


def _build_torchrec(config, device, world_size, lr, adam_mlp, adam_embeddings, sharding_type, local_batch_size,
                    grad_multiplier, adagrad=False) -> TrainableModel:
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    if sharding_type not in SHARDING_TYPES:
        raise ValueError(f"--sharding_type must be one of {SHARDING_TYPES}, got {sharding_type!r}")
    embeddings = TorchRecEmbeddings(config.table_sizes, config.embedding_dim, config.feature_names, config.hotness)
    embeddings.grad_multiplier = grad_multiplier
    core = _dlrm(config, embeddings)
    # Dense parts are real tensors on the CPU until DMP moves them; the EBC stays on "meta" until sharded.
    for name, module in core.named_children():
        if name != "embeddings":
            module.to(device)
    core._sizes = core._sizes.to(device)
    if adagrad:   # FBGEMM's EXACT_ADAGRAD, fused into the backward pass
        embedding_optimizer_class, options = torch.optim.Adagrad, {"lr": lr, "eps": ADAGRAD_EPS}
    else:
        embedding_optimizer_class, options = (torch.optim.Adam if adam_embeddings else torch.optim.SGD), {"lr": lr}
    apply_optimizer_in_backward(embedding_optimizer_class, embeddings.ebc.parameters(), options)

    allowed = ["table_wise", "row_wise"] if sharding_type == "auto" else [sharding_type]
    constraints = {f"t_{table_key(f)}": ParameterConstraints(sharding_types=allowed, compute_kernels=["fused"])
                   for f in config.feature_names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Topology constructed directly": we give world size and device explicitly
        topology = Topology(world_size=world_size, compute_device=device.type,
                            local_world_size=_local_world_size(world_size), **device_memory_caps(device))
        planner = EmbeddingShardingPlanner(topology=topology, batch_size=local_batch_size, constraints=constraints)
        sharder = _CpuRowWiseSharder()
        plan = planner.collective_plan(core, [sharder], dist.GroupMember.WORLD)
    model = DistributedModelParallel(core, device=device, plan=plan, sharders=[sharder])
    dense_params = [p for n, p in core.named_parameters() if "embeddings." not in n]
    dense_optimizer = _dense_optimizer(dense_params, lr, adam_mlp, device, adagrad)
    keys = [f"embeddings.ebc.embedding_bags.t_{table_key(f)}.weight" for f in config.feature_names]
    return TrainableModel(model, core, "torchrec_fused", dense_optimizer, model.fused_optimizer, keys, plan)


def device_memory_caps(device: torch.device) -> dict:
    """The planner's memory limits per process from this machine, not TorchRec's defaults (32 GiB of HBM per GPU,
    128 GiB of host memory): ``hbm_cap`` = the GPU's total memory on CUDA; ``ddr_cap`` = the host's memory shared by
    the processes of this node (tables live there on the CPU)."""
    caps = {}
    if device.type == "cuda":
        caps["hbm_cap"] = int(torch.cuda.get_device_properties(device).total_memory)
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return caps
    caps["ddr_cap"] = int(host // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    return caps


def _local_world_size(world_size: int) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
