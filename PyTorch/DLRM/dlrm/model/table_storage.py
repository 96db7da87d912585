"""The bookkeeping of an ``--embedding_storage_dir``: its manifest, its lock and the undo journal that makes
checkpoints of the tables in files incremental.

The live table files ARE the newest checkpoint's tables plus the changes made since. Before a step changes a row
for the first time since the last checkpoint (its *generation*), the row's bytes go to ``journal.<generation>`` and
the journal is fsync'd, once per step, before any update can reach the mapped pages (the kernel writes dirty pages
back whenever it likes). Undoing the journal (rolling back, as SQLite's rollback journal does) gives the checkpoint's
tables back, after a crash at any point; a checkpoint then writes only what changed: the file pages the kernel has
not written yet, and the small tables kept in RAM. One row is journaled per first touch, not one page: ids drawn
from a power law touch a new cold row almost every time, and a page-granular journal would write a page per row.

    <storage>/tables.json            the manifest: the model's table shapes, the committed generation and its token,
                                     and the generation prepared for a checkpoint not yet committed
    <storage>/lock                   flock'd while a process uses the storage (holds its pid, for the error message)
    <storage>/table_<t>.f32          the tables in files, and their Adagrad accumulators (adagrad_sum_<t>.f32)
    <storage>/journal.<g>            undo records of the rows changed since generation g was committed
    <storage>/table_<t>.gen<g>.f32   the tables kept in RAM, as of generation g (written by each checkpoint)

Journal layout: a header (magic, version, generation), then records, each ``ROWS`` + the file's index, the row
count, the bytes per row, then the rows' indices (int64) and their old bytes, then a CRC32 of all of it. A record
cut short by a crash is ignored: its rows were never changed, since the fsync comes before the update.
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import struct
import zlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from recsys_common.io import atomic_path

MANIFEST = "tables.json"
LOCK = "lock"
JOURNAL_PREFIX = "journal."
IDENTITY_FIELDS = ("table_sizes", "embedding_dim", "in_files", "adagrad")   # what makes a storage this model's
_HEADER = struct.Struct("<8sIQ")   # magic, format version, generation
_RECORD = struct.Struct("<4sIIQ")  # b"ROWS", file index, bytes per row, row count
_CRC = struct.Struct("<I")
_MAGIC, _VERSION, _RECORD_MAGIC = b"DLRMUNDO", 1, b"ROWS"


class TableStorageError(OSError):
    """A table file that cannot be made or used (full disk, wrong size, foreign directory, a generation no
    checkpoint can have): names the file."""


def generation_file(directory: str, name: str, t: int, generation: int) -> str:
    """The file of a table kept in RAM (``name`` "table" or "adagrad_sum"), as of ``generation``."""
    return os.path.join(directory, f"{name}_{t}.gen{generation}.f32")


def journal_path(directory: str, generation: int) -> str:
    return os.path.join(directory, f"{JOURNAL_PREFIX}{generation}")


def write_at(fd: int, data: bytes, offset: int) -> None:
    """All of ``data`` at ``offset`` of ``fd`` (every write of the storage goes through here: tests make it fail)."""
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], offset + written)


def fsync_file(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        raise storage_failure(path, "cannot write the table to disk", error) from None


def fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def storage_failure(path: str, what: str, error: OSError) -> TableStorageError:
    return TableStorageError(f"{path}: {what} ({error.strerror or error})")


# ------------------------------------------------------------------------------------------------------ manifest
def read_manifest(directory: str) -> Optional[Dict[str, Any]]:
    """The storage's manifest, or None when it has none; a storage written before generations counts as 0."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except ValueError as error:
        raise TableStorageError(f"{path}: not a table storage manifest ({error})") from None
    manifest.setdefault("generation", 0)
    manifest.setdefault("token", None)
    manifest.setdefault("prepared", None)
    return manifest


def write_manifest(directory: str, manifest: Dict[str, Any]) -> None:
    """Atomically and durably (temporary file, fsync, rename, fsync of the directory)."""
    path = os.path.join(directory, MANIFEST)
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                json.dump(manifest, f)
    except OSError as error:
        raise storage_failure(path, "cannot write the storage manifest", error) from None


# ---------------------------------------------------------------------------------------------------------- lock
class StorageLock:
    """An ``flock`` on ``<storage>/lock``: exclusive for a process that trains or restores (one per storage), shared
    for readers (loading a checkpoint's tables into a model without files). Held until :meth:`release`, or until the
    object is collected."""

    def __init__(self, directory: str, exclusive: bool):
        self.path = os.path.join(directory, LOCK)
        self.fd: Optional[int] = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        try:
            try:
                fcntl.flock(self.fd, mode)
            except BlockingIOError:
                gc.collect()   # an instance of this process that is unreachable but not yet collected holds it
                fcntl.flock(self.fd, mode)
        except BlockingIOError:
            holder = self._holder()
            os.close(self.fd)
            self.fd = None
            raise TableStorageError(f"{self.path}: the table storage {directory} is in use by another process"
                                    f"{holder}; two runs cannot share an --embedding_storage_dir (wait for it to end, "
                                    f"or give this run its own)") from None
        if exclusive:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def _holder(self) -> str:
        text = os.pread(self.fd, 32, 0).decode(errors="replace").strip()
        return f" (pid {text})" if text.isdigit() else ""

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)   # closing the descriptor drops the flock
            self.fd = None

    def __del__(self):
        self.release()


# ------------------------------------------------------------------------------------------------------- journal
class UndoJournal:
    """``journal.<generation>``: :meth:`add` queues the old bytes of rows, :meth:`sync` writes them and fsyncs (a
    failure truncates the journal back to its last whole record and raises, naming it, before any row changed)."""

    def __init__(self, directory: str, generation: int):
        self.path = journal_path(directory, generation)
        self.pending: List[bytes] = []
        self.bytes_written = 0
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as error:
            raise storage_failure(self.path, "cannot create the undo journal", error) from None
        self.length = 0
        self._write(_HEADER.pack(_MAGIC, _VERSION, generation))
        try:
            fsync_directory(directory)   # the journal's existence is durable before any row changes
        except OSError as error:
            raise storage_failure(directory, "cannot fsync the storage directory", error) from None

    def add(self, file_index: int, rows: np.ndarray, old_bytes: np.ndarray) -> None:
        """Queue the current bytes ``old_bytes [len(rows), row_bytes]`` of ``rows`` of file ``file_index``."""
        old_bytes = np.ascontiguousarray(old_bytes).view(np.uint8).reshape(len(rows), -1)
        head = _RECORD.pack(_RECORD_MAGIC, file_index, old_bytes.shape[1], len(rows))
        body = np.ascontiguousarray(rows, dtype="<i8").tobytes() + old_bytes.tobytes()
        self.pending.append(head + body + _CRC.pack(zlib.crc32(body, zlib.crc32(head))))

    def sync(self) -> None:
        """Write the queued records and fsync: after it returns, their rows may change."""
        if not self.pending:
            return
        data, self.pending = b"".join(self.pending), []
        self._write(data)

    def _write(self, data: bytes) -> None:
        try:
            write_at(self.fd, data, self.length)
            os.fsync(self.fd)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.length)   # no torn record stays in front of later ones
            raise storage_failure(self.path, "cannot write the undo journal, so the step was not taken; free disk "
                                  "space and resume from the last checkpoint", error) from None
        self.length += len(data)
        self.bytes_written += len(data)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.pending = []

    def __del__(self):
        self.close()


def journal_records(path: str, generation: int) -> Iterator[Tuple[int, np.ndarray, np.ndarray]]:
    """The whole records of journal ``path`` (``(file index, rows, old bytes [rows, row_bytes] uint8)``), newest
    first, so that applying them in this order leaves each row's oldest bytes. Stops at a record cut short by a
    crash; a journal of another generation or a foreign file raises, naming it. Reads one record at a time (a
    journal may be larger than RAM): a first pass checks them, the second reads them back in reverse."""
    with open(path, "rb") as f:
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return   # cut short while being created: no row can have changed after it
        magic, version, saved_generation = _HEADER.unpack(header)
        if magic != _MAGIC or version != _VERSION or saved_generation != generation:
            raise TableStorageError(f"{path}: not the undo journal of generation {generation} (header {magic!r}, "
                                    f"version {version}, generation {saved_generation})")
        starts, size = [], os.fstat(f.fileno()).st_size
        while True:
            start = f.tell()
            if _read_record(f, size) is None:
                break
            starts.append(start)
        for start in reversed(starts):
            f.seek(start)
            yield _read_record(f, size)


def _read_record(f, size: int) -> Optional[Tuple[int, np.ndarray, np.ndarray]]:
    """The record at ``f``'s position, or None at the end or at a record cut short or damaged (``size``: the
    file's, so that a damaged count never makes it read past the end)."""
    head = f.read(_RECORD.size)
    if len(head) < _RECORD.size:
        return None
    magic, file_index, row_bytes, count = _RECORD.unpack(head)
    if magic != _RECORD_MAGIC or f.tell() + count * (8 + row_bytes) + _CRC.size > size:
        return None
    body = f.read(count * (8 + row_bytes))
    tail = f.read(_CRC.size)
    if _CRC.unpack(tail)[0] != zlib.crc32(body, zlib.crc32(head)):
        return None
    rows = np.frombuffer(body, dtype="<i8", count=count)
    old = np.frombuffer(body, dtype=np.uint8, offset=8 * count).reshape(count, row_bytes)
    return file_index, rows, old


def remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
