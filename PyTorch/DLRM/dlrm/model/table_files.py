"""Embedding tables larger than RAM: each table in RAM or in a file on local disk, chosen by a memory budget.

``--embedding_memory_budget_gb B`` keeps the smallest tables in RAM while their rows (and Adagrad accumulators) fit in
``B``; every other table lives in ``--embedding_storage_dir`` as a file of ``rows x dim`` float32, memory-mapped
shared. The kernel's page cache then holds the hot pages of those files (Criteo's ids are ordered by frequency, so
the hot rows share pages), reads the cold ones from disk when a batch touches them and writes dirty pages back on
its own. Why this design rather than a cache of our own (see the README's "Tables larger than RAM"): the update
stays the in-RAM code on the same tensor type, so a run with tables in files equals the same run in RAM bit for
bit, and the page cache needs no eviction policy, write-back thread or locking of ours.

The process's resident set stays bounded: after each step :meth:`TieredTableEmbeddings.release_pages` drops the
file pages this process has mapped (``madvise(MADV_DONTNEED)``; the data stays in the file and the page cache, which
the kernel shrinks under pressure) once the mapped part passes the budget. Files are preallocated
(``posix_fallocate``), so a full disk is an error naming the file at start, never a crash mid-step; a file of the
wrong size (truncated, or another model's) is refused naming it.

The optimizer runs inside the backward pass (no gradient tensor the size of a table is ever built): SGD as
:class:`dlrm.model.embeddings.FusedSGDTableEmbeddings` does it, or Adagrad as ``torch.optim.Adagrad`` does it on
the summed gradient of each id (``s += g^2``, ``w -= lr g / (sqrt(s) + eps)``), its accumulator a buffer of the
table (in RAM or in a file beside it), so checkpoints save and load it with the weights.
"""
from __future__ import annotations

import json
import mmap
import os
from typing import List, Optional, Sequence

import torch
from torch import nn

from .embeddings import _Hotness, bag_offsets

FLOAT_BYTES = 4
INIT_ROWS = 1 << 16          # rows initialised per piece (torch's CPU uniform_ draws serially: pieces = one call)
# Ids gathered or updated per piece, the mapped pages dropped after each: a step maps at most this many pages of a
# file (one per id), whatever the batch (MLPerf's uniform multi-hot ids touch a new page almost every time).
CHUNK_IDS = 1 << 15
MANIFEST = "tables.json"


class TableStorageError(OSError):
    """A table file that cannot be made or used (full disk, wrong size, foreign directory): names the file."""


def plan_tables(table_sizes: Sequence[int], dim: int, budget_bytes: Optional[float], adagrad: bool,
                reserved_bytes: float = 0.0) -> List[bool]:
    """Which tables go to files (True): the smallest stay in RAM while their bytes and ``reserved_bytes`` (a step's
    working set, :func:`step_working_set`) fit ``budget_bytes``."""
    per_row = dim * FLOAT_BYTES * (2 if adagrad else 1)
    in_files = [False] * len(table_sizes)
    if budget_bytes is None:
        return in_files
    used = float(reserved_bytes)
    for t in sorted(range(len(table_sizes)), key=lambda i: table_sizes[i]):
        size = table_sizes[t] * per_row
        if used + size <= budget_bytes:
            used += size
        else:
            in_files[t] = True
    return in_files


def step_page_allowance(batch: int, hotness: Sequence[int], page_bytes: int = mmap.PAGESIZE) -> int:
    """The file pages a piece of a step maps: one per id (and per accumulator row), at most ``CHUNK_IDS`` ids."""
    return 2 * min(batch * sum(hotness), CHUNK_IDS) * page_bytes


def step_working_set(batch: int, hotness: Sequence[int], dim: int, page_bytes: int = mmap.PAGESIZE) -> int:
    """Bytes a step holds for its lookups: the batch's gathered rows and their gradients, and the mapped pages of
    :func:`step_page_allowance`."""
    return 2 * batch * sum(hotness) * dim * FLOAT_BYTES + step_page_allowance(batch, hotness, page_bytes)


def check_budget_holds_a_batch(budget_bytes: float, batch: int, hotness: Sequence[int], dim: int) -> int:
    """:func:`step_working_set`, refusing a budget smaller than it (naming both)."""
    needed = step_working_set(batch, hotness, dim)
    if budget_bytes < needed:
        raise ValueError(f"--embedding_memory_budget_gb {budget_bytes / 2**30:.3g} is smaller than one batch's rows: "
                         f"{batch} rows x {sum(hotness)} ids need {needed / 2**30:.3g} GiB in a step (rows, gradients, "
                         f"mapped pages); raise the budget or lower --batch_size")
    return needed


class TableFile:
    """A ``[rows, dim]`` float32 array in ``path``, memory-mapped shared; ``tensor`` is a torch view of it."""

    def __init__(self, path: str, rows: int, dim: int):
        self.path, self.bytes = path, rows * dim * FLOAT_BYTES
        existed = os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size not in (0, self.bytes):
                raise TableStorageError(f"{path}: {size} bytes, a [{rows}, {dim}] float32 table needs {self.bytes} "
                                        f"(truncated, or another model's table): remove it or use another "
                                        f"--embedding_storage_dir")
            try:
                os.posix_fallocate(fd, 0, self.bytes)   # reserve the blocks now: no SIGBUS on a full disk later
            except OSError as error:
                if not existed:
                    os.unlink(path)   # nothing half-made is left behind
                raise TableStorageError(f"{path}: cannot reserve {self.bytes:,} bytes for the table "
                                        f"({error.strerror})") from None
            self.map = mmap.mmap(fd, self.bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            # Random access: without this a touched row maps its 64 KiB neighbourhood and reads ahead 128 KiB, so
            # 16k random rows of a 1 GiB table mapped 0.64 GiB (measured); with it, about one page per row.
            self.map.madvise(mmap.MADV_RANDOM)
        finally:
            os.close(fd)
        self.tensor = torch.frombuffer(self.map, dtype=torch.float32).view(rows, dim)

    def release(self) -> None:
        """Drop this process's mapped pages (the data stays in the file and the page cache)."""
        self.map.madvise(mmap.MADV_DONTNEED)

    def flush(self) -> None:
        self.map.flush()


def _open_storage(directory: str, table_sizes: Sequence[int], dim: int, in_files: Sequence[bool]) -> None:
    """Create ``directory`` or check that it holds this model's tables (its manifest), refusing a foreign one."""
    os.makedirs(directory, exist_ok=True)
    manifest = os.path.join(directory, MANIFEST)
    wanted = {"table_sizes": [int(n) for n in table_sizes], "embedding_dim": int(dim),
              "in_files": [bool(f) for f in in_files]}
    if os.path.exists(manifest):
        with open(manifest) as f:
            saved = json.load(f)
        if saved != wanted:
            raise TableStorageError(f"{manifest}: tables of another model or budget ({saved}); use another "
                                    f"--embedding_storage_dir")
        return
    if os.listdir(directory):
        raise TableStorageError(f"--embedding_storage_dir {directory} is not empty and holds no {MANIFEST}")
    tmp = manifest + ".tmp"
    with open(tmp, "w") as f:
        json.dump(wanted, f)
    os.replace(tmp, manifest)


class _LookupFusedUpdate(torch.autograd.Function):
    """Rows of ``weight`` at ``ids``; the backward updates them in place (SGD, or Adagrad with ``owner.adagrad``)."""

    @staticmethod
    def forward(ctx, weight, ids, owner, table):
        ctx.save_for_backward(ids)
        ctx.weight, ctx.owner, ctx.table = weight, owner, table
        return gather_rows(weight, ids, table)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        owner, weight, table = ctx.owner, ctx.weight, ctx.table
        grad = grad.to(weight.dtype)
        if owner.grad_multiplier != 1.0:
            grad = torch.nan_to_num(grad * owner.grad_multiplier, nan=0.0, posinf=0.0, neginf=0.0)
        if owner.adagrad:
            unique, inverse = torch.unique(ids, return_inverse=True)
            summed = grad.new_zeros(len(unique), grad.shape[1]).index_add_(0, inverse, grad)   # one gradient per id
            for start in range(0, len(unique), CHUNK_IDS):   # s += g^2; w -= lr g / (sqrt(s) + eps), per id
                rows, g = unique[start:start + CHUNK_IDS], summed[start:start + CHUNK_IDS]
                accumulated = table.adagrad_sum.index_select(0, rows).addcmul_(g, g)
                table.adagrad_sum.index_copy_(0, rows, accumulated)
                step = g / accumulated.sqrt().add_(owner.eps)
                weight.index_copy_(0, rows, weight.index_select(0, rows).add_(step, alpha=-owner.lr))
                table.release()
        else:
            for start in range(0, len(ids), CHUNK_IDS):
                rows, g = ids[start:start + CHUNK_IDS], grad[start:start + CHUNK_IDS]
                weight.scatter_add_(0, rows.unsqueeze(1).expand(-1, weight.shape[1]), g * -owner.lr)
                table.release()
        return None, None, None, None   # the update is done: the parameter gets no .grad


def gather_rows(weight: torch.Tensor, ids: torch.Tensor, table: "_Table") -> torch.Tensor:
    """``weight[ids]``, ``CHUNK_IDS`` ids at a time, the table's mapped pages dropped after each piece."""
    if len(ids) <= CHUNK_IDS:
        out = weight.index_select(0, ids)
        table.release()
        return out
    out = weight.new_empty(len(ids), weight.shape[1])
    for start in range(0, len(ids), CHUNK_IDS):
        torch.index_select(weight, 0, ids[start:start + CHUNK_IDS], out=out[start:start + CHUNK_IDS])
        table.release()
    return out


def _mapped_file_bytes() -> int:
    """This process's resident file-backed pages (``/proc/self/statm``'s shared pages), in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[2]) * mmap.PAGESIZE


class PageBudget:
    """Drops the pages of every table file once this process has more than ``limit_bytes`` of them mapped (beyond
    what it had mapped at the start: its libraries). Hot pages stay mapped between steps while under the limit, so
    a step does not fault them in again; ``limit_bytes`` None drops them every time."""

    def __init__(self, limit_bytes: Optional[float] = None):
        self.files: List["TableFile"] = []
        self.limit_bytes = limit_bytes
        self.baseline = _mapped_file_bytes()

    def maybe_release(self) -> None:
        if self.files and (self.limit_bytes is None or _mapped_file_bytes() - self.baseline > self.limit_bytes):
            self.release()

    def release(self) -> None:
        for table_file in self.files:
            table_file.release()


class _Table(nn.Module):
    """One table: ``weight`` (a parameter, so state dict keys are ``tables.{i}.weight`` as elsewhere) and, with
    Adagrad, its ``adagrad_sum`` accumulator."""

    def __init__(self, weight: torch.Tensor, adagrad_sum: Optional[torch.Tensor], pages: Optional[PageBudget]):
        super().__init__()
        self.weight = nn.Parameter(weight)
        if adagrad_sum is not None:
            self.register_buffer("adagrad_sum", adagrad_sum)
        self.pages = pages   # the budget of mapped file pages (None: a table in RAM)

    def release(self) -> None:
        if self.pages is not None:
            self.pages.maybe_release()


class TieredTableEmbeddings(nn.Module):
    """Tables in RAM or in files (see the module docstring), updated inside the backward pass.

    Args:
        table_sizes, embedding_dim, hotness: as :class:`dlrm.model.embeddings.MultiTableEmbeddings`.
        in_files: per table, whether it lives in a file (:func:`plan_tables`).
        storage_dir: where the files go (needed when any table is in a file).
        adagrad: Adagrad (``eps``) instead of SGD; ``lr`` is set before each step by the training loop.
        mapped_limit_bytes: file pages this process may keep mapped between drops (:class:`PageBudget`; None:
            drop them after every piece of work).

    Shapes: ``categorical [B, sum(hotness)]`` int64 -> ``[B, T, D]``. The state dict holds ``tables.{i}.weight``
    (and ``tables.{i}.adagrad_sum``): loading one copies into the files in place.
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dim: int, in_files: Sequence[bool],
                 storage_dir: Optional[str] = None, adagrad: bool = False, eps: float = 1e-10,
                 hotness: Optional[Sequence[int]] = None, mapped_limit_bytes: Optional[float] = None):
        super().__init__()
        self.table_sizes = [int(n) for n in table_sizes]
        self.embedding_dim, self.adagrad, self.eps = embedding_dim, adagrad, eps
        self.layout = _Hotness(hotness, len(self.table_sizes))
        self.hotness = self.layout.hotness
        self.in_files = [bool(f) for f in in_files]
        if any(self.in_files):
            if not storage_dir:
                raise ValueError("--embedding_memory_budget_gb puts tables in files: give --embedding_storage_dir")
            _open_storage(storage_dir, self.table_sizes, embedding_dim, self.in_files)
        self.pages = PageBudget(mapped_limit_bytes)
        self.files = self.pages.files
        self.tables = nn.ModuleList(self._make_table(t, storage_dir) for t in range(len(self.table_sizes)))
        self.lr, self.grad_multiplier = 0.0, 1.0

    def _make_table(self, t: int, storage_dir: Optional[str]) -> _Table:
        rows, dim = self.table_sizes[t], self.embedding_dim
        files: List[TableFile] = []

        def allocate(name: str) -> torch.Tensor:
            if not self.in_files[t]:
                return torch.empty(rows, dim)
            files.append(TableFile(os.path.join(storage_dir, f"{name}_{t}.f32"), rows, dim))
            return files[-1].tensor

        weight = allocate("table")
        accumulator = allocate("adagrad_sum") if self.adagrad else None
        table = _Table(weight, accumulator, self.pages if files else None)
        self.files.extend(files)
        bound = (1.0 / rows) ** 0.5   # uniform in +-sqrt(1/rows), as every table here; drawn in pieces
        with torch.no_grad():
            for start in range(0, rows, INIT_ROWS):
                weight[start:start + INIT_ROWS].uniform_(-bound, bound)
                if accumulator is not None:
                    accumulator[start:start + INIT_ROWS].zero_()   # MLPerf's initial accumulator value 0
                table.release()
        return table

    def release_pages(self) -> None:
        """Drop the file pages this process has mapped."""
        self.pages.release()

    def after_step(self) -> None:
        """Call after each step: drops the mapped file pages once they pass the limit (the resident set stays
        bounded; hot pages stay mapped until then)."""
        self.pages.maybe_release()

    def flush(self) -> None:
        """Write the files' dirty pages now (the kernel does it anyway; a checkpoint holds its own copy)."""
        for table_file in self.files:
            table_file.flush()

    def _check_ids(self, ids: torch.Tensor, t: int, padded: bool) -> None:
        if ids.numel() == 0:
            return
        low, high = int(ids.min()), int(ids.max())
        if high >= self.table_sizes[t] or low < (-1 if padded else 0):
            bad = high if high >= self.table_sizes[t] else low
            raise IndexError(f"categorical feature {t}: id {bad} outside its table of {self.table_sizes[t]} rows")

    def _rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        table = self.tables[t]
        if torch.is_grad_enabled() and table.weight.requires_grad:
            return _LookupFusedUpdate.apply(table.weight, ids, self, table)
        return table.weight.index_select(0, ids)

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        self.layout.check_width(categorical)
        columns = []
        for t, (lo, hi) in enumerate(self.layout.bounds):
            ids = categorical[:, lo:hi]
            self._check_ids(ids, t, padded=hi - lo > 1)
            if hi - lo == 1:
                columns.append(self._rows(t, ids.reshape(-1)))
                continue
            values, offsets = bag_offsets(ids)
            bag_of = torch.repeat_interleave(torch.arange(len(ids)), (ids >= 0).sum(1))
            rows = self._rows(t, values)
            columns.append(rows.new_zeros(len(ids), self.embedding_dim).index_add(0, bag_of, rows))   # sum pooling
        return torch.stack(columns, dim=1)

    def table_weights(self) -> List[torch.Tensor]:
        return [table.weight for table in self.tables]
