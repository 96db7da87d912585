"""Tables in files over several processes: every table split by rows, each process holding its rows in RAM or files.

``torchrun --nproc_per_node W ... --embedding_memory_budget_gb B --embedding_storage_dir D``: process ``r`` owns a
contiguous block of rows of every table (:func:`row_range`, TorchRec's row-wise rule) and keeps them in a
:class:`dlrm.model.table_files.TieredTableEmbeddings` of its own under ``D/rank_<r>``; the budget ``B`` is per
process and decides, as with one process, which of its shards stay in RAM. The MLPs are replicated and trained by
``DistributedDataParallel``, which ignores the tables (they never get a ``.grad``).

One step, with ``B_r`` rows of the batch on process ``r`` and ``N = sum B_r`` (the global batch):

    ids      = all_gather(categorical)                              [N, H]   every process sees every id
    partial  = sum over the ids of a bag that this process owns     [N, T, D] (zero where it owns none)
    pooled_r = sum over processes of partial, rows of r's batch     [B_r, T, D]  (all_to_all, then a sum)
    backward: g = all_gather(d loss_r / d pooled_r) / W             [N, T, D]
              each process updates the rows it owns (SGD or Adagrad inside the backward, as with one process)

Dividing by ``W`` makes the tables take the step of one process on the global batch, as DDP's averaging does for
the MLPs. The tables start from the same weights as one process's (:meth:`RowShardTables._initialise` draws the
whole table's random numbers and keeps its rows), so W processes train the model one process trains, up to the
order of float sums (DDP adds the MLP gradients of the processes; a bag whose ids fall on several processes is
pooled in another order).

    >>> row_range(10, rank=1, world_size=3), row_range(2, rank=2, world_size=3)
    ((4, 8), (2, 2))
"""
from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from .table_files import INIT_ROWS, TableStorageError, TieredTableEmbeddings

LAYOUT_FILE = "sharding.json"   # in --embedding_storage_dir: the number of processes whose shards it holds


def row_range(rows: int, rank: int, world_size: int) -> Tuple[int, int]:
    """Rows ``[start, stop)`` of a table of ``rows`` rows that process ``rank`` owns: blocks of ``ceil(rows / W)``
    in rank order (TorchRec's row-wise sharding), so the last processes may own fewer rows, or none."""
    block = -(-rows // world_size)
    return min(rank * block, rows), min((rank + 1) * block, rows)


def shard_storage_dir(storage_dir: Optional[str], rank: int) -> Optional[str]:
    return os.path.join(storage_dir, f"rank_{rank}") if storage_dir else None


def check_storage_layout(storage_dir: Optional[str], world_size: int) -> Optional[str]:
    """Why ``storage_dir`` cannot hold the tables of ``world_size`` processes (None: it can; it is then marked as
    theirs). Shards are cut by the number of processes, so a storage serves only runs with the same number."""
    if not storage_dir or not os.path.isdir(storage_dir):
        if storage_dir and world_size > 1:
            _write_layout(storage_dir, world_size)
        return None
    layout = os.path.join(storage_dir, LAYOUT_FILE)
    saved = None
    if os.path.exists(layout):
        try:
            with open(layout) as f:
                saved = int(json.load(f)["world_size"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"{layout}: unreadable ({error})"
    elif world_size > 1 and os.path.exists(os.path.join(storage_dir, "tables.json")):
        saved = 1
    if saved is not None and saved != world_size:
        return (f"--embedding_storage_dir {storage_dir} holds the table shards of {saved} process(es), this run has "
                f"{world_size}: tables in files resume only with the number of processes that wrote them (torchrun "
                f"--nproc_per_node {saved}), or start anew with another --embedding_storage_dir")
    if world_size > 1 and saved is None:
        _write_layout(storage_dir, world_size)
    return None


def _write_layout(storage_dir: str, world_size: int) -> None:
    """Every process writes the same content, each under its own temporary name: the rename is atomic."""
    os.makedirs(storage_dir, exist_ok=True)
    tmp = os.path.join(storage_dir, f".{LAYOUT_FILE}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump({"world_size": world_size}, f)
    os.replace(tmp, os.path.join(storage_dir, LAYOUT_FILE))


class RowShardTables(TieredTableEmbeddings):
    """Process ``rank``'s rows of every table (:func:`row_range`), each shard in RAM or in a file as the budget says.

    Args:
        table_sizes: rows of each whole table.
        rank, world_size: this process and the number of processes.
        other arguments: as :class:`TieredTableEmbeddings`, with ``in_files`` per shard.

    Local table ``t`` holds global rows ``row_offsets[t] ..`` (the attributes the checkpoint records read); it is
    initialised with the whole table's random numbers (see :meth:`_initialise`).
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dim: int, rank: int, world_size: int,
                 in_files: Sequence[bool], storage_dir: Optional[str] = None, **kwargs):
        whole = [int(n) for n in table_sizes]
        ranges = [row_range(n, rank, world_size) for n in whole]
        # set before the base class builds (and initialises) the tables: _initialise reads them
        self._whole_sizes, self._ranges = whole, ranges
        super().__init__([stop - start for start, stop in ranges], embedding_dim, in_files, storage_dir, **kwargs)
        self.row_offsets = [start for start, _ in ranges]
        self.global_table_sizes = whole

    def _initialise(self, t: int, weight: torch.Tensor, accumulator: Optional[torch.Tensor], table) -> None:
        """The pieces one process draws for the whole table (uniform in +-sqrt(1/rows), ``INIT_ROWS`` rows per
        call), keeping this shard's rows: W processes start from one process's weights, and the random stream
        after the tables (the MLPs' initialisation) is one process's too. Costs one whole table of draws."""
        rows = self._whole_sizes[t]
        start_row, stop_row = self._ranges[t]
        bound = (1.0 / rows) ** 0.5
        drawn = torch.empty(min(rows, INIT_ROWS), self.embedding_dim)
        with torch.no_grad():
            for start in range(0, rows, INIT_ROWS):
                stop = min(start + INIT_ROWS, rows)
                piece = drawn[:stop - start].uniform_(-bound, bound)
                low, high = max(start, start_row), min(stop, stop_row)
                if low < high:
                    weight[low - start_row:high - start_row].copy_(piece[low - start:high - start])
                    if accumulator is not None:
                        accumulator[low - start_row:high - start_row].zero_()
                    table.release()


class RowShardedEmbeddings(nn.Module):
    """The tables of ``world_size`` processes, each holding its rows in ``local`` (:class:`RowShardTables`); the
    module docstring gives the exchange. A collective: every process calls forward (and backward) in step.

    Shapes: ``categorical [B_r, sum(hotness)]`` int64 (ids already hashed, -1 padding multi-hot bags) ->
    ``[B_r, T, D]``, the pooled rows of this process's batch.
    """

    def __init__(self, local: RowShardTables, world_size: int, group=None):
        super().__init__()
        self.local = local
        self.world_size, self.group = world_size, group
        self.table_sizes = list(local.global_table_sizes)
        self.embedding_dim, self.layout, self.hotness = local.embedding_dim, local.layout, local.hotness
        # per id column: its table's rows, and the lowest valid id (-1 pads a multi-hot bag)
        self._column_rows = torch.tensor([self.table_sizes[t] for t in local.layout.column_table.tolist()])
        self._column_low = torch.tensor([-1 if self.hotness[t] > 1 else 0 for t in local.layout.column_table.tolist()])

    # the training loop sets these on the embeddings before each step; the update runs in the local tables
    @property
    def lr(self) -> float:
        return self.local.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.local.lr = value

    @property
    def grad_multiplier(self) -> float:
        return self.local.grad_multiplier

    @grad_multiplier.setter
    def grad_multiplier(self, value: float) -> None:
        self.local.grad_multiplier = value

    def after_step(self) -> None:
        self.local.after_step()

    def release_pages(self) -> None:
        self.local.release_pages()

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        self.layout.check_width(categorical)
        ids, batch_sizes = _gather_ids(categorical, self.world_size, self.group)
        self._check_ids(ids, batch_sizes)
        partial = self._pool_owned(ids)
        return _SumOverProcesses.apply(partial, batch_sizes, self.group)

    def _check_ids(self, ids: torch.Tensor, batch_sizes: List[int]) -> None:
        """Every process checks the same gathered ids, so all of them stop on a bad one (none waits alone); the -1
        rows padding a shorter batch are not ids."""
        bad = (ids >= self._column_rows) | (ids < self._column_low)
        longest = max(batch_sizes)
        for process, size in enumerate(batch_sizes):
            bad[process * longest + size:(process + 1) * longest] = False
        if bool(bad.any()):
            row, column = (int(i) for i in bad.nonzero()[0])
            t = int(self.layout.column_table[column])
            raise IndexError(f"categorical feature {t}: id {int(ids[row, column])} outside its table of "
                             f"{self.table_sizes[t]} rows")

    def _pool_owned(self, ids: torch.Tensor) -> torch.Tensor:
        """``[N, T, D]``: per row of the global batch and table, the sum of the rows of its ids that this process
        owns (the bag's other ids are summed by their owners)."""
        columns = []
        for t, (first, last) in enumerate(self.layout.bounds):
            start, stop = self.local.row_offsets[t], self.local.row_offsets[t] + self.local.table_sizes[t]
            table_ids = ids[:, first:last]
            bag_of, column = ((table_ids >= start) & (table_ids < stop)).nonzero(as_tuple=True)   # row-major order
            rows = self.local.lookup(t, table_ids[bag_of, column] - start)
            columns.append(rows.new_zeros(len(ids), self.embedding_dim).index_add(0, bag_of, rows))
        return torch.stack(columns, dim=1)


def _gather_ids(categorical: torch.Tensor, world_size: int, group) -> Tuple[torch.Tensor, List[int]]:
    """``(ids of every process's batch [W * max B_r, H] in rank order, [B_r])``; a shorter batch is padded with -1
    rows (owned by no process)."""
    size = torch.tensor([len(categorical)], dtype=torch.int64)
    sizes = torch.empty(world_size, dtype=torch.int64)
    dist.all_gather_into_tensor(sizes, size, group=group)
    batch_sizes = sizes.tolist()
    longest = max(batch_sizes)
    if len(categorical) < longest:
        categorical = torch.cat([categorical, categorical.new_full((longest - len(categorical),
                                                                    categorical.shape[1]), -1)])
    ids = categorical.new_empty(world_size * longest, categorical.shape[1])
    dist.all_gather_into_tensor(ids, categorical.contiguous(), group=group)
    return ids, batch_sizes


class _SumOverProcesses(torch.autograd.Function):
    """Forward: each process's partial sums ``[W * L, T, D]`` (``L`` rows per process, padded) summed over the
    processes, this process keeping the rows of its batch ``[B_r, T, D]``. Backward: every process's gradient of
    those rows, gathered, divided by ``W``: the gradient of the mean of the processes' losses."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, batch_sizes: List[int], group) -> torch.Tensor:
        world_size, rank = len(batch_sizes), dist.get_rank(group)
        ctx.batch_sizes, ctx.group, ctx.rank = batch_sizes, group, rank
        received = torch.empty_like(partial)
        dist.all_to_all_single(received, partial.contiguous(), group=group)   # block r of every process -> r
        summed = received.view(world_size, -1, *partial.shape[1:]).sum(0)
        return summed[:batch_sizes[rank]]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        batch_sizes, world_size = ctx.batch_sizes, len(ctx.batch_sizes)
        longest = max(batch_sizes)
        grad = grad.contiguous()
        if len(grad) < longest:
            grad = torch.cat([grad, grad.new_zeros(longest - len(grad), *grad.shape[1:])])
        gathered = grad.new_empty(world_size * longest, *grad.shape[1:])
        dist.all_gather_into_tensor(gathered, grad, group=ctx.group)
        return gathered.div_(world_size), None, None


def build_row_sharded(table_sizes: Sequence[int], embedding_dim: int, rank: int, world_size: int,
                      plan_shards, storage_dir: Optional[str], **kwargs) -> RowShardedEmbeddings:
    """The row-sharded tables of process ``rank``: ``plan_shards(shard_sizes) -> (in_files, mapped_limit_bytes)``
    applies the budget to this process's shards; their files go to ``storage_dir/rank_<rank>``.

    Refuses, on every process, a storage written by another number of processes (:func:`check_storage_layout`)."""
    problem = check_storage_layout(storage_dir, world_size)
    _agree(problem)
    shard_sizes = [stop - start for start, stop in (row_range(int(n), rank, world_size) for n in table_sizes)]
    in_files, mapped_limit = plan_shards(shard_sizes)
    local = RowShardTables(table_sizes, embedding_dim, rank, world_size, in_files,
                           shard_storage_dir(storage_dir, rank), mapped_limit_bytes=mapped_limit, **kwargs)
    return RowShardedEmbeddings(local, world_size)


def _agree(problem: Optional[str]) -> None:
    """Raise on every process when one found a problem (one raising alone would leave the others waiting)."""
    failed = torch.tensor([0 if problem is None else 1], dtype=torch.int64)
    dist.all_reduce(failed)
    if problem is not None:
        raise TableStorageError(problem)
    if int(failed):
        raise TableStorageError(f"{int(failed)} other process(es) refused their --embedding_storage_dir: see their "
                                f"error")
