"""Transcoding: headerless CSV + a FeatureSpec -> parquet or NVIDIA's split_binary, with the completed spec.

The role of NVIDIA's ``transcode.py`` (the bring-your-own-data path). The input spec describes CSV chunks (files
relative to ``--input``); categorical features may say ``cardinality: auto``, which becomes ``max(value) + 1`` over
all mappings. The output spec (``--feature_spec_out``, written last) describes the new files:

split_binary (the DLRM recipes' format, NVIDIA's layout and constraints):
    ``<mapping>/numerical.bin`` float16, all features of the ``numerical`` channel(s) in channel order;
    ``<mapping>/label.bin`` bool (float32 if labels are not 0/1);
    ``<mapping>/<feature>.bin`` one per categorical, smallest of int8/int16/int32 holding the cardinality;
    any other feature its own ``<mapping>/<feature>.bin`` in its dtype.
    a multi-hot feature (``max_hotness`` h) stores h values per row, its ids then -1 padding.
parquet:
    ``<mapping>/part_0.parquet`` with one column per feature, dtypes as in the spec; multi-hot features are list
    columns; one row group per ``--chunk_size`` rows.

Multi-hot CSV cells are lists in one cell, as NVIDIA's ``gen_csv.py`` writes them: ``"[12, 5, 7]"`` (commas and/or
spaces between ids, ``[]`` for none). A cell that is not such a list, or holds more ids than the spec's
``max_hotness``, stops the run with an error naming the file, row and column; nothing is written.

Memory is bounded by ``--chunk_size``: every CSV file is streamed in blocks of at most that many rows (pyarrow's
incremental reader), twice when something must be known before the first byte is written (an ``auto`` cardinality,
which sets the split_binary id dtype, or whether the labels are 0/1), so no mapping is ever held whole.

    python -m recsys_common.transcode --input raw/ --feature_spec_in spec.yaml --output data/ --format split_binary
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .datasets import PAD, DatasetError, DatasetWriter, csv_column_types, is_multi_hot, parse_list_cells
from .feature_spec import AUTO, FeatureSpec, FeatureSpecError, is_categorical_channel, smallest_int_dtype
from .io import atomic_directory, check_output_directory
from .logger import Progress, log_to_stderr

FORMATS = ("split_binary", "parquet")
_BLOCK_BYTES_MAX = 1 << 26   # at most this many CSV bytes parsed at a time


def _file_stem(name: str) -> str:
    stem = name[:-4] if name.endswith(".bin") else name
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)


def _roles(spec: FeatureSpec):
    label = [f for ch, fs in spec.channel_spec.items() if "label" in ch.lower() for f in fs]
    categorical = [f for ch, fs in spec.channel_spec.items() if is_categorical_channel(ch) for f in fs]
    categorical += [f for f, m in spec.feature_spec.items() if "cardinality" in m and f not in categorical]
    numerical = [f for ch, fs in spec.channel_spec.items()
                 if not is_categorical_channel(ch) and "label" not in ch.lower() for f in fs if f not in categorical]
    other = [f for f in spec.feature_spec if f not in set(label + categorical + numerical)]
    return label, categorical, numerical, other


def _line_blocks(path: str, block_bytes: int) -> Iterator[Tuple[bytes, int]]:
    """``(whole lines, file offset after them)`` of about ``block_bytes`` each. Read here rather than by pyarrow's
    incremental reader, which reads ahead without bound (a 92 MiB file was read whole before its first batch came
    out). A row is a line: quoted cells must not contain newlines (numeric data and list cells never do)."""
    with open(path, "rb") as f:
        carry = b""
        while True:
            data = f.read(block_bytes)
            if not data:
                if carry.strip():
                    yield carry if carry.endswith(b"\n") else carry + b"\n", f.tell()
                return
            data = carry + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:       # a line longer than the block: read on
                carry = data
                continue
            carry = data[cut:]
            yield data[:cut], f.tell() - len(carry)


def _chunk_rows(spec: FeatureSpec, mapping: str, index: int, chunk: dict, chunk_size: int,
                features: Optional[Sequence[str]] = None, progress: Optional["_Progress"] = None
                ) -> Iterator[Dict[str, np.ndarray]]:
    """Blocks of at most ``chunk_size`` rows of one CSV chunk (its files in order): feature -> array in the spec's
    dtype, multi-hot features int64 ``[rows, max_hotness]`` padded with -1. Only ``features`` are converted (the rest
    are skipped). Memory: one block of lines (about ``chunk_size`` rows' worth of bytes) at a time."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    names = list(chunk["features"])
    wanted = names if features is None else [f for f in names if f in set(features)]
    types = csv_column_types(spec, names)
    read_types = {f: (types[f] if f in wanted else pa.string()) for f in names}
    block_bytes = None
    for rel in chunk["files"]:
        path = spec.resolve_file(rel)
        row = 0
        if block_bytes is None:   # about chunk_size rows per block, from the first line's length
            with open(path, "rb") as f:
                first = f.readline(1 << 20)
            block_bytes = int(min(max(len(first), 64) * 1.2 * chunk_size, _BLOCK_BYTES_MAX)) + (1 << 16)
        for lines, offset in _line_blocks(path, block_bytes):
            try:
                table = pacsv.read_csv(pa.py_buffer(lines),
                                       read_options=pacsv.ReadOptions(column_names=names, use_threads=False),
                                       convert_options=pacsv.ConvertOptions(column_types=read_types,
                                                                            include_columns=wanted or names[:1]))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                where = _locate_bad_value(lines, names, types, str(e), row)
                raise DatasetError(f"{path}: cannot read as headerless CSV with columns {names} (source_spec."
                                   f"{mapping}[{index}]) and dtypes { {f: str(t) for f, t in types.items()} }; "
                                   f"{where or f'in the lines after line {row}'}: {e}") from None
            for lo in range(0, table.num_rows, chunk_size):
                part = table.slice(lo, chunk_size)
                block = {}
                for f in wanted:
                    col = part.column(f).combine_chunks()
                    if is_multi_hot(spec, f):
                        block[f] = parse_list_cells(col, spec.max_hotness(f), path, f, row)
                    else:
                        if col.null_count:
                            bad = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                            raise DatasetError(f"{path}: line {row + bad + 1}, column {f!r}: empty value")
                        block[f] = col.to_numpy(zero_copy_only=False)
                block["__rows__"] = part.num_rows
                row += part.num_rows
                yield block
            if progress is not None:
                progress.update(path, offset)


def _locate_bad_value(lines: bytes, names: List[str], types: dict, message: str, first_row: int) -> Optional[str]:
    """``line N, column 'name' (value ...)`` of the value pyarrow could not convert (its message names only the
    column's number), found in the block of ``lines`` that starts at data row ``first_row``. Error path only."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    found = re.search(r"In CSV column #(\d+)", message)
    if not found or int(found.group(1)) >= len(names):
        return None
    name = names[int(found.group(1))]
    try:
        col = pacsv.read_csv(pa.py_buffer(lines), read_options=pacsv.ReadOptions(column_names=names),
                             convert_options=pacsv.ConvertOptions(column_types={f: pa.string() for f in names},
                                                                  include_columns=[name])).column(0)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return f"column {name!r}"
    for i, value in enumerate(col.to_pylist()):
        try:
            pc.cast(pa.array([value], pa.string()), types[name])
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return f"line {first_row + i + 1}, column {name!r} (value {value!r})"
    return f"column {name!r}"


def _rebatched(blocks: Iterator[Dict[str, np.ndarray]], size: int) -> Iterator[Dict[str, np.ndarray]]:
    """The same rows in blocks of exactly ``size`` rows (the last may be shorter)."""
    pending: List[Dict[str, np.ndarray]] = []
    held = 0
    for block in blocks:
        pending.append(block)
        held += block["__rows__"]
        while held >= size:
            merged = _merge(pending)
            yield _take(merged, 0, size)
            rest = _take(merged, size, held)
            held -= size
            pending = [rest] if held else []
    if held:
        yield _merge(pending)


def _take(block: Dict[str, np.ndarray], lo: int, hi: int) -> Dict[str, np.ndarray]:
    out = {f: v[lo:hi] for f, v in block.items() if f != "__rows__"}
    out["__rows__"] = hi - lo
    return out


def _merge(blocks: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    if len(blocks) == 1:
        return blocks[0]
    out = {f: np.concatenate([b[f] for b in blocks]) for f in blocks[0] if f != "__rows__"}
    out["__rows__"] = sum(b["__rows__"] for b in blocks)
    return out


def mapping_blocks(spec: FeatureSpec, mapping: str, chunk_size: int, features: Optional[Sequence[str]] = None,
                   progress: Optional["_Progress"] = None) -> Iterator[Dict[str, np.ndarray]]:
    """Row-aligned blocks of at most ``chunk_size`` rows of every CSV chunk of ``mapping``, zipped into one
    feature -> array dict per block; chunks that end at different rows are an error naming their files."""
    chunks = spec.source_spec[mapping]
    streams = []
    for i, chunk in enumerate(chunks):
        if features is not None and not set(chunk["features"]) & set(features) and streams:
            continue   # nothing wanted here, and another chunk already fixes the row count
        streams.append((chunk, _rebatched(_chunk_rows(spec, mapping, i, chunk, chunk_size, features, progress),
                                          chunk_size)))
    done = 0
    while True:
        parts = [(chunk, next(stream, None)) for chunk, stream in streams]
        ended = [chunk for chunk, part in parts if part is None]
        if len(ended) == len(parts):
            return
        counts = {part["__rows__"] for _, part in parts if part is not None}
        if ended or len(counts) > 1:
            listing = "; ".join(f"{', '.join(c['files'])}: {done + (p['__rows__'] if p else 0)}+ rows"
                                for c, p in parts)
            raise DatasetError(f"{spec.origin}: the CSV chunks of mapping {mapping!r} hold different numbers of rows "
                               f"(from row {done}: {listing}); every chunk of a mapping must hold the same rows")
        block = {f: v for _, part in parts for f, v in part.items() if f != "__rows__"}
        done += counts.pop()
        yield block


class _Progress:
    """One line every few seconds on stderr (``recsys_common.logger.Progress``): MiB of CSV read of the total,
    MiB/s, time left; the position is tracked per file, as the files are read one after another."""

    def __init__(self, what: str, total_bytes: int, every_s: float = 5.0):
        self.positions: Dict[str, int] = {}
        self.meter = Progress(f"[transcode] {what}, CSV read", max(total_bytes, 1), unit="MiB", every=every_s,
                              out=log_to_stderr, scale=2 ** 20, digits=1)

    def update(self, path: str, position: int) -> None:
        self.positions[path] = position
        self.meter.set(sum(self.positions.values()))


class _Stats:
    """What the first pass learns: the largest and smallest id of each categorical, whether labels are 0/1."""

    def __init__(self, categorical: Sequence[str], label: Sequence[str]):
        self.high = {f: -1 for f in categorical}
        self.low = {f: 0 for f in categorical}
        self.label = list(label)
        self.labels_binary = True

    def add(self, block: Dict[str, np.ndarray]) -> None:
        for f in self.high:
            v = block.get(f)
            if v is None or not v.size:
                continue
            valid = v[v != PAD] if v.ndim == 2 else v
            if valid.size:
                self.high[f] = max(self.high[f], int(valid.max()))
                self.low[f] = min(self.low[f], int(valid.min()))
        for f in self.label:
            if self.labels_binary and f in block and not np.isin(block[f], (0, 1)).all():
                self.labels_binary = False


def completed_spec(spec_in: FeatureSpec, stats: "_Stats", fmt: str, output_dir: str) -> FeatureSpec:
    """The output spec: cardinalities filled in, dtypes and source_spec for ``fmt``."""
    label, categorical, numerical, other = _roles(spec_in)
    out = spec_in.copy()
    out.base_directory = os.path.abspath(output_dir)
    for f in categorical:
        meta = out.feature_spec[f]
        if stats.low.get(f, 0) < 0:
            raise DatasetError(f"{spec_in.origin}: categorical feature {f!r} has negative value {stats.low[f]}; "
                               f"categorical values must be integers in [0, cardinality)")
        if meta.get("cardinality") == AUTO:
            meta["cardinality"] = stats.high[f] + 1 if stats.high.get(f, -1) >= 0 else 1
        if fmt == "split_binary":
            meta["dtype"] = smallest_int_dtype(int(meta["cardinality"]))
    if fmt == "split_binary":
        for f in numerical:
            out.feature_spec[f]["dtype"] = "float16"
        for f in label:
            out.feature_spec[f]["dtype"] = "bool" if stats.labels_binary else "float32"
    for f, meta in out.feature_spec.items():
        # An input spec without dtypes (NVIDIA's hand-written BYO specs): the output spec states the dtypes written.
        if meta.get("dtype") is None:
            meta["dtype"] = str(out.numpy_dtype(f))
    source_spec = {}
    for mapping in spec_in.source_spec:
        stored = set(spec_in.features_of_mapping(mapping))
        if fmt == "parquet":
            feats = [f for f in spec_in.feature_spec if f in stored]
            source_spec[mapping] = [{"type": "parquet", "features": feats, "files": [f"{mapping}/part_0.parquet"]}]
            continue
        chunks = []
        nums = [f for f in numerical if f in stored]
        if nums:
            chunks.append({"type": "split_binary", "features": nums, "files": [f"{mapping}/numerical.bin"]})
        for f in label:
            if f in stored:
                name = "label.bin" if len(label) == 1 else f"{_file_stem(f)}.bin"
                chunks.append({"type": "split_binary", "features": [f], "files": [f"{mapping}/{name}"]})
        for f in categorical + other:
            if f in stored:
                chunks.append({"type": "split_binary", "features": [f], "files": [f"{mapping}/{_file_stem(f)}.bin"]})
        source_spec[mapping] = chunks
    out.source_spec = source_spec
    return out


def _needs_first_pass(spec_in: FeatureSpec, fmt: str) -> bool:
    label, categorical, _, _ = _roles(spec_in)
    return fmt == "split_binary" and bool(label) or any(
        spec_in.feature_spec[f].get("cardinality") == AUTO for f in categorical)


def transcode(input_dir: str, spec_in_path: str, output_dir: str, fmt: str = "split_binary",
              spec_out_name: str = "feature_spec.yaml", chunk_size: int = 65536,
              overwrite: bool = False) -> FeatureSpec:
    """Convert every mapping, streaming ``chunk_size`` rows at a time; the completed spec appears last, over a
    complete set of files.

    ``output_dir`` may hold other files (even the input): a non-empty one is refused unless ``overwrite``, which
    replaces only this tool's earlier outputs there (``recsys_common.io.atomic_directory``).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r} (choose from {', '.join(FORMATS)})")
    if chunk_size < 1:
        raise ValueError(f"--chunk_size must be >= 1, got {chunk_size}")
    spec_in = FeatureSpec.from_yaml(spec_in_path, allow_auto=True)
    spec_in.base_directory = os.path.abspath(input_dir)
    spec_in.validate(check_files=True, allow_auto=True)
    for mapping, chunks in spec_in.source_spec.items():
        for i, chunk in enumerate(chunks):
            if chunk["type"] != "csv":
                raise FeatureSpecError(f"{spec_in_path}: source_spec.{mapping}[{i}].type is {chunk['type']!r}; "
                                       f"transcode reads csv chunks")
    label, categorical, _, _ = _roles(spec_in)
    if fmt == "split_binary":
        for f in categorical:
            if spec_in.max_hotness(f) > 1 and spec_in.feature_spec[f].get("dtype") not in (None, AUTO) \
                    and not np.issubdtype(spec_in.numpy_dtype(f), np.signedinteger):
                raise FeatureSpecError(f"{spec_in_path}: feature_spec.{f}.dtype is {spec_in.feature_spec[f]['dtype']};"
                                       f" a multi-hot feature needs a signed integer dtype (padding is -1)")
    # Read with cardinality checks off: 'auto' cardinalities are computed from these very values.
    reading = spec_in.copy()
    for meta in reading.feature_spec.values():
        if meta.get("cardinality") == AUTO:
            meta["cardinality"] = np.iinfo(np.int64).max
    check_output_directory(output_dir, overwrite)   # before reading the input, which may be long
    sizes = {m: sum(os.path.getsize(spec_in.resolve_file(r)) for c in spec_in.source_spec[m] for r in c["files"])
             for m in spec_in.source_spec}
    stats = _Stats(categorical, label)
    if _needs_first_pass(spec_in, fmt):
        for mapping in spec_in.source_spec:
            progress = _Progress(f"pass 1 (ids, labels) {mapping}", sizes[mapping])
            for block in mapping_blocks(reading, mapping, chunk_size, features=categorical + label,
                                        progress=progress):
                stats.add(block)
    with atomic_directory(output_dir, overwrite=overwrite, tool="recsys_common.transcode",
                          marker=os.path.normpath(spec_out_name)) as tmp_dir:
        out = completed_spec(spec_in, stats, fmt, tmp_dir)
        for mapping in spec_in.source_spec:
            progress = _Progress(f"writing {mapping}", sizes[mapping])
            with DatasetWriter(out, mapping) as writer:
                wrote = False
                for block in mapping_blocks(reading, mapping, chunk_size, progress=progress):
                    writer.write(block)
                    wrote = True
                if not wrote:   # an empty mapping still gets its (empty) files
                    writer.write({f: np.zeros((0, out.max_hotness(f)) if is_multi_hot(out, f) else 0,
                                              out.numpy_dtype(f)) for f in out.features_of_mapping(mapping)})
        out.to_yaml(os.path.join(tmp_dir, spec_out_name))
    out.base_directory = os.path.abspath(output_dir)
    out.origin = os.path.join(out.base_directory, spec_out_name)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recsys_common.transcode",
        description="Convert headerless CSV files described by a FeatureSpec into parquet or split_binary, "
                    "computing 'cardinality: auto' and writing the completed FeatureSpec.")
    p.add_argument("--input", required=True, help="directory the input spec's CSV file paths are relative to")
    p.add_argument("--feature_spec_in", default="feature_spec.yaml",
                   help="input FeatureSpec YAML; a relative name is looked up in --input (default feature_spec.yaml)")
    p.add_argument("--output", required=True,
                   help="output dataset directory: new or empty unless --overwrite (other files there are kept)")
    p.add_argument("--feature_spec_out", default="feature_spec.yaml",
                   help="name of the completed spec written in --output (default feature_spec.yaml)")
    p.add_argument("--format", choices=FORMATS, default="split_binary", help="output format (default split_binary)")
    p.add_argument("--chunk_size", type=int, default=65536,
                   help="rows read, converted and written per block; bounds memory (default 65536)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --output, replacing this tool's own earlier outputs there (other "
                        "files, such as the input, are kept; a name taken by another file is refused)")
    return p


def main(argv: Optional[Iterable[str]] = None) -> FeatureSpec:
    args = build_parser().parse_args(None if argv is None else list(argv))
    spec_path = args.feature_spec_in
    if not os.path.isabs(spec_path) and not os.path.exists(spec_path):
        spec_path = os.path.join(args.input, spec_path)
    out = transcode(args.input, spec_path, args.output, args.format, args.feature_spec_out, args.chunk_size,
                    args.overwrite)
    cards = {f: m["cardinality"] for f, m in out.feature_spec.items() if "cardinality" in m}
    print(f"wrote {out.origin} ({args.format}); cardinalities: {cards}")
    return out


# Bad input (a spec, a file's value, a non-empty --output): one error line and exit 2 (recsys_common.cli).
INPUT_ERRORS = (FeatureSpecError, DatasetError, FileExistsError, ValueError)

if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, input_errors=INPUT_ERRORS)
