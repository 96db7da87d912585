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

Checkpoints do not copy the tables in files (:mod:`dlrm.model.table_storage`): the live files are the newest
checkpoint's tables plus the changes since, which an undo journal can revoke. A checkpoint syncs the files, writes
the tables in RAM as files of its generation (:meth:`TieredTableEmbeddings.prepare_commit`), records the generation
in its meta.json and, once in place, makes it the storage's (:meth:`TieredTableEmbeddings.commit`); resuming rolls
the files back to it (:meth:`TieredTableEmbeddings.restore`). Only the newest checkpoint's tables exist: resuming an
older one is refused.
"""
from __future__ import annotations

import mmap
import os
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from . import table_storage
from .embeddings import _Hotness, bag_offsets
from .table_storage import (IDENTITY_FIELDS, JOURNAL_PREFIX, MANIFEST, StorageLock, TableStorageError,  # noqa: F401
                            UndoJournal, generation_file, journal_path, journal_records, read_manifest,
                            remove_quietly, write_manifest)

FLOAT_BYTES = 4
INIT_ROWS = 1 << 16          # rows initialised per piece (torch's CPU uniform_ draws serially: pieces = one call)
# Ids gathered or updated per piece, the mapped pages dropped after each: a step maps at most this many pages of a
# file (one per id), whatever the batch (MLPerf's uniform multi-hot ids touch a new page almost every time).
CHUNK_IDS = 1 << 15
FINITE_CHECK_ELEMENTS = 1 << 22   # elements per block of a table in RAM checked for NaN/inf at a checkpoint


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
    """A ``[rows, dim]`` float32 array in ``path``, memory-mapped shared; ``tensor`` is a torch view of it.

    ``must_exist``: the file belongs to a storage that already holds tables (a missing or empty file there is damage,
    never a table to make anew)."""

    def __init__(self, path: str, rows: int, dim: int, must_exist: bool = False):
        self.path, self.bytes = path, rows * dim * FLOAT_BYTES
        existed = os.path.exists(path)
        if must_exist and not existed:
            raise TableStorageError(f"{path}: missing from a storage that holds tables (deleted?): resume from it is "
                                    f"impossible; use another --embedding_storage_dir")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size not in ((self.bytes,) if must_exist else (0, self.bytes)):
                raise TableStorageError(f"{path}: {size} bytes, a [{rows}, {dim}] float32 table needs {self.bytes} "
                                        f"(truncated, or another model's table): remove it or use another "
                                        f"--embedding_storage_dir")
            if self.bytes == 0:   # a shard without rows (a table smaller than the number of processes)
                self.map, self.tensor = None, torch.empty(0, dim)
                return
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
        if self.map is not None:
            self.map.madvise(mmap.MADV_DONTNEED)

    def flush(self) -> None:
        if self.map is not None:
            self.map.flush()

    def sync(self) -> None:
        """Write every dirty page of the file to disk (those of this mapping and those the kernel holds)."""
        table_storage.fsync_file(self.path)


def _file_names(in_files: Sequence[bool], adagrad: bool) -> List[Tuple[int, str]]:
    """``(table, "table" | "adagrad_sum")`` of every table file, in the order of their index in the journal."""
    names = ("table", "adagrad_sum") if adagrad else ("table",)
    return [(t, name) for t, in_file in enumerate(in_files) if in_file for name in names]


def _refuse_foreign(directory: str) -> None:
    """Refuse a directory holding files but no storage manifest (a user's, not ours)."""
    if set(os.listdir(directory)) - {table_storage.LOCK}:
        raise TableStorageError(f"--embedding_storage_dir {directory} is not empty and holds no {MANIFEST}")


def _open_storage(directory: str, identity: Dict[str, Any]) -> Tuple[StorageLock, Dict[str, Any], bool]:
    """Create ``directory`` or check that it holds this model's tables (its manifest), refusing a foreign one, and
    lock it: ``(lock, manifest, created)``."""
    os.makedirs(directory, exist_ok=True)
    if not os.path.exists(os.path.join(directory, MANIFEST)):
        _refuse_foreign(directory)   # before the lock file: a refused directory is left as it was
    lock = StorageLock(directory, exclusive=True)
    manifest = read_manifest(directory)
    if manifest is not None:
        saved = {field: manifest.get(field) for field in IDENTITY_FIELDS}
        if saved != identity:
            raise TableStorageError(f"{os.path.join(directory, MANIFEST)}: tables of another model or budget "
                                    f"({saved}); use another --embedding_storage_dir")
        return lock, manifest, False
    _refuse_foreign(directory)
    manifest = dict(identity, generation=0, token=None, prepared=None)
    write_manifest(directory, manifest)
    return lock, manifest, True


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
        owner.sync_journal()   # the old bytes of every row this step changes are on disk before the first change
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
        storage_dir: where the files go (needed when any table is in a file). With a storage, checkpoints keep the
            tables there (:meth:`prepare_commit`, :meth:`commit`, :meth:`restore`), not in the checkpoint.
        adagrad: Adagrad (``eps``) instead of SGD; ``lr`` is set before each step by the training loop.
        mapped_limit_bytes: file pages this process may keep mapped between drops (:class:`PageBudget`; None:
            drop them after every piece of work).

    Shapes: ``categorical [B, sum(hotness)]`` int64 -> ``[B, T, D]``. The state dict holds ``tables.{i}.weight``
    (and ``tables.{i}.adagrad_sum``): loading one copies into the files in place.

    A row-sharded wrapper sets ``row_offsets`` (the first global row of each local table) and
    ``global_table_sizes``, so that a checkpoint's record says where each shard belongs.
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
        if any(self.in_files) and not storage_dir:
            raise ValueError("--embedding_memory_budget_gb puts tables in files: give --embedding_storage_dir")
        self.storage_dir = os.path.abspath(storage_dir) if storage_dir else None
        self.row_offsets: Optional[List[int]] = None
        self.global_table_sizes: Optional[List[int]] = None
        # Whether training may change the tables: a storage no checkpoint refers to (created now, or whose run
        # crashed before its first checkpoint) starts from fresh weights; one of a checkpoint must be restored first.
        self.writable, self.generation, reopened = True, 0, False
        if self.storage_dir is not None:
            identity = {"table_sizes": self.table_sizes, "embedding_dim": int(embedding_dim),
                        "in_files": self.in_files, "adagrad": bool(adagrad)}
            self.lock, self.manifest, created = _open_storage(self.storage_dir, identity)
            self.generation, reopened = self.manifest["generation"], not created
            self.writable = self.generation == 0 and not self.manifest["prepared"]
            if reopened and self.writable:
                self._remove_other_generations(keep=None)   # a crashed run's journal of weights nobody saved
        self.pages = PageBudget(mapped_limit_bytes)
        self.files = self.pages.files
        self.table_files: List[List[Tuple[int, TableFile]]] = [[] for _ in self.table_sizes]
        self.tables = nn.ModuleList(self._make_table(t, reopened) for t in range(len(self.table_sizes)))
        self.lr, self.grad_multiplier = 0.0, 1.0
        self.journal: Optional[UndoJournal] = None
        self._reset_journal_state()

    def _make_table(self, t: int, reopened: bool) -> _Table:
        rows, dim = self.table_sizes[t], self.embedding_dim

        def allocate(name: str) -> torch.Tensor:
            if not self.in_files[t]:
                return torch.empty(rows, dim)
            # a storage at generation 0 may have been cut short while its files were made: they are made anew
            table_file = TableFile(os.path.join(self.storage_dir, f"{name}_{t}.f32"), rows, dim,
                                   must_exist=reopened and not self.writable)
            self.table_files[t].append((len(self.files), table_file))
            self.files.append(table_file)
            return table_file.tensor

        weight = allocate("table")
        accumulator = allocate("adagrad_sum") if self.adagrad else None
        table = _Table(weight, accumulator, self.pages if self.in_files[t] else None)
        if self.writable:   # else the files hold a checkpoint's tables: restore() brings them to its generation
            self._initialise(t, weight, accumulator, table)
        return table

    def _initialise(self, t: int, weight: torch.Tensor, accumulator: Optional[torch.Tensor], table: _Table) -> None:
        """Draw table ``t``'s initial weights (a row-sharded subclass draws its shard of the whole table's)."""
        rows = len(weight)
        bound = (1.0 / max(rows, 1)) ** 0.5   # uniform in +-sqrt(1/rows), as every table here; drawn in pieces
        with torch.no_grad():
            for start in range(0, rows, INIT_ROWS):
                weight[start:start + INIT_ROWS].uniform_(-bound, bound)
                if accumulator is not None:
                    accumulator[start:start + INIT_ROWS].zero_()   # MLPerf's initial accumulator value 0
                table.release()

    def release_pages(self) -> None:
        """Drop the file pages this process has mapped."""
        self.pages.release()

    def after_step(self) -> None:
        """Call after each step: drops the mapped file pages once they pass the limit (the resident set stays
        bounded; hot pages stay mapped until then)."""
        self.pages.maybe_release()

    def flush(self) -> None:
        """Write the files' dirty pages now (the kernel does it anyway)."""
        for table_file in self.files:
            table_file.flush()

    def close(self) -> None:
        """Release the storage (its lock and journal); the instance must not be used afterwards."""
        if self.journal is not None:
            self.journal.close()
        if self.storage_dir is not None:
            self.lock.release()

    def _check_ids(self, ids: torch.Tensor, t: int, padded: bool) -> None:
        if ids.numel() == 0:
            return
        low, high = int(ids.min()), int(ids.max())
        if high >= self.table_sizes[t] or low < (-1 if padded else 0):
            bad = high if high >= self.table_sizes[t] else low
            raise IndexError(f"categorical feature {t}: id {bad} outside its table of {self.table_sizes[t]} rows")

    def lookup(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (valid, >= 0) of table ``t``; when gradients are on, they are updated in the backward pass
        (and journaled now: every lookup whose rows a step may change must come through here)."""
        table = self.tables[t]
        if torch.is_grad_enabled() and table.weight.requires_grad:
            self.journal_rows(t, ids)
            return _LookupFusedUpdate.apply(table.weight, ids, self, table)
        return gather_rows(table.weight, ids, table)   # evaluation too drops the pages it maps

    _rows = lookup

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        self.layout.check_width(categorical)
        columns = []
        for t, (lo, hi) in enumerate(self.layout.bounds):
            ids = categorical[:, lo:hi]
            self._check_ids(ids, t, padded=hi - lo > 1)
            if hi - lo == 1:
                columns.append(self.lookup(t, ids.reshape(-1)))
                continue
            values, offsets = bag_offsets(ids)
            bag_of = torch.repeat_interleave(torch.arange(len(ids)), (ids >= 0).sum(1))
            rows = self.lookup(t, values)
            columns.append(rows.new_zeros(len(ids), self.embedding_dim).index_add(0, bag_of, rows))   # sum pooling
        return torch.stack(columns, dim=1)

    def table_weights(self) -> List[torch.Tensor]:
        return [table.weight for table in self.tables]

    # ------------------------------------------------------------------------------------------- the undo journal
    def _reset_journal_state(self) -> None:
        """No row journaled in this generation: a new journal is started at the first change."""
        if self.journal is not None:
            self.journal.close()
        self.journal = None
        # np.zeros maps untouched pages lazily: a table's bitmap costs RAM only for the pages of rows touched
        self.journaled = [np.zeros(n, dtype=bool) if f else None for n, f in zip(self.table_sizes, self.in_files)]
        self._pending: List[Tuple[int, np.ndarray]] = []

    def journal_rows(self, t: int, ids: torch.Tensor) -> None:
        """Queue the current bytes of the rows of table ``t`` (and its accumulator) at ``ids`` that this generation
        has not journaled yet; :meth:`sync_journal` writes them. Tables in RAM are saved whole by checkpoints."""
        if not self.in_files[t] or ids.numel() == 0:
            return
        if not self.writable:
            raise TableStorageError(
                f"{self.storage_dir}: holds the tables of checkpoint generation {self.generation} of an earlier run "
                f"(or one being written); training from fresh weights would overwrite them: resume it with "
                f"--load_checkpoint_path, or give this run a new --embedding_storage_dir")
        unique = torch.unique(ids).numpy()
        fresh = unique[~self.journaled[t][unique]]
        if not len(fresh):
            return
        if self.journal is None:
            self.journal = UndoJournal(self.storage_dir, self.generation)
        for start in range(0, len(fresh), CHUNK_IDS):
            rows = fresh[start:start + CHUNK_IDS]
            for index, table_file in self.table_files[t]:
                self.journal.add(index, rows, table_file.tensor.index_select(0, torch.from_numpy(rows)).numpy())
            self.tables[t].release()
        self._pending.append((t, fresh))

    def sync_journal(self) -> None:
        """Write and fsync the queued journal records (one fsync per step): call before changing any row."""
        pending, self._pending = self._pending, []   # on a failure their records are dropped: not journaled
        if self.journal is not None:
            self.journal.sync()
        for t, rows in pending:
            self.journaled[t][rows] = True

    def changed_rows_finite(self) -> torch.Tensor:
        """Whether every row changed since the last checkpoint, and every table in RAM, is finite (rows unchanged
        since were checked by that checkpoint): a check without reading the tables in files."""
        flags = [torch.ones((), dtype=torch.bool)]
        for t, table in enumerate(self.tables):
            if not self.in_files[t]:   # in row blocks: isfinite of a whole table makes temporaries of its size
                rows = max(1, FINITE_CHECK_ELEMENTS // max(1, self.embedding_dim))
                flags += [torch.isfinite(block).all() for tensor in self._tensors(t) for block in tensor.split(rows)]
                continue
            changed = torch.from_numpy(np.flatnonzero(self.journaled[t]))
            for start in range(0, len(changed), CHUNK_IDS):
                rows = changed[start:start + CHUNK_IDS]
                flags += [torch.isfinite(tensor.index_select(0, rows)).all() for tensor in self._tensors(t)]
                table.release()
        return torch.stack(flags).all()

    def _tensors(self, t: int) -> List[torch.Tensor]:
        table = self.tables[t]
        return [table.weight.detach()] + ([table.adagrad_sum] if self.adagrad else [])

    # ------------------------------------------------------------------------------------------------ checkpoints
    def prepare_commit(self, generation: int) -> Dict[str, Any]:
        """Before checkpoint ``generation`` is written: the table files on disk, the tables in RAM written as files of
        that generation, the manifest marking it prepared. Returns the checkpoint's record of this storage (a
        failure raises :class:`TableStorageError` naming the file; the last checkpoint stays whole)."""
        self._require_storage("prepare a checkpoint")
        if not self.writable:
            raise TableStorageError(f"{self.storage_dir}: not restored to a checkpoint's generation: nothing to save")
        if generation <= self.generation:
            raise ValueError(f"{self.storage_dir}: generation {generation} is not after the committed "
                             f"{self.generation}")
        for table_file in self.files:
            table_file.sync()
        for t, in_file in enumerate(self.in_files):
            if not in_file:
                for name, tensor in zip(("table", "adagrad_sum"), self._tensors(t)):
                    _write_table(generation_file(self.storage_dir, name, t, generation), tensor)
        token = uuid.uuid4().hex   # tells this generation from another run's of the same number
        self.manifest["prepared"] = {"generation": int(generation), "token": token}
        write_manifest(self.storage_dir, self.manifest)
        return {"storage_dir": self.storage_dir, "generation": int(generation), "token": token,
                "table_sizes": self.table_sizes, "embedding_dim": self.embedding_dim, "in_files": self.in_files,
                "adagrad": self.adagrad,
                "row_offsets": list(self.row_offsets) if self.row_offsets is not None else [0] * len(self.table_sizes),
                "global_table_sizes": list(self.global_table_sizes or self.table_sizes)}

    def commit(self, generation: int) -> None:
        """After checkpoint ``generation`` is in place: make it the storage's committed generation (an atomic
        manifest write), then drop the undo journal and the files of older generations."""
        self._require_storage("commit a checkpoint")
        prepared = self.manifest.get("prepared")
        if not prepared or prepared["generation"] != generation:
            raise TableStorageError(f"{os.path.join(self.storage_dir, MANIFEST)}: generation {generation} was not "
                                    f"prepared (prepared: {prepared})")
        self.manifest.update(generation=int(generation), token=prepared["token"], prepared=None)
        write_manifest(self.storage_dir, self.manifest)
        self.generation = int(generation)
        self._reset_journal_state()
        self._remove_other_generations(keep=self.generation)
        self.writable = True

    def restore(self, generation: int, token: Optional[str] = None, checkpoint: str = "the checkpoint") -> None:
        """Bring the storage back to exactly ``generation`` (of ``token`` when given), before training or
        evaluating from checkpoint ``checkpoint``: undo the changes made since with the journal, or, when a crash
        fell between the checkpoint's rename and :meth:`commit`, complete the commit; then read the tables in RAM
        from that generation's files. Raises :class:`TableStorageError` when the storage cannot give it."""
        self._require_storage("restore a checkpoint")
        manifest = self.manifest
        prepared = manifest["prepared"] or {}
        if manifest["generation"] == generation and token in (None, manifest["token"]):
            self._roll_back(generation)
            if prepared:   # a checkpoint prepared after it is no longer what the files hold
                manifest["prepared"] = None
                write_manifest(self.storage_dir, manifest)
        elif prepared.get("generation") == generation and token in (None, prepared["token"]):
            self.commit(generation)   # the files were synced for it before its checkpoint appeared
        else:
            raise TableStorageError(
                f"{self.storage_dir}: {checkpoint} needs its tables at generation {generation}, the storage holds "
                f"generation {manifest['generation']}{_prepared_text(prepared)}: an older checkpoint, whose tables "
                f"were overwritten since (incremental checkpoints keep only the newest tables), or another run's; "
                f"resume from the newest checkpoint of the run that used this --embedding_storage_dir")
        self._load_ram_tables(generation)
        self._reset_journal_state()
        self._remove_other_generations(keep=generation)
        self.generation, self.writable = int(generation), True

    def check_overwritable(self, source: str) -> None:
        """Before loading tables from ``source`` (a checkpoint without a storage of its own) into this one: refuse
        when a checkpoint refers to this storage's tables."""
        if self.storage_dir is not None and not (self.generation == 0 and not self.manifest["prepared"]):
            raise TableStorageError(
                f"{self.storage_dir}: holds the tables of checkpoint generation {self.generation} of another run; "
                f"loading {source} into it would overwrite them: give a new --embedding_storage_dir")

    def _require_storage(self, what: str) -> None:
        if self.storage_dir is None:
            raise ValueError(f"cannot {what}: these tables have no --embedding_storage_dir")

    def _roll_back(self, generation: int) -> None:
        """Undo journal ``generation`` into the files (idempotent: a crash during it is repaired by running it
        again), sync them, then remove the journal."""
        path = journal_path(self.storage_dir, generation)
        if not os.path.exists(path):
            return
        for index, rows, old in journal_records(path, generation):
            table_file = _journaled_file(self.files, index, rows, old, self.embedding_dim, path)
            table_file.tensor.index_copy_(0, torch.from_numpy(rows.copy()),
                                          torch.from_numpy(old.copy()).view(torch.float32))
            table_file.release()
        for table_file in self.files:
            table_file.sync()
        remove_quietly(path)
        table_storage.fsync_directory(self.storage_dir)

    def _load_ram_tables(self, generation: int) -> None:
        for t, in_file in enumerate(self.in_files):
            if not in_file:
                for name, tensor in zip(("table", "adagrad_sum"), self._tensors(t)):
                    _read_table_into(generation_file(self.storage_dir, name, t, generation), tensor)

    def _remove_other_generations(self, keep: Optional[int]) -> None:
        """Remove the journals and RAM-table files of every generation but ``keep`` (None: all)."""
        for name in os.listdir(self.storage_dir):
            generation = _generation_of(name)
            if generation is not None and generation != keep:
                remove_quietly(os.path.join(self.storage_dir, name))


def _prepared_text(prepared: Dict[str, Any]) -> str:
    return f" (and prepared {prepared['generation']})" if prepared else ""


def _generation_of(name: str) -> Optional[int]:
    """The generation of a journal or RAM-table file name, else None."""
    if name.startswith(JOURNAL_PREFIX):
        number = name[len(JOURNAL_PREFIX):]
    elif ".gen" in name and name.endswith(".f32"):
        number = name[name.rindex(".gen") + 4:-4]
    else:
        return None
    return int(number) if number.isdigit() else None


def _journaled_file(files: Sequence[TableFile], index: int, rows: np.ndarray, old: np.ndarray, dim: int,
                    path: str) -> TableFile:
    """The table file a journal record belongs to, refusing a record that does not fit it (naming the journal)."""
    if index >= len(files) or old.shape[1] != dim * FLOAT_BYTES:
        raise TableStorageError(f"{path}: a record of table file {index} with {old.shape[1]}-byte rows does not "
                                f"belong to this storage's {len(files)} files of {dim * FLOAT_BYTES}-byte rows")
    rows_in_file = files[index].tensor.shape[0]
    if len(rows) and (rows.min() < 0 or rows.max() >= rows_in_file):
        raise TableStorageError(f"{path}: a record of rows outside {files[index].path} ({rows_in_file} rows)")
    return files[index]


def _write_table(path: str, tensor: torch.Tensor) -> None:
    """``tensor`` (float32 ``[rows, dim]``) as the file ``path``, atomically and durably; a failure (a full disk)
    leaves no file and raises naming it."""
    data = tensor.detach().contiguous().numpy()
    tmp = f"{path}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            step = max(1, (64 << 20) // max(1, data[:1].nbytes))   # 64 MiB pieces: no second copy of a big table
            for start in range(0, len(data), step):
                table_storage.write_at(fd, data[start:start + step].tobytes(), start * data[:1].nbytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as error:
        remove_quietly(tmp)
        raise table_storage.storage_failure(path, "cannot write the table", error) from None


def _check_table_file(path: str, rows: int, dim: int) -> None:
    """Refuse a missing or wrongly sized table file, naming it."""
    wanted = rows * dim * FLOAT_BYTES
    size = os.path.getsize(path) if os.path.exists(path) else None
    if size != wanted:
        raise TableStorageError(f"{path}: {'missing' if size is None else f'{size} bytes'}, a [{rows}, {dim}] "
                                f"float32 table needs {wanted} (truncated, deleted or another model's)")


def _read_table(path: str, rows: int, dim: int) -> torch.Tensor:
    """The ``[rows, dim]`` float32 table in file ``path``, refusing a missing or wrongly sized file (naming it)."""
    _check_table_file(path, rows, dim)
    return torch.from_numpy(np.fromfile(path, dtype=np.float32, count=rows * dim).reshape(rows, dim))


def _read_table_into(path: str, tensor: torch.Tensor) -> None:
    """Read the table file ``path`` straight into ``tensor`` (a contiguous float32 ``[rows, dim]`` table in RAM):
    no second copy of the table, which at resume would lift the resident set above the budget by the largest table
    kept in RAM (measured: 9.3 GB peak with a 6 GB budget)."""
    _check_table_file(path, *tensor.shape)
    with open(path, "rb") as f:
        f.readinto(memoryview(tensor.detach().numpy()).cast("B"))


# ------------------------------------------------------------------------------------ finding and reading storages
def find_tiered(core: nn.Module) -> Optional[TieredTableEmbeddings]:
    """The model's :class:`TieredTableEmbeddings`: ``core.embeddings``, or the ``local`` shard of a row-sharded
    wrapper of them; else None."""
    embeddings = getattr(core, "embeddings", None)
    if isinstance(embeddings, TieredTableEmbeddings):
        return embeddings
    local = getattr(embeddings, "local", None)
    return local if isinstance(local, TieredTableEmbeddings) else None


def read_checkpoint_tables(records: Sequence[Dict[str, Any]], checkpoint: str) -> Dict[str, torch.Tensor]:
    """The whole tables of a checkpoint kept in storages (its records, one per process), read without changing the
    storages: ``tables/<t>`` and, with Adagrad, ``tables/<t>/adagrad_sum``. For models without the storage
    (evaluation, serving): the changes made since the checkpoint are undone in the copy read, from the journal.
    Raises :class:`TableStorageError` when a storage is in use or holds another generation."""
    out: Dict[str, torch.Tensor] = {}
    for record in records:
        directory = record["storage_dir"]
        lock = StorageLock(directory, exclusive=False)
        try:
            shard = _read_shard(directory, record, checkpoint)
        finally:
            lock.release()
        dim = record["embedding_dim"]
        for (t, name), tensor in shard.items():
            key = f"tables/{t}" if name == "table" else f"tables/{t}/{name}"
            if key not in out:
                out[key] = torch.zeros(record["global_table_sizes"][t], dim)
            start = record["row_offsets"][t]
            out[key][start:start + len(tensor)] = tensor
    return out


def _read_shard(directory: str, record: Dict[str, Any], checkpoint: str) -> Dict[Tuple[int, str], torch.Tensor]:
    """One storage's tables at the record's generation, as ``{(table, name): tensor}``."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise TableStorageError(f"{directory}: no {MANIFEST}: the table storage of {checkpoint} is gone")
    identity = {field: record[field] for field in IDENTITY_FIELDS}
    if {field: manifest.get(field) for field in IDENTITY_FIELDS} != identity:
        raise TableStorageError(f"{os.path.join(directory, MANIFEST)}: holds other tables than {checkpoint} saved")
    generation, token = record["generation"], record["token"]
    prepared = manifest["prepared"] or {}
    committed = manifest["generation"] == generation and manifest["token"] == token
    if not committed and not (prepared.get("generation") == generation and prepared.get("token") == token):
        raise TableStorageError(f"{directory}: {checkpoint} needs its tables at generation {generation}, the storage "
                                f"holds generation {manifest['generation']}{_prepared_text(prepared)}: an older "
                                f"checkpoint, whose tables were overwritten since (incremental checkpoints keep only "
                                f"the newest tables)")
    dim, adagrad = record["embedding_dim"], record["adagrad"]
    shard, paths = {}, {}
    for t, in_file in enumerate(record["in_files"]):
        for name in ("table", "adagrad_sum") if adagrad else ("table",):
            paths[(t, name)] = os.path.join(directory, f"{name}_{t}.f32") if in_file else \
                generation_file(directory, name, t, generation)
            shard[(t, name)] = _read_table(paths[(t, name)], record["table_sizes"][t], dim)
    journal = journal_path(directory, generation)
    if committed and os.path.exists(journal):   # a run crashed after this checkpoint: undo its changes in the copy
        views = [_TableRead(shard[key], paths[key]) for key in _file_names(record["in_files"], adagrad)]
        for index, rows, old in journal_records(journal, generation):
            target = _journaled_file(views, index, rows, old, dim, journal).tensor
            target[torch.from_numpy(rows.copy())] = torch.from_numpy(old.copy()).view(torch.float32)
    return shard


class _TableRead:
    """A table file read into RAM, standing for the file when a journal record is checked and applied."""

    def __init__(self, tensor: torch.Tensor, path: str):
        self.tensor, self.path = tensor, path
