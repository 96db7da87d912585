"""``--dataset_type tf_raw``: NVIDIA's split-binary layout (reference B.2), read per batch for only what a rank needs.

Each rank opens the files of its own tables (read for the whole global batch) and reads ``numerical.bin`` and
``label.bin`` only for its data-parallel row slice: one ``pread`` per file per batch into a fresh numpy buffer, no
whole-file loads. The other files are only ``stat``-ed, to check that every chunk holds the same number of rows.

Checks when opening (cheap, file sizes only): every file of the split exists; its size is a multiple of its
record size (``features x dtype size``), else it is truncated or of another dtype; all chunks hold the same rows,
else a listing of each file's row count names the odd one out. Per batch: ids in range, numericals finite
(see :mod:`.dataloader`).

Specs whose chunks are csv or parquet (bring-your-own data) are read whole into memory through
``recsys_common.datasets.read_columns`` (only the features this rank needs), then batched the same way.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from recsys_common.datasets import read_columns

from .pipeline import DataError, SpecPipeline

# Indirection so tests can count which files a rank opens.
_open_fd = os.open


class BinaryChunk:
    """Rows ``[start, stop)`` of one split-binary file holding ``features`` of one ``dtype``, row-major; a multi-hot
    feature takes ``max_hotness`` values of a record (ids, then -1 padding), so ``width`` is the sum of hotnesses."""

    def __init__(self, path: str, dtype: np.dtype, features: Sequence[str], num_rows: int,
                 width: Optional[int] = None):
        self.path, self.dtype, self.features = path, np.dtype(dtype), list(features)
        self.num_rows = num_rows
        self.width = len(self.features) if width is None else int(width)
        self.record_bytes = self.dtype.itemsize * self.width
        self._fd: Optional[int] = None

    def open(self) -> None:
        if self._fd is None:
            try:
                self._fd = _open_fd(self.path, os.O_RDONLY)
            except OSError as e:
                raise DataError(f"{self.path}: cannot open for features {self.features}: {e.strerror}") from None

    def read(self, start: int, stop: int) -> np.ndarray:
        self.open()
        rows = stop - start
        out = np.empty((rows, self.width), dtype=self.dtype)
        if rows:
            want = rows * self.record_bytes
            got = os.preadv(self._fd, [memoryview(out).cast("B")], start * self.record_bytes)
            if got != want:
                raise DataError(f"{self.path}: short read at row {start}: got {got} of {want} bytes (file truncated "
                                f"while training?)")
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class MemoryChunk:
    """Columns already in memory (csv/parquet chunks), same ``read`` interface as :class:`BinaryChunk`."""

    def __init__(self, path: str, columns: Dict[str, np.ndarray], features: Sequence[str]):
        self.path, self.features = path, list(features)
        self.columns = [columns[f] for f in self.features]
        self.num_rows = len(self.columns[0])

    def read(self, start: int, stop: int) -> np.ndarray:
        if len(self.columns) == 1 and self.columns[0].ndim == 2:
            return self.columns[0][start:stop]   # multi-hot, padded
        return np.stack([c[start:stop] for c in self.columns], axis=1)


def split_binary_chunks(spec, mapping: str) -> Tuple[Dict[str, Tuple[int, int]], List[dict], int]:
    """Check a split-binary mapping against its files (sizes only) and return
    ``(feature -> (chunk index, first column), chunk descriptions, rows)``; raises :class:`DataError` naming the file.
    A multi-hot feature spans ``max_hotness`` columns from its first one."""
    where: Dict[str, Tuple[int, int]] = {}
    chunks = []
    for i, chunk in enumerate(spec.source_spec[mapping]):
        path = spec.resolve_file(chunk["files"][0])
        features = list(chunk["features"])
        dtypes = {spec.numpy_dtype(f) for f in features}
        if len(dtypes) != 1:
            raise DataError(f"{path}: a split_binary chunk stores one dtype, but features {features} have "
                            f"{sorted(str(d) for d in dtypes)} in the spec")
        dtype = dtypes.pop()
        if not os.path.isfile(path):
            raise DataError(f"{path}: file of feature(s) {features} (source_spec.{mapping}[{i}] of {spec.origin}) "
                            f"not found")
        size = os.path.getsize(path)
        widths = [spec.max_hotness(f) for f in features]
        record = dtype.itemsize * sum(widths)
        if size % record:
            raise DataError(f"{path}: {size} bytes is not a multiple of the record size {record} "
                            f"({sum(widths)} x {dtype}) of feature(s) {features} (max_hotness {widths}): the file "
                            f"is truncated or its dtype is not the spec's")
        chunks.append({"path": path, "dtype": dtype, "features": features, "rows": size // record,
                       "width": sum(widths)})
        col = 0
        for f, w in zip(features, widths):
            where[f] = (i, col)
            col += w
    counts = {c["path"]: c["rows"] for c in chunks}
    if len(set(counts.values())) > 1:
        majority = max(set(counts.values()), key=list(counts.values()).count)
        odd = [f"{os.path.basename(p)}: {n} rows ({chunks[k]['features'][0]}... as {chunks[k]['dtype']})"
               for k, (p, n) in enumerate(counts.items()) if n != majority]
        raise DataError(f"{os.path.dirname(chunks[0]['path'])}: the files of split {mapping!r} disagree on the "
                        f"number of rows (most hold {majority}); odd ones: {'; '.join(odd)}. A file is truncated, "
                        f"or its dtype differs from {spec.origin}")
    return where, chunks, (chunks[0]["rows"] if chunks else 0)


class RawBinaryDataset(SpecPipeline):
    """One split of a split-binary (or csv/parquet) dataset; see the module docstring."""

    def __init__(self, spec, mapping: str, **kwargs):
        super().__init__(spec, mapping, **kwargs)
        types = {c["type"] for c in spec.source_spec[mapping]}
        stored = set(spec.features_of_mapping(mapping))
        missing = [f for f in self.metadata.categorical_features + self.metadata.numerical_features + [self.label]
                   if f not in stored]
        if missing:
            raise DataError(f"{spec.origin}: split {mapping!r} stores no file for feature(s) {missing}")
        self._set_input_tables_early()
        needed = self._needed_features()
        if types == {"split_binary"}:
            where, descriptions, self.num_rows = split_binary_chunks(spec, mapping)
            chunks = {}
            for f in needed:
                k = where[f][0]
                if k not in chunks:
                    d = descriptions[k]
                    chunks[k] = BinaryChunk(d["path"], d["dtype"], d["features"], d["rows"], d["width"])
                    chunks[k].open()   # fail now, not mid-epoch, on a file that cannot be read
            self._chunks = chunks
            self._where = {f: where[f] for f in needed}
        else:
            columns = read_columns(spec, mapping, features=sorted(needed), check_values=False)
            self._chunks, self._where = {}, {}
            for k, chunk in enumerate(spec.source_spec[mapping]):
                feats = [f for f in chunk["features"] if f in needed]
                if not feats:
                    continue
                # one MemoryChunk per feature keeps multi-hot columns (2-D) separate
                for f in feats:
                    key = (k, f)
                    self._chunks[key] = MemoryChunk(spec.resolve_file(chunk["files"][0]), columns, [f])
                    self._where[f] = (key, 0)
            self.num_rows = len(columns[self.label]) if self.label in columns else 0
        self._numerical_plan = self._plan(self.metadata.numerical_features)
        self._finish_init()

    # which features this rank reads: its tables, plus numericals and label (for its slice)
    def _set_input_tables_early(self) -> None:
        n_tables = self.metadata.num_tables
        if self._input_tables_arg is None:
            self._tables_needed = list(range(n_tables))
        else:
            self._tables_needed = sorted({int(t) for t, _ in self._input_tables_arg if 0 <= int(t) < n_tables})

    def _needed_features(self) -> set:
        cats = [self.metadata.categorical_features[t] for t in self._tables_needed]
        return set(cats) | set(self.metadata.numerical_features) | {self.label}

    def _plan(self, features: List[str]):
        """Group ``features`` by chunk: ``[(chunk key, [columns in chunk], [positions in output])]``."""
        plan: Dict = {}
        for pos, f in enumerate(features):
            key, col = self._where[f]
            plan.setdefault(key, ([], []))
            plan[key][0].append(col)
            plan[key][1].append(pos)
        return [(k, cols, pos) for k, (cols, pos) in plan.items()]

    @property
    def opened_files(self) -> List[str]:
        """Files this rank reads (tests assert a rank opens only its own tables' files)."""
        return sorted(c.path for c in self._chunks.values())

    def _source_of(self, feature: str) -> str:
        key = self._where.get(feature, (None,))[0]
        return self._chunks[key].path if key in self._chunks else self.name

    def _read_numerical(self, start, stop):
        n = len(self.metadata.numerical_features)
        if len(self._numerical_plan) == 1:
            key, cols, pos = self._numerical_plan[0]
            block = self._chunks[key].read(start, stop)
            if cols == list(range(block.shape[1])):
                return block   # NVIDIA layout: numerical.bin holds exactly the channel, in order
            return block[:, cols]
        out = np.empty((stop - start, n), dtype=np.float32)
        for key, cols, pos in self._numerical_plan:
            out[:, pos] = self._chunks[key].read(start, stop)[:, cols]
        return out

    def _read_labels(self, start, stop):
        key, col = self._where[self.label]
        return self._chunks[key].read(start, stop)[:, col]

    def _read_categorical(self, table, start, stop):
        key, col = self._where[self.metadata.categorical_features[table]]
        block = self._chunks[key].read(start, stop)
        hot = self.metadata.hotness[table]
        if hot > 1:   # padded [rows, max_hotness]: a MemoryChunk's one column, or columns col.. of a binary record
            return block if isinstance(self._chunks[key], MemoryChunk) else block[:, col:col + hot]
        return block[:, col]
