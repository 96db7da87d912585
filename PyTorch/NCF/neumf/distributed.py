"""NCF's process group: one process, or DDP over torchrun / torch.distributed.launch (NCCL on GPUs, gloo on CPU)."""
from __future__ import annotations

import os
import random
from typing import List, Optional

import torch
import torch.distributed as dist

from recsys_common.torch_distributed import shutdown_process_group


def init_distributed(device_flag: str, local_rank_flag: Optional[int]):
    """(rank, world_size, device). Multi-process when WORLD_SIZE > 1: NCCL on GPUs, gloo on CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", local_rank_flag if local_rank_flag is not None else 0))
    use_cuda = device_flag == "cuda" or (device_flag == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world_size > 1:
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        return dist.get_rank(), dist.get_world_size(), device
    return 0, 1, device


def shutdown_distributed(barrier: bool = True) -> None:
    """Tear the process group down on this rank, after :func:`neumf.train.run` has returned (its DDP model is gone).

    The repository's one teardown (:mod:`recsys_common.torch_distributed` explains the gloo abort at exit, "terminate
    called without an active exception", that it prevents). :func:`neumf.train.main` calls it on every exit, ``barrier=False``
    on an error (a rank that failed must not wait for ranks that may still be inside a collective). Safe without a
    group and safe to call twice.
    """
    shutdown_process_group(barrier=barrier)


def all_reduce_sum(values: List[float], device: torch.device) -> List[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def agree_on_seed(seed: Optional[int], device: torch.device) -> int:
    """The seed every rank uses: --seed, or one random draw on rank 0 broadcast to the others."""
    if seed is None:
        seed = random.SystemRandom().randrange(2 ** 31)
        if dist.is_initialized():
            t = torch.tensor([seed], dtype=torch.int64, device=device)
            dist.broadcast(t, src=0)
            seed = int(t.item())
    return seed
