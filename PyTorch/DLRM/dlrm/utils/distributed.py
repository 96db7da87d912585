"""Process groups and collectives: one process, or ``torchrun --nproc_per_node=N`` on one or many nodes.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; without them the run is a
single process. TorchRec's ``DistributedModelParallel`` needs a process group even for one process, so
:func:`setup` can create a one-member group on a private file store.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import warnings
from typing import List, Optional

import torch
import torch.distributed as dist

from recsys_common.torch_distributed import shutdown_process_group


@dataclasses.dataclass
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: Optional[str] = None
    owns_group: bool = False  # we created the process group, so we destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(base_device: str, local_rank: int) -> torch.device:
    """``cuda`` -> ``cuda:<local_rank>`` when CUDA is present; otherwise the CPU, with a warning saying so."""
    if base_device.startswith("cuda"):
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        warnings.warn(f"--base_device {base_device} requested but CUDA is not available: running on the CPU "
                      f"(pass --base_device cpu to silence this)", stacklevel=2)
        return torch.device("cpu")
    if base_device != "cpu":
        raise ValueError(f"--base_device must be 'cuda' or 'cpu', got {base_device!r}")
    return torch.device("cpu")


def setup(base_device: str, backend: Optional[str] = None, need_group: bool = False) -> DistributedContext:
    """Read the torchrun environment, pick the device, and create the process group if one is needed."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(base_device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if backend is None:
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        warnings.warn("--backend nccl needs CUDA; using gloo on the CPU", stacklevel=2)
        backend = "gloo"
    ctx = DistributedContext(rank, world_size, local_rank, device, None, False)
    if dist.is_available() and dist.is_initialized():
        ctx.rank, ctx.world_size, ctx.backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
        return ctx
    if world_size > 1:
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
        ctx.backend, ctx.owns_group = backend, True
    elif need_group:
        store_file = tempfile.NamedTemporaryFile(prefix="dlrm_pg_", delete=False)
        store_file.close()
        store = dist.FileStore(store_file.name, 1)
        dist.init_process_group(backend=backend, store=store, rank=0, world_size=1)
        ctx.backend, ctx.owns_group = backend, True
    return ctx


def teardown(ctx: DistributedContext) -> None:
    """Destroy the process group :func:`setup` created, in step on every rank; a no-op for a group we did not create.

    The caller drops its models first (DMP and DDP hold the group). Uses the repository's one teardown,
    :func:`recsys_common.torch_distributed.shutdown_process_group` (it explains the gloo abort at exit it prevents).
    Called from ``main``'s ``finally``: while an exception propagates, the ranks skip the barrier, which ranks still
    inside a collective would never reach. Safe to call twice.
    """
    if ctx.owns_group:
        ctx.owns_group = False
        shutdown_process_group(barrier=sys.exc_info()[1] is None)


def group_active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_gather_1d(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate 1-D tensors of different lengths from every rank, in rank order (all ranks get the result)."""
    if not group_active():
        return tensor
    world = dist.get_world_size()
    length = torch.tensor([tensor.numel()], dtype=torch.int64, device=tensor.device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length)
    sizes = [int(n.item()) for n in lengths]
    padded = torch.zeros(max(sizes), dtype=tensor.dtype, device=tensor.device)
    padded[: tensor.numel()] = tensor
    parts: List[torch.Tensor] = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)])


def all_reduce_sum(values: List[float], device: torch.device) -> List[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if group_active():
        dist.all_reduce(tensor)
    return tensor.tolist()


def all_reduce_min_int(value: int, device: torch.device) -> int:
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    if group_active():
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def barrier() -> None:
    if group_active():
        dist.barrier()
