"""Our training step against TorchRec's own ``torchrec.models.dlrm.DLRM``, back to back in one process (CPU).

Called by ``python benchmarks/throughput.py`` (``--compare torchrec_peer``, its default), which documents the method;
:func:`compare_with_torchrec` returns the JSON-ready result. TorchRec and FBGEMM must be installed (they are optional
for the recipe, required for this comparison).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence

import torch

from dlrm.model.parallel import ModelConfig, build_trainable_model
from dlrm.utils.amp import Amp, cpu_runs_bfloat16_natively
from dlrm.utils.compile import compile_dense as compile_parts
from dlrm.utils.distributed import setup, teardown
from recsys_common.machine import cpu_bf16_instructions, cpu_model_name

# The shapes of the issue and that a plain TorchRec user runs: Kaggle Criteo's DLRM and the seed's.
SHAPES = {
    "kaggle": {"embedding_dim": 16, "bottom_mlp_sizes": [512, 256, 64, 16], "top_mlp_sizes": [512, 256, 1]},
    "seed": {"embedding_dim": 128, "bottom_mlp_sizes": [512, 256, 128], "top_mlp_sizes": [1024, 1024, 512, 256, 1]},
    "tiny": {"embedding_dim": 4, "bottom_mlp_sizes": [8, 4], "top_mlp_sizes": [8, 1]},  # smoke tests only
}
NUM_NUMERICAL, NUM_TABLES, LR = 13, 26, 0.1


def make_batches(count: int, batch_size: int, table_size: int, seed: int = 0) -> List[Dict[str, torch.Tensor]]:
    """``count`` random Criteo-shaped batches: numerical ``[B, 13]`` in [0, 1), ids ``[B, 26]``, labels ``[B]``.

    The peer reads the same ids as a feature-major ``KeyedJaggedTensor`` (built here, outside the timing)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        numerical = torch.rand(batch_size, NUM_NUMERICAL, generator=generator)
        categorical = torch.randint(0, table_size, (batch_size, NUM_TABLES), generator=generator)
        label = torch.randint(0, 2, (batch_size,), generator=generator).float()
        kjt = KeyedJaggedTensor(keys=[f"cat_{i}" for i in range(NUM_TABLES)], values=categorical.t().reshape(-1),
                                lengths=torch.ones(batch_size * NUM_TABLES, dtype=torch.int64))
        out.append({"numerical": numerical, "categorical": categorical, "label": label, "kjt": kjt})
    return out


def build_peer(variant: str, shape: Dict, table_size: int) -> Callable[[Dict[str, torch.Tensor]], torch.Tensor]:
    """TorchRec's DLRM with ``variant``'s embeddings ("fused" or "dmp"); returns one float32 SGD training step."""
    from torchrec.models.dlrm import DLRM as TorchRecDLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    tables = [EmbeddingBagConfig(name=f"t_{i}", embedding_dim=shape["embedding_dim"], num_embeddings=table_size,
                                 feature_names=[f"cat_{i}"]) for i in range(NUM_TABLES)]
    arch = {"dense_in_features": NUM_NUMERICAL, "dense_arch_layer_sizes": shape["bottom_mlp_sizes"],
            "over_arch_layer_sizes": shape["top_mlp_sizes"]}
    if variant == "fused":
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
        collection = FusedEmbeddingBagCollection(tables=tables, optimizer_type=torch.optim.SGD,
                                                 optimizer_kwargs={"lr": LR}, device=torch.device("cpu"))
        model = TorchRecDLRM(embedding_bag_collection=collection, **arch)
        dense = [p for n, p in model.named_parameters() if not n.startswith("sparse_arch.")]
    elif variant == "dmp":
        import torch.distributed as dist
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        if not dist.is_initialized():
            raise RuntimeError("the dmp peer needs a process group (compare_with_torchrec creates one)")
        collection = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        model = TorchRecDLRM(embedding_bag_collection=collection, dense_device=torch.device("cpu"), **arch)
        apply_optimizer_in_backward(torch.optim.SGD, model.sparse_arch.embedding_bag_collection.parameters(),
                                    {"lr": LR})
        model = DistributedModelParallel(module=model, device=torch.device("cpu"))
        dense = [p for n, p in model.named_parameters() if "sparse_arch" not in n]
    else:
        raise ValueError(f"--peer_variants: unknown TorchRec variant {variant!r} (fused, dmp)")
    optimizer = torch.optim.SGD(dense, lr=LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step(batch):
        optimizer.zero_grad()
        logits = model(dense_features=batch["numerical"], sparse_features=batch["kjt"]).squeeze(-1)
        loss = loss_fn(logits, batch["label"])
        loss.backward()
        optimizer.step()
        return loss

    step.model = model  # keeps the model alive with the step; lets callers inspect it
    return step


def build_ours(shape: Dict, table_size: int, precision: str, compile_dense: bool,
               embedding_type: str = "multi_table", batch_size: int = 2048) \
        -> Callable[[Dict[str, torch.Tensor]], torch.Tensor]:
    """The recipe's model and training step (as ``dlrm.train`` runs it on one CPU process): ``multi_table`` is
    ``dlrm.scripts.main --embedding_type multi_table`` (one-buffer tables, SGD fused into the backward),
    ``torchrec_fused`` what ``--embedding_type auto`` (the default) picks where TorchRec is installed."""
    config = ModelConfig(NUM_NUMERICAL, [table_size] * NUM_TABLES, [f"cat_{i}" for i in range(NUM_TABLES)],
                         shape["embedding_dim"], shape["bottom_mlp_sizes"], shape["top_mlp_sizes"])
    trainable = build_trainable_model(config, embedding_type, torch.device("cpu"), 1, lr=LR,
                                      local_batch_size=batch_size)
    if compile_dense:
        compile_parts(trainable.core)
    amp = Amp(precision == "bfloat16", torch.device("cpu"), "bfloat16", 1.0)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step(batch):
        trainable.zero_grad(amp.scaler)
        with amp.autocast():
            logits = trainable.module(batch["numerical"], batch["categorical"])
        loss = loss_fn(logits.float(), batch["label"])
        loss.backward()
        trainable.step(amp.scaler)
        return loss

    step.model = trainable.core
    return step


def _timed(step, batches, count: int, first: int) -> float:
    """Seconds per step, the median of ``count`` steps over ``batches`` starting at index ``first``."""
    times = []
    for i in range(count):
        begin = time.perf_counter()
        loss = step(batches[(first + i) % len(batches)])
        times.append(time.perf_counter() - begin)
    if not torch.isfinite(loss):
        raise FloatingPointError("benchmark training loss became NaN or infinite")
    return statistics.median(times)


def compare_with_torchrec(shapes: Sequence[str], batch_size: int = 2048, table_size: int = 100_000,
                          peer_variants: Sequence[str] = ("fused", "dmp"), rounds: int = 5, steps: int = 30,
                          warmup_steps: int = 10, precision: str = "auto", compile_dense: bool = True,
                          threads: Optional[int] = None, ours_embedding_type: str = "multi_table") -> Dict:
    """Samples/s of ours and of each TorchRec variant per shape and round, the per-round ratio ours / best peer and
    its median; with the CPU model, threads, torch/TorchRec versions and the load average before and after."""
    import torchrec   # optional (as in dlrm.model): imported only for the comparison that needs it
    if threads:
        torch.set_num_threads(threads)
    if os.environ.get("MALLOC_MMAP_MAX_") != "0":
        warnings.warn("run with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000 (as RESULTS.md's figures): "
                      "glibc's defaults re-fault freed buffers every step on these VMs", stacklevel=2)
    if ours_embedding_type not in ("multi_table", "torchrec_fused"):
        raise ValueError(f"--ours_embedding_type: {ours_embedding_type!r}, choose multi_table or torchrec_fused")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise ValueError(f"--shapes: unknown shape(s) {unknown}; known: {sorted(SHAPES)}")
    if precision == "auto":
        precision = "bfloat16" if cpu_runs_bfloat16_natively() else "float32"
    result: Dict = {"cpu_model_name": cpu_model_name(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "torchrec": torchrec.__version__, "batch_size": batch_size,
                    "table_size": table_size, "num_tables": NUM_TABLES, "rounds": rounds, "steps": steps,
                    "warmup_steps": warmup_steps,
                    "cpu_bf16_instructions": cpu_bf16_instructions(),
                    "ours": {"precision": precision, "compile_dense": compile_dense,
                             "embedding_type": ours_embedding_type,
                             "embeddings": {"multi_table": "one buffer, SGD fused into backward",
                                            "torchrec_fused": "TorchRec DMP, FBGEMM fused SGD"}[ours_embedding_type]},
                    "peer": {"model": "torchrec.models.dlrm.DLRM", "variants": list(peer_variants),
                             "precision": "float32"},
                    "malloc": {k: os.environ.get(k) for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")},
                    "load_average_start": list(os.getloadavg()), "shapes": {}}
    # the dmp peer and our torchrec_fused tables need a (one-rank gloo) group
    ctx = setup("cpu", need_group="dmp" in peer_variants or ours_embedding_type == "torchrec_fused")
    try:
        for shape_name in shapes:
            shape = SHAPES[shape_name]
            batches = make_batches(8, batch_size, table_size)
            torch.manual_seed(0)
            steps_by_name = {f"torchrec_{v}": build_peer(v, shape, table_size) for v in peer_variants}
            begin = time.perf_counter()
            ours = build_ours(shape, table_size, precision, compile_dense, ours_embedding_type, batch_size)
            ours(batches[0])  # the first call compiles (when compiling): timed separately
            compile_s = time.perf_counter() - begin
            steps_by_name["ours"] = ours
            for step in steps_by_name.values():
                _timed(step, batches, warmup_steps, 1)
            per_round: List[Dict[str, float]] = []
            for r in range(rounds):
                names = list(steps_by_name) if r % 2 == 0 else list(reversed(steps_by_name))
                figures = {name: batch_size / _timed(steps_by_name[name], batches, steps, r) for name in names}
                best_peer = max(v for k, v in figures.items() if k != "ours")
                figures["ratio_ours_over_best_peer"] = figures["ours"] / best_peer
                per_round.append(figures)
                print(json.dumps({"shape": shape_name, "round": r, **figures}), file=sys.stderr, flush=True)
            medians = {k: statistics.median(f[k] for f in per_round) for k in per_round[0]}
            result["shapes"][shape_name] = {
                **shape, "median_samples_per_s": {k: v for k, v in medians.items() if k != "ratio_ours_over_best_peer"},
                "ratio_ours_over_best_peer": medians["ratio_ours_over_best_peer"],
                "rounds": per_round, "ours_first_step_s": compile_s}
            del steps_by_name, ours
    finally:
        teardown(ctx)
    result["load_average_end"] = list(os.getloadavg())
    return result
