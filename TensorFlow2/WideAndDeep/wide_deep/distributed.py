"""The ranks of a run: Horovod when a launcher started this process (:class:`Dist`), and the CPU cores each rank of a
node keeps (``--affinity``: :func:`affinity_cores`, :func:`set_affinity`).

One process per rank. Horovod is initialised only under a launcher; a plain run is one rank without Horovod.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

import numpy as np

from recsys_common.horovod_launch import check_world_size, launched


class Dist:
    """Rank, world size and the few collectives the loop needs; identity functions in a one-process run."""

    def __init__(self):
        self.hvd = None
        self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
        if launched():  # horovodrun, mpirun, or srun with several tasks
            import horovod.tensorflow as hvd   # late on purpose: only under a launcher (it imports TensorFlow)
            hvd.init()
            try:  # several tasks launched but one Horovod rank: each would train alone (LauncherMismatchError)
                check_world_size(hvd.size())
            except Exception:
                hvd.shutdown()
                raise
            self.hvd = hvd
            self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
            self.local_size = hvd.local_size()

    def allreduce_grads(self, grads):
        if self.hvd is None:
            return grads
        return [self.hvd.allreduce(g, op=self.hvd.Average, name=f"grad_{i}") for i, g in enumerate(grads)]

    def broadcast_variables(self, variables) -> None:
        if self.hvd is not None:
            self.hvd.broadcast_variables(variables, root_rank=0)

    def allgather(self, array: np.ndarray) -> np.ndarray:
        if self.hvd is None:
            return array
        return self.hvd.allgather(array).numpy()

    def min_int(self, value: int) -> int:
        if self.hvd is None:
            return value
        return int(self.hvd.allreduce(np.array([value], np.int64), op=self.hvd.Min, name="min_int").numpy()[0])

    def barrier(self) -> None:
        if self.hvd is not None:
            self.hvd.allreduce(np.zeros(1, np.float32), name="barrier")

    def shutdown(self) -> None:
        if self.hvd is not None:
            self.hvd.shutdown()
            self.hvd = None


def affinity_cores(mode: str, cores: Sequence[int], local_rank: int, local_size: int) -> List[int]:
    """The CPU cores rank ``local_rank`` of the ``local_size`` ranks of a node keeps under ``--affinity mode``.

    ``cores``: those this process may use (``os.sched_getaffinity``). NVIDIA's modes, over these cores (NVIDIA's
    recipe takes the cores of the GPU's socket from NVML; we have no GPU topology on CPU machines, so all of them):
    ``all``/``disabled``: every core; ``single``: the first; ``single_unique``: one per rank; ``unique_contiguous``: an
    even contiguous block per rank; ``unique_interleaved``: every ``local_size``-th core from ``local_rank``.
    """
    cores = sorted(cores)
    if mode in ("all", "disabled") or not cores:
        return cores
    if mode == "single":
        return cores[:1]
    if mode == "single_unique":
        return [cores[local_rank % len(cores)]]
    if local_size > len(cores):  # more ranks than cores: share them round-robin, one each
        return [cores[local_rank % len(cores)]]
    if mode == "unique_interleaved":
        return cores[local_rank::local_size]
    if mode == "unique_contiguous":
        block = len(cores) // local_size
        return cores[local_rank * block:(local_rank + 1) * block]
    raise ValueError(f"--affinity {mode!r}: expected all, single, single_unique, unique_interleaved, "
                     f"unique_contiguous or disabled")


def set_affinity(mode: str, local_rank: int, local_size: int) -> Optional[List[int]]:
    """Pin this process to :func:`affinity_cores` (Linux); returns the cores, or None where it cannot pin."""
    if mode == "disabled" or not hasattr(os, "sched_setaffinity"):
        return None
    cores = affinity_cores(mode, os.sched_getaffinity(0), local_rank, local_size)
    os.sched_setaffinity(0, cores)
    return cores
