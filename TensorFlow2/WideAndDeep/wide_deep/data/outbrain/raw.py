"""The raw Outbrain Click Prediction CSVs (reference B.3): their columns, and the one reader every tool uses.

Files (``<name>.csv``, with a header row) and columns, as Kaggle publishes them:

    clicks_train          display_id, ad_id, clicked                      (one clicked ad per display)
    events                display_id, uuid, document_id, timestamp, platform, geo_location
    promoted_content      ad_id, document_id, campaign_id, advertiser_id  (document_id = the ad's landing page)
    documents_meta        document_id, source_id, publisher_id, publish_time ("2016-06-05 00:00:00", \\N = missing)
    documents_categories  document_id, category_id, confidence_level
    documents_topics      document_id, topic_id, confidence_level
    documents_entities    document_id, entity_id (32 hex characters), confidence_level

``timestamp`` is milliseconds after ``features.TIMESTAMP_DELTA_MS``; ``platform`` is 1, 2, 3 (``\\N`` in a few
rows); ``geo_location`` is ``country>state>DMA`` (or shorter, or ``--``). Extra columns are ignored.

:func:`read_raw_table` reads one file; :func:`coerce_raw_frame` is the part that checks and types the columns, so
frames from elsewhere (:func:`read_joined_sample`: the project's real clicks-joined-events rows) go through the same
code. Both raise :class:`RawInputError` naming the file, the column and, for a bad value, the row.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np
import pandas as pd

from recsys_common.cli import InputError

from . import features as F

# name -> {column: kind}; kinds: "int" (int64, required), "int?" (int64 that may be missing -> float64 NaN),
# "float", "float?" (float64, may be missing), "str", "str?" (object; missing -> None).
RAW_SCHEMAS: Dict[str, Dict[str, str]] = {
    "clicks_train": {"display_id": "int", "ad_id": "int", "clicked": "int"},
    "events": {"display_id": "int", "uuid": "str", "document_id": "int", "timestamp": "int", "platform": "float?",
               "geo_location": "str?"},
    "promoted_content": {"ad_id": "int", "document_id": "int", "campaign_id": "int", "advertiser_id": "int"},
    "documents_meta": {"document_id": "int", "source_id": "int?", "publisher_id": "int?", "publish_time": "str?"},
    "documents_categories": {"document_id": "int", "category_id": "int", "confidence_level": "float"},
    "documents_topics": {"document_id": "int", "topic_id": "int", "confidence_level": "float"},
    "documents_entities": {"document_id": "int", "entity_id": "str", "confidence_level": "float"},
}
RAW_FILES: List[str] = list(RAW_SCHEMAS)
NA_VALUES = ["\\N", ""]


class RawInputError(InputError):
    """A raw Outbrain file that is missing or does not have the expected columns and values."""


class EmptySplitError(RawInputError):
    """The raw data leave the training or the validation set without rows."""


def raw_path(input_dir: str, name: str) -> str:
    return os.path.join(input_dir, f"{name}.csv")


def check_raw_files(input_dir: str) -> None:
    """Fail fast (before any work) on a missing file or column among the seven raw files."""
    if not os.path.isdir(input_dir):
        raise RawInputError(f"{input_dir}: raw Outbrain input directory not found")
    for name, schema in RAW_SCHEMAS.items():
        path = raw_path(input_dir, name)
        if not os.path.isfile(path):
            raise RawInputError(f"{path}: missing raw Outbrain file {name}.csv (expected columns: "
                                f"{', '.join(schema)})")
        try:
            header = list(pd.read_csv(path, nrows=0).columns)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
            raise RawInputError(f"{path}: cannot read the header of {name}.csv ({e}); expected columns: "
                                f"{', '.join(schema)}") from None
        _check_columns(path, name, header)


def _check_columns(origin: str, name: str, columns: List[str]) -> None:
    missing = [c for c in RAW_SCHEMAS[name] if c not in columns]
    if missing:
        raise RawInputError(f"{origin}: {name} is missing column {missing[0]!r}"
                            f"{' (and ' + ', '.join(map(repr, missing[1:])) + ')' if missing[1:] else ''}; "
                            f"has {', '.join(map(repr, columns))}; expected {', '.join(RAW_SCHEMAS[name])}")


def coerce_raw_frame(name: str, df: pd.DataFrame, origin: str, row_offset: int = 0) -> pd.DataFrame:
    """Check ``df`` against ``RAW_SCHEMAS[name]`` and return its schema columns, typed.

    ``origin`` names the data in errors (a file path). A value that does not parse raises :class:`RawInputError`
    with the column and the 1-based data row (the header is row 0); ``row_offset``: data rows before ``df`` in the
    file (for a chunk of it).
    """
    if name not in RAW_SCHEMAS:
        raise ValueError(f"unknown raw Outbrain table {name!r} (known: {', '.join(RAW_SCHEMAS)})")
    _check_columns(origin, name, list(df.columns))
    out = {}
    for column, kind in RAW_SCHEMAS[name].items():
        values = df[column]
        allow_missing = kind.endswith("?")
        base = kind.rstrip("?")
        if base == "str":
            col = values.astype(object).where(values.notna(), None)
            if not allow_missing and col.isna().any():
                row = int(np.flatnonzero(col.isna().to_numpy())[0]) + 1 + row_offset
                raise RawInputError(f"{origin}: row {row}, column {column!r}: missing value ({name} requires one)")
            out[column] = col.map(lambda v: v if v is None else str(v))
            continue
        converted = pd.to_numeric(values, errors="coerce")
        bad = converted.isna() & (values.notna() if allow_missing else True)
        if base == "int":
            # A float such as 3.0 (pandas' spelling of an int column with gaps) is accepted; 3.5 is not.
            frac = converted.notna() & (converted != np.floor(converted.fillna(0)))
            bad = bad | frac
        if bool(np.any(bad)):
            row = int(np.flatnonzero(np.asarray(bad))[0])
            if pd.isna(values.iloc[row]):   # empty, \N, or absent (a short, e.g. truncated, line)
                raise RawInputError(f"{origin}: row {row + 1 + row_offset}, column {column!r}: missing value "
                                    f"({name} requires one; a line cut short, as at the end of a truncated file, "
                                    f"also reads so)")
            raise RawInputError(f"{origin}: row {row + 1 + row_offset}, column {column!r}: cannot read "
                                f"{values.iloc[row]!r} as "
                                f"{'an integer' if base == 'int' else 'a number'}"
                                f"{' (or missing: ' + repr(NA_VALUES) + ')' if allow_missing else ''}")
        if base == "int" and not allow_missing:
            out[column] = converted.astype(np.int64)
        else:
            out[column] = converted.astype(np.float64)
    return pd.DataFrame(out, index=df.index).reset_index(drop=True)


def read_raw_table(input_dir: str, name: str) -> pd.DataFrame:
    """Read ``<input_dir>/<name>.csv`` into a typed frame (see :func:`coerce_raw_frame`)."""
    path = raw_path(input_dir, name)
    if not os.path.isfile(path):
        raise RawInputError(f"{path}: missing raw Outbrain file {name}.csv (expected columns: "
                            f"{', '.join(RAW_SCHEMAS[name])})")
    schema = RAW_SCHEMAS[name]
    try:
        header = list(pd.read_csv(path, nrows=0).columns)
        _check_columns(path, name, header)
        # Read as text, then type each column: a bad value is then reported with its column and row.
        df = pd.read_csv(path, usecols=list(schema), dtype=str, na_values=NA_VALUES, keep_default_na=False)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise RawInputError(f"{path}: cannot parse {name}.csv: {e}") from None
    return coerce_raw_frame(name, df, path)


def read_raw_tables(input_dir: str) -> Dict[str, pd.DataFrame]:
    """All seven raw tables, checked (missing file or column first, before reading any data)."""
    check_raw_files(input_dir)
    return {name: read_raw_table(input_dir, name) for name in RAW_FILES}


def read_joined_sample(path: str) -> Dict[str, pd.DataFrame]:
    """The real rows of ``clicks-joined-events-sample.csv`` as raw ``clicks_train`` and ``events`` frames.

    That file is ``clicks_train`` joined with ``events``, with the timestamp written as a datetime
    (``timestamp_view``) and platform as a float; this undoes both and passes the frames through
    :func:`coerce_raw_frame`, so they are typed exactly like the CSVs.
    """
    try:
        joined = pd.read_csv(path, dtype=str, na_values=NA_VALUES, keep_default_na=False)
    except (FileNotFoundError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise RawInputError(f"{path}: cannot read the joined Outbrain sample: {e}") from None
    for column in ("display_id", "ad_id", "clicked", "uuid", "document_id", "timestamp_view", "platform",
                   "geo_location"):
        if column not in joined.columns:
            raise RawInputError(f"{path}: joined sample is missing column {column!r}")
    view = pd.to_datetime(joined["timestamp_view"], errors="coerce")
    if view.isna().any():
        row = int(np.flatnonzero(view.isna().to_numpy())[0]) + 1
        raise RawInputError(f"{path}: row {row}, column 'timestamp_view': not a datetime")
    epoch_ms = (view - pd.Timestamp("1970-01-01")) // pd.Timedelta(milliseconds=1)
    events = joined.drop_duplicates("display_id").copy()
    events["timestamp"] = (epoch_ms.loc[events.index] - F.TIMESTAMP_DELTA_MS).astype(str)
    clicks = coerce_raw_frame("clicks_train", joined, path)
    events = coerce_raw_frame("events", events, path)
    return {"clicks_train": clicks, "events": events}


# ------------------------------------------------------------------------------------------------ streamed reading
# Bytes of CSV parsed per block: about 1.5 to 4M rows of the narrow Outbrain files, a few hundred MB once typed.
DEFAULT_BLOCK_BYTES = 64 << 20
_ARROW_TYPES = {"int": "int64", "int?": "float64", "float": "float64", "float?": "float64", "str": "string",
                "str?": "string"}


def _pandas_chunks(path: str, name: str, columns: List[str], chunk_rows: int, skip_rows: int):
    """The slow, exact path: text chunks typed by :func:`coerce_raw_frame` (errors name the file row)."""
    done = 0
    try:
        reader = pd.read_csv(path, usecols=list(RAW_SCHEMAS[name]), dtype=str, na_values=NA_VALUES,
                             keep_default_na=False, chunksize=chunk_rows)
        for chunk in reader:
            n = len(chunk)
            if done + n > skip_rows:
                frame = coerce_raw_frame(name, chunk, path, row_offset=done)
                yield frame.iloc[max(0, skip_rows - done):].reset_index(drop=True)[columns]
            done += n
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise RawInputError(f"{path}: cannot parse {name}.csv: {e}") from None


def _arrow_batches(input_dir: str, name: str, block_bytes: int = DEFAULT_BLOCK_BYTES):
    """``<input_dir>/<name>.csv`` as pyarrow record batches of ``block_bytes`` of text, columns typed by
    ``RAW_SCHEMAS`` (strings stay Arrow strings). Raises ``pyarrow.ArrowInvalid`` at the first block with a value it
    cannot convert or a missing required value (the callers locate it with the exact text path)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    path = raw_path(input_dir, name)
    if not os.path.isfile(path):
        raise RawInputError(f"{path}: missing raw Outbrain file {name}.csv (expected columns: "
                            f"{', '.join(RAW_SCHEMAS[name])})")
    schema = RAW_SCHEMAS[name]
    with open(path, "rb") as source:
        reader = pacsv.open_csv(
            source, read_options=pacsv.ReadOptions(block_size=block_bytes, use_threads=True),
            convert_options=pacsv.ConvertOptions(
                column_types={c: getattr(pa, _ARROW_TYPES[k])() for c, k in schema.items()},
                include_columns=list(schema), null_values=NA_VALUES, strings_can_be_null=True,
                quoted_strings_can_be_null=True))
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            for column, kind in schema.items():
                if not kind.endswith("?") and batch.column(column).null_count:
                    raise pa.ArrowInvalid(f"missing value in column {column!r}")   # located by the callers
            yield batch


def iter_raw_frames(input_dir: str, name: str, columns: Optional[List[str]] = None,
                    block_bytes: int = DEFAULT_BLOCK_BYTES,
                    on_block: Optional[Callable[[int, int, int], None]] = None) -> Iterator[pd.DataFrame]:
    """``<input_dir>/<name>.csv`` block by block, typed as :func:`read_raw_table` types it (ids int64, ids that may
    be missing float64 with NaN, strings object with None), never the whole file in memory.

    Parsed by pyarrow's streaming CSV reader with typed columns (no Python string per id). A block it cannot
    convert (a bad value, a missing required value, an integer written ``3.0``) sends the rest of the file through
    the exact text path of :func:`coerce_raw_frame`, so bad input fails with the same message naming file, row and
    column as before, and ``3.0`` is still read as 3. ``columns``: the schema columns to return (default all; the
    others are still checked). ``on_block(rows_done, bytes_done, file_bytes)`` after every block (``bytes_done``:
    blocks x ``block_bytes``, at most the file size).
    """
    import pyarrow as pa
    path = raw_path(input_dir, name)
    schema = RAW_SCHEMAS[name]
    columns = list(schema) if columns is None else list(columns)
    file_bytes = os.path.getsize(path) if os.path.isfile(path) else 0
    done, blocks = 0, 0
    try:
        for batch in _arrow_batches(input_dir, name, block_bytes):
            frame = batch.select(columns).to_pandas(split_blocks=True, self_destruct=True)
            for column in columns:
                if schema[column].startswith("str"):
                    frame[column] = frame[column].where(frame[column].notna(), None)
            done += len(frame)
            blocks += 1
            if on_block is not None:
                # Each block is block_bytes of the file (the reader reads ahead, so bytes read say less).
                on_block(done, min(file_bytes, blocks * block_bytes), file_bytes)
            yield frame
        return
    except pa.ArrowInvalid:
        pass   # fall through to the exact path from the first row not yet returned
    for frame in _pandas_chunks(path, name, columns, chunk_rows=1 << 20, skip_rows=done):
        done += len(frame)
        if on_block is not None:
            on_block(done, file_bytes, file_bytes)
        yield frame


def read_raw_table_streamed(input_dir: str, name: str, columns: Optional[List[str]] = None) -> pd.DataFrame:
    """A whole table through :func:`iter_raw_frames` (for the tables whose size is that of the catalogue of ads and
    documents, not that of the click log)."""
    frames = list(iter_raw_frames(input_dir, name, columns))
    if not frames:
        schema = RAW_SCHEMAS[name]
        cols = list(schema) if columns is None else columns
        return coerce_raw_frame(name, pd.DataFrame({c: pd.Series([], dtype=object) for c in schema}),
                                raw_path(input_dir, name))[cols]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def read_document_terms(input_dir: str, name: str, column: str):
    """A ``documents_{topics,entities,categories}`` file as three arrays: ``document_id`` (int64), the term as an
    int64 code and ``confidence_level`` (float64), one element per row in file order.

    Integer terms are their ids; string terms (``entity_id``) are their rank among the file's sorted distinct values
    (what :func:`wide_deep.data.outbrain.tables.document_tables` does with a frame). Read by pyarrow
    with typed columns and coded in Arrow (dictionary_encode, sort), so no Python string is made: for the 6.4M
    entity rows of the real-size generated catalogue, 19 s instead of 56 s (2026-11-25, AMD EPYC, load 11).
    A file pyarrow cannot type goes through :func:`read_raw_table_streamed`, whose errors name file, row and column.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    schema = RAW_SCHEMAS[name]
    if set(schema) != {"document_id", column, "confidence_level"}:
        raise ValueError(f"{name} is not a document-terms table with a {column!r} column")
    chunks = {c: [] for c in schema}
    try:
        for batch in _arrow_batches(input_dir, name):
            for c in schema:
                chunks[c].append(batch.column(c))
    except pa.ArrowInvalid:
        frame = read_raw_table_streamed(input_dir, name)   # raises the exact error (file, row, column)
        return frame_terms(frame, column)
    arrays = {c: pa.chunked_array(v, type=v[0].type) if v else None for c, v in chunks.items()}
    if arrays["document_id"] is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    terms = arrays[column]
    if schema[column].startswith("str"):
        # One hash pass (dictionary_encode), then the distinct values' sort order as their codes.
        encoded = terms.combine_chunks().dictionary_encode()
        order = pc.sort_indices(encoded.dictionary).to_numpy()
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        codes = rank[encoded.indices.to_numpy()]
    else:
        codes = terms.to_numpy().astype(np.int64)
    return (arrays["document_id"].to_numpy().astype(np.int64), codes,
            arrays["confidence_level"].to_numpy().astype(np.float64))


def frame_terms(frame: pd.DataFrame, column: str):
    if not pd.api.types.is_numeric_dtype(frame[column].dtype):   # object (pandas 1.5) or str (pandas 3) ids
        first_seen, uniques = pd.factorize(frame[column].astype(str), sort=False)
        rank = np.empty(len(uniques), dtype=np.int64)
        rank[np.argsort(uniques.to_numpy(dtype=object))] = np.arange(len(uniques))
        codes = rank[first_seen]
    else:
        codes = frame[column].to_numpy(np.int64)
    return (frame["document_id"].to_numpy(np.int64), codes, frame["confidence_level"].to_numpy(float))
