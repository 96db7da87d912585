"""Dataset readers and writers driven by a FeatureSpec: headerless CSV, parquet and NVIDIA's split_binary.

Data flow: files on disk (``source_spec``) -> feature columns -> channels (``channel_spec``) -> batches of numpy arrays.

    >>> import tempfile, numpy as np
    >>> from recsys_common.feature_spec import FeatureSpec
    >>> d = tempfile.mkdtemp()
    >>> spec = FeatureSpec.get_default_feature_spec(1, [5], base_directory=d)
    >>> with DatasetWriter(spec, "train") as w:
    ...     w.write({"num_0": np.ones(3), "cat_0.bin": np.array([0, 4, 2]), "label": np.array([1, 0, 1])})
    >>> [b["categorical"].ravel().tolist() for b in open_reader(spec, "train", batch_size=2)]
    [[0, 4], [2]]

split_binary layout (reference B.2): one file per chunk, rows stored back to back, each row the chunk's features in
order, all of one dtype (``label.bin`` bool, ``numerical.bin`` float16 x n, ``cat_<i>.bin`` int8/16/32). A multi-hot
feature (``max_hotness`` h > 1) takes h values of the row, its ids then -1 padding (static hotness, as HugeCTR's Raw
format), so a file stays fixed-record and a batch is one read.
CSV chunks are headerless with the chunk's features as columns; a multi-hot cell is a list in one cell, as NVIDIA's
``gen_csv.py`` writes it (``"[12, 5, 7]"``, quoted because of its commas; ``[]`` is an empty list). Parquet chunks hold
one column per feature (list columns for multi-hot features).

Batches are dicts ``channel -> array``: categorical channels int64 ``[B, n]``, other channels float32 ``[B, n]``,
a label channel (name containing "label") of one feature float32 ``[B]``. A channel holding a multi-hot feature yields a
list with one int64 ``[B, max_hotness]`` array per feature, padded with -1.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

from recsys_common.cli import InputError
from .feature_spec import FeatureSpec, FeatureSpecError, is_categorical_channel
from .io import _fsync_directory, _fsync_file, _temporary_sibling

PAD = -1


class DatasetError(InputError):
    """Data that does not match its FeatureSpec; the message names the file and the feature."""


# --------------------------------------------------------------------------------------------------- column sources
class _ChunkSource:
    """Random access to the rows of one chunk (possibly several files, concatenated in order)."""

    def __init__(self, spec: FeatureSpec, chunk: Dict[str, Any]):
        self.spec = spec
        self.features: List[str] = list(chunk["features"])
        self.files = [spec.resolve_file(f) for f in chunk["files"]]
        self.num_rows = 0

    def read(self, start: int, stop: int) -> Dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def read_rows(self, rows: np.ndarray) -> Dict[str, np.ndarray]:
        raise NotImplementedError


class _SplitBinarySource(_ChunkSource):
    def __init__(self, spec, chunk):
        super().__init__(spec, chunk)
        dtypes = {spec.numpy_dtype(f) for f in self.features}
        if len(dtypes) != 1:
            raise DatasetError(f"{self.files[0]}: a split_binary chunk stores one dtype, but features "
                               f"{self.features} have {sorted(str(d) for d in dtypes)}")
        self.dtype = dtypes.pop()
        self.widths = [spec.max_hotness(f) for f in self.features]   # values per row: 1, or max_hotness (multi-hot)
        if any(w > 1 for w in self.widths) and not np.issubdtype(self.dtype, np.signedinteger):
            raise DatasetError(f"{self.files[0]}: multi-hot features {self.features} need a signed integer dtype "
                               f"(padding is -1), got {self.dtype}")
        self.path = self.files[0]
        self.width = sum(self.widths)
        self.record_bytes = self.dtype.itemsize * self.width
        size = os.path.getsize(self.path)
        if size % self.record_bytes:
            raise DatasetError(f"{self.path}: file is truncated or not of this spec: {size} bytes is not a multiple of "
                               f"the record size {self.record_bytes} ({self.width} x {self.dtype}) for "
                               f"features {self.features} (max_hotness {self.widths})")
        self.num_rows = size // self.record_bytes
        self._memmap = None

    def _data(self) -> np.ndarray:
        if self._memmap is None:
            shape = (self.num_rows, self.width)
            self._memmap = (np.memmap(self.path, dtype=self.dtype, mode="r", shape=shape) if self.num_rows
                            else np.zeros(shape, self.dtype))
        return self._memmap

    def _split(self, block: np.ndarray) -> Dict[str, np.ndarray]:
        out, col = {}, 0
        for f, w in zip(self.features, self.widths):
            out[f] = block[:, col] if w == 1 else block[:, col:col + w]
            col += w
        return out

    def read(self, start, stop):
        return self._split(np.asarray(self._data()[start:stop]))

    def read_rows(self, rows):
        return self._split(np.asarray(self._data()[rows]))


class _InMemorySource(_ChunkSource):
    """CSV and parquet chunks are loaded whole on first use (BYO-sized data; Criteo-sized data is split_binary)."""

    def __init__(self, spec, chunk):
        super().__init__(spec, chunk)
        self._columns: Optional[Dict[str, np.ndarray]] = None
        self.num_rows = sum(self._count_rows(p) for p in self.files)

    def _columns_loaded(self) -> Dict[str, np.ndarray]:
        if self._columns is None:
            parts = [self._load(p) for p in self.files]
            self._columns = {f: _concat([p[f] for p in parts]) for f in self.features}
        return self._columns

    def read(self, start, stop):
        return {f: c[start:stop] for f, c in self._columns_loaded().items()}

    def read_rows(self, rows):
        return {f: c[rows] for f, c in self._columns_loaded().items()}


def _concat(arrays: List[np.ndarray]) -> np.ndarray:
    if len(arrays) == 1:
        return arrays[0]
    width = max(a.shape[1] for a in arrays) if arrays[0].ndim == 2 else None
    if width is not None:
        arrays = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=PAD) for a in arrays]
    return np.concatenate(arrays)


class _CsvSource(_InMemorySource):
    def _count_rows(self, path):
        with open(path, "rb") as f:
            data = f.read()
        if not data:
            return 0
        return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)

    def _load(self, path):
        import pyarrow as pa
        import pyarrow.csv as pacsv
        if os.path.getsize(path) == 0:
            return {f: (np.zeros((0, self.spec.max_hotness(f)), np.int64) if is_multi_hot(self.spec, f)
                        else np.zeros(0, self.spec.numpy_dtype(f))) for f in self.features}
        types = csv_column_types(self.spec, self.features)
        try:
            table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=self.features),
                                   convert_options=pacsv.ConvertOptions(column_types=types))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise DatasetError(f"{path}: cannot read as headerless CSV with columns {self.features} "
                               f"and dtypes { {f: str(t) for f, t in types.items()} }: {e}") from None
        return {f: (parse_list_cells(table.column(f), self.spec.max_hotness(f), path, f)
                    if is_multi_hot(self.spec, f) else table.column(f).to_numpy()) for f in self.features}


def is_multi_hot(spec: FeatureSpec, name: str) -> bool:
    """A feature whose values are lists: ``max_hotness`` given in the spec (even 1) or a ``multihot`` channel."""
    return "max_hotness" in (spec.feature_spec.get(name) or {}) or any(
        name in names for ch, names in spec.channel_spec.items() if "multihot" in ch)


def csv_column_types(spec: FeatureSpec, features: Sequence[str]) -> Dict[str, Any]:
    """pyarrow types to read CSV columns as: the spec's dtype, a string for a multi-hot (list) cell."""
    import pyarrow as pa
    return {f: pa.string() if is_multi_hot(spec, f) else pa.from_numpy_dtype(spec.numpy_dtype(f)) for f in features}


def format_list_cells(values: np.ndarray) -> List[str]:
    """Padded ``[n, h]`` ids (-1 = padding) -> CSV cells ``"[12, 5, 7]"`` (Python's list text, as NVIDIA's
    ``gen_csv.py`` writes them through pandas)."""
    return ["[" + ", ".join(str(v) for v in row[row != PAD]) + "]" for row in np.asarray(values)]


def parse_list_cells(cells: Any, max_hotness: int, path: str, feature: str, first_row: int = 0) -> np.ndarray:
    """CSV list cells (``"[1, 2, 3]"``, ``[1 2 3]``, ``[]``) -> int64 ``[n, max_hotness]`` padded with -1.

    Separators are commas and/or spaces (NVIDIA's ``transcode.py`` splits on both). A cell that is not a bracketed
    list of non-negative integers, or that holds more than ``max_hotness`` ids, raises :class:`DatasetError` naming
    ``path``, the line (``first_row`` + index + 1: a headerless file has one row per line) and the feature (column).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    arr = cells.combine_chunks() if isinstance(cells, pa.ChunkedArray) else pa.array(cells, type=pa.string())
    n = len(arr)
    out = np.full((n, max_hotness), PAD, dtype=np.int64)
    if n == 0:
        return out

    def fail(row: int, why: str):
        value = arr[row].as_py()
        raise DatasetError(f"{path}: line {first_row + row + 1}, column {feature!r}: {why}, got {value!r}")

    if arr.null_count:
        fail(int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0]), "empty cell; a multi-hot value is "
                                                                                     "a list such as \"[3, 7]\" or []")
    text = pc.utf8_trim_whitespace(arr)
    framed = pc.and_(pc.starts_with(text, "["), pc.ends_with(text, "]")).to_numpy(zero_copy_only=False)
    if not framed.all():
        fail(int(np.flatnonzero(~framed)[0]), "not a list of integers such as \"[3, 7]\"")
    inner = pc.utf8_slice_codeunits(text, 1, -1)
    tokens = pc.split_pattern_regex(inner, r"[\s,]+")
    flat = pc.list_flatten(tokens)
    parent = pc.list_parent_indices(tokens).to_numpy()
    keep = pc.not_equal(flat, "").to_numpy(zero_copy_only=False)
    flat, parent = pc.filter(flat, pa.array(keep)), parent[keep]
    ok = pc.match_substring_regex(flat, r"^[0-9]{1,18}$").to_numpy(zero_copy_only=False)
    if not ok.all():
        fail(int(parent[np.flatnonzero(~ok)[0]]), "not a list of non-negative integers")
    ids = pc.cast(flat, pa.int64()).to_numpy()
    lengths = np.bincount(parent, minlength=n)
    if lengths.max(initial=0) > max_hotness:
        row = int(np.flatnonzero(lengths > max_hotness)[0])
        fail(row, f"{int(lengths[row])} ids, more than the spec's max_hotness {max_hotness}")
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out[parent, np.arange(len(ids)) - starts[parent]] = ids
    return out


class _ParquetSource(_InMemorySource):
    def _count_rows(self, path):
        import pyarrow.parquet as pq
        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception as e:  # pyarrow raises several types for a corrupt file
            raise DatasetError(f"{path}: not a readable parquet file: {e}") from None

    def _load(self, path):
        import pyarrow.parquet as pq
        table = pq.read_table(path)
        missing = [f for f in self.features if f not in table.column_names]
        if missing:
            raise DatasetError(f"{path}: parquet file has no column(s) {missing} (has {table.column_names})")
        out = {}
        for f in self.features:
            col = table.column(f)
            if is_multi_hot(self.spec, f) or str(col.type).startswith("list"):
                out[f] = _lists_to_padded(col.to_pylist(), self.spec.max_hotness(f), path, f)
            else:
                out[f] = col.to_numpy()
        return out


def _lists_to_padded(values: List[Any], max_hotness: int, path: str, feature: str) -> np.ndarray:
    out = np.full((len(values), max_hotness), PAD, dtype=np.int64)
    for i, v in enumerate(values):
        v = [] if v is None else v
        if len(v) > max_hotness:
            raise DatasetError(f"{path}: row {i} of feature {feature!r} has {len(v)} values, "
                               f"more than max_hotness={max_hotness}")
        out[i, :len(v)] = v
    return out


_SOURCES = {"split_binary": _SplitBinarySource, "csv": _CsvSource, "parquet": _ParquetSource}


def _open_sources(spec: FeatureSpec, mapping: str) -> List[_ChunkSource]:
    try:
        spec.validate(check_files=True, mappings=[mapping])
    except FeatureSpecError:
        raise
    sources = []
    for chunk in spec.source_spec[mapping]:
        kind = chunk["type"]
        if kind not in _SOURCES:
            raise DatasetError(f"{spec.origin}: chunk type {kind!r} of mapping {mapping!r} is read by the recipe's "
                               f"own loader, not by recsys_common.datasets")
        sources.append(_SOURCES[kind](spec, chunk))
    counts = {s.files[0]: s.num_rows for s in sources}
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"{os.path.basename(p)}={n}" for p, n in counts.items())
        raise DatasetError(f"{spec.origin}: chunks of mapping {mapping!r} disagree on the number of rows "
                           f"({listing}); every chunk must hold the same rows")
    return sources


def _check_categorical(spec: FeatureSpec, name: str, values: np.ndarray, source_file: str, first_row: int) -> None:
    if values.size == 0:
        return
    card = spec.cardinality(name)
    valid = values[values != PAD] if values.ndim == 2 else values
    if valid.size == 0:
        return
    lo, hi = valid.min(), valid.max()
    if lo < 0 or hi >= card:
        flat = values.reshape(len(values), -1)
        bad = np.nonzero(((flat < 0) & (flat != PAD)) | (flat >= card))[0][0] if values.ndim == 2 else \
            np.nonzero((values < 0) | (values >= card))[0][0]
        value = values[bad]
        raise DatasetError(f"{source_file}: feature {name!r} row {first_row + int(bad)} has value {value} outside "
                           f"[0, cardinality={card})")


# --------------------------------------------------------------------------------------------------- reading
def read_columns(spec: FeatureSpec, mapping: str, features: Optional[Sequence[str]] = None,
                 check_values: bool = True) -> Dict[str, np.ndarray]:
    """Whole mapping in memory: feature -> array in its stored dtype (multi-hot: padded int64 2-D)."""
    sources = _open_sources(spec, mapping)
    wanted = set(features) if features is not None else None
    out = {}
    for s in sources:
        if wanted is not None and not wanted.intersection(s.features):
            continue
        cols = s.read(0, s.num_rows)
        for f, v in cols.items():
            if wanted is None or f in wanted:
                if check_values and "cardinality" in spec.feature_spec[f]:
                    _check_categorical(spec, f, v, s.files[0], 0)
                out[f] = np.array(v)
    return out


def iter_column_blocks(spec: FeatureSpec, mapping: str, block_rows: int,
                       check_values: bool = True) -> Iterator[Dict[str, np.ndarray]]:
    """The mapping's rows in order, ``block_rows`` at a time, as feature -> array in the stored dtype (multi-hot:
    padded int64 2-D): a whole mapping through bounded memory (split-binary files are memory-mapped; CSV and
    parquet chunks are read whole, as ``read_columns`` does)."""
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    sources = _open_sources(spec, mapping)
    total = sources[0].num_rows if sources else 0
    for start in range(0, total, block_rows):
        stop = min(start + block_rows, total)
        block: Dict[str, np.ndarray] = {}
        for source in sources:
            for name, values in source.read(start, stop).items():
                if check_values and "cardinality" in spec.feature_spec[name]:
                    _check_categorical(spec, name, values, source.files[0], start)
                block[name] = np.array(values)
        yield block


class BatchReader:
    """Iterates batches of one mapping; see module docstring for the batch layout.

    Args:
        spec: a validated FeatureSpec with ``base_directory`` set.
        mapping: ``source_spec`` key, e.g. ``"train"``.
        batch_size: rows per batch (this rank's batch).
        channels: channels to produce (default: every channel in ``channel_spec``).
        rank, world_size: batch ``i`` of the (shuffled) order goes to rank ``i % world_size``.
        shuffle, seed: shuffle the batch order with ``seed + epoch`` (call ``set_epoch`` each epoch).
        drop_last: drop the last partial batch.
        even_batches: give every rank the same number of batches (drops at most ``world_size - 1``), which
            collective training steps need.
        check_values: check categorical values against their cardinality on every batch.
    """

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, channels: Optional[Sequence[str]] = None,
                 rank: int = 0, world_size: int = 1, shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                 even_batches: bool = False, check_values: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.spec, self.mapping, self.batch_size = spec, mapping, batch_size
        self.rank, self.world_size = rank, world_size
        self.shuffle, self.seed, self.drop_last, self.even_batches = shuffle, seed, drop_last, even_batches
        self.check_values = check_values
        self.channels = list(channels) if channels is not None else list(spec.channel_spec)
        for ch in self.channels:
            if ch not in spec.channel_spec:
                raise FeatureSpecError(f"{spec.origin}: channel {ch!r} is not in channel_spec "
                                       f"(has: {', '.join(spec.channel_spec)})")
        self.sources = _open_sources(spec, mapping)
        self.num_samples = self.sources[0].num_rows if self.sources else 0
        needed = {f for ch in self.channels for f in spec.channel_spec[ch]}
        stored = set(spec.features_of_mapping(mapping))
        missing = sorted(needed - stored)
        if missing:
            raise FeatureSpecError(f"{spec.origin}: mapping {mapping!r} does not store feature(s) {missing} "
                                   f"needed by channels {self.channels}")
        self._sources_needed = [s for s in self.sources if needed.intersection(s.features)]
        self.epoch = 0

    @property
    def num_batches_total(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batch_order(self) -> np.ndarray:
        order = np.arange(self.num_batches_total)
        if self.shuffle:
            np.random.default_rng(self.seed + self.epoch).shuffle(order)
        if self.even_batches and self.world_size > 1:
            order = order[: len(order) - len(order) % self.world_size]
        return order[self.rank::self.world_size]

    def __len__(self) -> int:
        return len(self.batch_order())

    def read_batch(self, index: int) -> Dict[str, Any]:
        start = index * self.batch_size
        stop = min(start + self.batch_size, self.num_samples)
        columns = {}
        for s in self._sources_needed:
            for f, v in s.read(start, stop).items():
                if self.check_values and "cardinality" in self.spec.feature_spec[f]:
                    _check_categorical(self.spec, f, v, s.files[0], start)
                columns[f] = v
        return self._to_channels(columns)

    def _to_channels(self, columns: Dict[str, np.ndarray]) -> Dict[str, Any]:
        batch: Dict[str, Any] = {}
        for ch in self.channels:
            names = self.spec.channel_spec[ch]
            categorical = is_categorical_channel(ch)
            if any(self.spec.max_hotness(f) > 1 or columns[f].ndim == 2 for f in names):
                batch[ch] = [np.asarray(columns[f], np.int64).reshape(len(columns[f]), -1) for f in names]
                continue
            dtype = np.int64 if categorical else np.float32
            if not names:
                batch[ch] = np.zeros((self.batch_size, 0), dtype)
            elif len(names) == 1 and "label" in ch.lower():
                batch[ch] = np.asarray(columns[names[0]], dtype=dtype)
            else:
                batch[ch] = np.stack([np.asarray(columns[f], dtype=dtype) for f in names], axis=1)
        return batch

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for index in self.batch_order():
            yield self.read_batch(int(index))


def open_reader(spec: FeatureSpec, mapping: str, batch_size: int, **kwargs) -> BatchReader:
    """Open ``mapping`` of ``spec`` for batched reading; see :class:`BatchReader` for the arguments."""
    return BatchReader(spec, mapping, batch_size, **kwargs)


def count_rows(spec: FeatureSpec, mapping: str) -> int:
    """Rows of ``mapping`` without reading its values (split_binary: file sizes; csv/parquet: a row count), e.g. for
    choosing a batch size before the pipeline exists (:mod:`recsys_common.cpu_defaults`)."""
    sources = _open_sources(spec, mapping)
    return sources[0].num_rows if sources else 0


# --------------------------------------------------------------------------------------------------- writing
class DatasetWriter:
    """Writes the files of one mapping, appending blocks of rows; files appear only when the whole write succeeds.

    Each chunk must list exactly one file. Values are checked on the way in: categorical values in
    ``[0, cardinality)``, every value representable in the feature's dtype, all columns the same length.

        with DatasetWriter(spec, "train") as writer:
            for block in blocks:           # dict feature -> 1-D array (multi-hot: 2-D padded with -1)
                writer.write(block)
    """

    def __init__(self, spec: FeatureSpec, mapping: str, check_values: bool = True):
        spec.validate(mappings=[mapping])
        self.spec, self.mapping, self.check_values = spec, mapping, check_values
        self.chunks = spec.source_spec[mapping]
        for i, chunk in enumerate(self.chunks):
            if len(chunk["files"]) != 1:
                raise DatasetError(f"{spec.origin}: source_spec.{mapping}[{i}] lists {len(chunk['files'])} files; "
                                   f"the writer writes one file per chunk")
            if chunk["type"] not in _SOURCES:
                raise DatasetError(f"{spec.origin}: source_spec.{mapping}[{i}] has type {chunk['type']!r}, "
                                   f"which recsys_common cannot write")
        self.rows_written = 0
        self._targets: List[str] = []
        self._temps: List[str] = []
        self._handles: List[Any] = []
        self._open = False

    def __enter__(self) -> "DatasetWriter":
        for chunk in self.chunks:
            target = self.spec.resolve_file(chunk["files"][0])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = _temporary_sibling(target)
            self._targets.append(target)
            self._temps.append(tmp)
            self._handles.append(open(tmp, "wb") if chunk["type"] == "split_binary" else None)
        self._open = True
        return self

    def _coerce(self, name: str, values: Any, n: int) -> np.ndarray:
        arr = np.asarray(values)
        if len(arr) != n:
            raise DatasetError(f"{self.spec.origin}: column {name!r} has {len(arr)} rows, expected {n} "
                               f"(all columns of a block must have the same length)")
        dtype = self.spec.numpy_dtype(name)
        if self.check_values and "cardinality" in self.spec.feature_spec[name]:
            _check_categorical(self.spec, name, arr, self._target_of(name), self.rows_written)
        if np.issubdtype(dtype, np.integer) and arr.size:
            if not np.issubdtype(arr.dtype, np.integer) and not np.issubdtype(arr.dtype, np.bool_):
                if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
                    raise DatasetError(f"{self._target_of(name)}: feature {name!r} has non-integer values for "
                                       f"dtype {dtype}")
            info = np.iinfo(dtype)
            lo = arr[arr != PAD].min() if arr.ndim == 2 and (arr != PAD).any() else arr.min()
            if arr.max() > info.max or lo < info.min:
                raise DatasetError(f"{self._target_of(name)}: feature {name!r} has values in [{lo}, {arr.max()}], "
                                   f"outside dtype {dtype}")
        if arr.ndim == 2:
            return arr.astype(np.int64)
        return arr.astype(dtype)

    def _target_of(self, name: str) -> str:
        for chunk, target in zip(self.chunks, self._targets or [None] * len(self.chunks)):
            if name in chunk["features"]:
                return target or chunk["files"][0]
        return self.spec.origin

    def write(self, columns: Dict[str, Any]) -> None:
        if not self._open:
            raise RuntimeError("DatasetWriter.write called outside its 'with' block")
        needed = self.spec.features_of_mapping(self.mapping)
        missing = [f for f in needed if f not in columns]
        if missing:
            raise DatasetError(f"{self.spec.origin}: block for mapping {self.mapping!r} lacks feature(s) {missing}")
        n = len(np.asarray(columns[needed[0]]))
        for i, chunk in enumerate(self.chunks):
            arrays = [self._coerce(f, columns[f], n) for f in chunk["features"]]
            kind = chunk["type"]
            if kind == "split_binary":
                dtype = self.spec.numpy_dtype(chunk["features"][0])
                parts = []
                for f, a in zip(chunk["features"], arrays):
                    width = self.spec.max_hotness(f)
                    a = a.reshape(n, -1)
                    if a.shape[1] > width:
                        raise DatasetError(f"{self._targets[i]}: feature {f!r} has rows of {a.shape[1]} values, more "
                                           f"than its max_hotness {width}")
                    if a.shape[1] < width:   # static hotness: every row takes max_hotness values, -1 padded
                        a = np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=PAD)
                    # ids only: -1 is a valid value of a numerical feature (a float16/float32 chunk)
                    if width == 1 and np.issubdtype(np.dtype(dtype), np.integer) and (a == PAD).any():
                        # read back as a single-hot id, where -1 is no id
                        row = self.rows_written + int(np.flatnonzero(a[:, 0] == PAD)[0])
                        raise DatasetError(f"{self._targets[i]}: feature {f!r} row {row} has no id, but with "
                                           f"max_hotness 1 split_binary stores exactly one id per row; give the "
                                           f"feature max_hotness 2 or more to allow empty lists")
                    parts.append(a.astype(dtype, copy=False))
                block = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
                self._handles[i].write(np.ascontiguousarray(block).tobytes())
            elif kind == "csv":
                self._write_csv(i, chunk, arrays)
            else:
                self._write_parquet(i, chunk, arrays)
        self.rows_written += n

    def _arrow_table(self, chunk, arrays):
        import pyarrow as pa
        cols = []
        for a in arrays:
            if a.ndim == 2:
                cols.append(pa.array([row[row != PAD].tolist() for row in a], type=pa.list_(pa.int64())))
            else:
                cols.append(pa.array(a))
        return pa.Table.from_arrays(cols, names=list(chunk["features"]))

    def _write_csv(self, i, chunk, arrays):
        import pyarrow as pa
        import pyarrow.csv as pacsv
        # multi-hot values as list text in one cell, NVIDIA's gen_csv format (parse_list_cells reads it back)
        cols = [pa.array(format_list_cells(a), type=pa.string()) if a.ndim == 2 or is_multi_hot(self.spec, f)
                else pa.array(a) for f, a in zip(chunk["features"], arrays)]
        table = pa.Table.from_arrays(cols, names=list(chunk["features"]))
        if self._handles[i] is None:
            self._handles[i] = pacsv.CSVWriter(self._temps[i], table.schema,
                                               write_options=pacsv.WriteOptions(include_header=False))
        self._handles[i].write_table(table)

    def _write_parquet(self, i, chunk, arrays):
        import pyarrow.parquet as pq
        table = self._arrow_table(chunk, arrays)
        if self._handles[i] is None:
            self._handles[i] = pq.ParquetWriter(self._temps[i], table.schema)
        self._handles[i].write_table(table)

    def _close_handles(self) -> None:
        for h in self._handles:
            if h is not None:
                h.close()
        self._handles = [None] * len(self._handles)

    def __exit__(self, exc_type, exc, tb) -> None:
        self._open = False
        try:
            self._close_handles()
        finally:
            if exc_type is not None:
                for tmp in self._temps:
                    if os.path.exists(tmp):
                        os.remove(tmp)
                return
        if self.rows_written == 0:
            # An empty chunk still needs a well-formed file (parquet schema): write zero rows.
            for i, chunk in enumerate(self.chunks):
                if chunk["type"] == "parquet":
                    self._write_empty_parquet(i, chunk)
        for tmp, target in zip(self._temps, self._targets):
            _fsync_file(tmp)   # the data is on disk before a name points to it
            os.replace(tmp, target)
        for directory in sorted({os.path.dirname(t) for t in self._targets}):
            _fsync_directory(directory)

    def _write_empty_parquet(self, i, chunk):
        import pyarrow as pa
        import pyarrow.parquet as pq
        fields = [pa.field(f, pa.list_(pa.int64()) if is_multi_hot(self.spec, f)
                           else pa.from_numpy_dtype(self.spec.numpy_dtype(f))) for f in chunk["features"]]
        pq.write_table(pa.schema(fields).empty_table(), self._temps[i])


def write_columns(spec: FeatureSpec, mapping: str, columns: Dict[str, Any], block_rows: int = 1 << 20) -> int:
    """Write a whole in-memory mapping (in blocks). Returns the number of rows written."""
    names = spec.features_of_mapping(mapping)
    n = len(np.asarray(columns[names[0]])) if names else 0
    with DatasetWriter(spec, mapping) as writer:
        for start in range(0, max(n, 1), block_rows):
            writer.write({f: np.asarray(columns[f])[start:start + block_rows] for f in names})
    return n
