"""Stage 1 of the Outbrain ETL out of core: the joins and the train/valid split, display range by display range.

:func:`wide_deep.data.outbrain.tables.join_and_split` defines the result on whole in-memory tables; this
module computes the same rows in the same order with memory bounded by ``partition_rows``, whatever the size of
``clicks_train.csv`` and ``events.csv``:

1. ``events.csv`` and ``clicks_train.csv`` are read in blocks (pyarrow, typed columns: ids int64, never Python
   strings; :func:`raw.iter_raw_frames`) and each block is cut by ``display_id`` range into bucket files
   (Arrow IPC, lz4) in a scratch directory. ``events`` is read first: its ids give the range; the number of
   buckets is the estimated clicks rows / ``partition_rows``.
2. The catalogue tables (``promoted_content``, ``documents_meta``: as big as the catalogue of ads and documents, not
   as the click log) are read whole, typed, once.
3. Bucket by bucket, in increasing display ranges: clicks ⋈ events ⋈ promoted_content ⋈ documents_meta (x2) with
   pandas, exactly :func:`join_and_split`'s merges, then the split. The split draws one U(0,1) per display in
   sorted display order from ``numpy.random.default_rng(seed)``; buckets are visited in display order and the
   generator is consumed in sequence, so each display gets the very draw the in-memory code gives it. Rows are
   sorted by (display_id, ad_id) within a bucket, which is the global order because buckets are display ranges.
4. The joined train and valid rows are rewritten into ``num_partitions`` parquet files with the in-memory code's
   row boundaries (``numpy.array_split``): NVTabular's fitted statistics (the median of ``FillMedian``) depend on
   the partitioning, so equal partitions give equal output.

Memory: one bucket of clicks and events, its joined rows, the catalogue tables and the set of page ids (for the
document lists); never the click log.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

from . import features as F
from .raw import EmptySplitError, RawInputError, iter_raw_frames, raw_path, read_raw_table_streamed

# Columns of the joined, split tables that the workflow reads (written as parquet between the two stages).
JOINED_COLUMNS = ["display_id", "clicked", "ad_id", "document_id", "platform", "geo_location", "timestamp",
                  "document_id_promo", "campaign_id", "advertiser_id", "source_id", "publisher_id", "publish_time",
                  "source_id_promo", "publisher_id_promo", "publish_time_promo"]
ID_COLUMNS = ["ad_id", "document_id", "document_id_promo", "campaign_id", "advertiser_id", "source_id",
              "publisher_id", "source_id_promo", "publisher_id_promo"]
EVENT_COLUMNS = ["display_id", "document_id", "timestamp", "platform", "geo_location"]

DEFAULT_PARTITION_ROWS = 1_000_000

# on_block(stage, rows_done, bytes_done, file_bytes) for the streamed reads; on_rows(stage, done, total) otherwise.
BlockCallback = Callable[[str, int, int, int], None]
RowsCallback = Callable[[str, int, int], None]


def publish_ms(publish_time: pd.Series) -> pd.Series:
    """``publish_time`` strings -> epoch milliseconds (float, NaN when missing or unparsable)."""
    t = pd.to_datetime(publish_time, errors="coerce", format="%Y-%m-%d %H:%M:%S")
    ms = (t - pd.Timestamp("1970-01-01")) // pd.Timedelta(milliseconds=1)
    return ms.astype("float64")


def prepare_documents_meta(meta: pd.DataFrame) -> pd.DataFrame:
    """``documents_meta`` as the joins use it: one row per document, new unique ids for missing publishers."""
    meta = meta.drop_duplicates("document_id").reset_index(drop=True)
    publisher = meta["publisher_id"].copy()
    missing = publisher.isna().to_numpy()
    # A page without a publisher gets its own new id (reference: "publisher_id nulls filled with new unique ids"),
    # so unrelated unknown publishers do not share one embedding row.
    start = (np.nanmax(publisher.to_numpy()) if (~missing).any() else 0) + 1
    publisher[missing] = start + np.arange(int(missing.sum()))
    return pd.DataFrame({"document_id": meta["document_id"], "source_id": meta["source_id"],
                         "publisher_id": publisher, "publish_time": publish_ms(meta["publish_time"])})


def prepare_promoted(promoted: pd.DataFrame) -> pd.DataFrame:
    return promoted.drop_duplicates("ad_id").rename(columns={"document_id": "document_id_promo"})


class KeyedTable:
    """A table with a unique key column, looked up by a hash index built once (``pandas.Index.get_indexer``).

    A pandas merge factorizes both sides on every call: per bucket of clicks, the 3M-row ``documents_meta`` was
    hashed twice again (a third of stage 1's time at the real catalogue's size). ``take(keys)`` gives what a left
    merge gives: the table's other columns in ``keys`` order, NaN where a key is absent (integer columns then
    become float64, as in a merge)."""

    def __init__(self, df: pd.DataFrame, key: str):
        self.key = key
        self.index = pd.Index(df[key].to_numpy(copy=True))
        self.columns = {c: df[c].to_numpy() for c in df.columns if c != key}

    def take(self, keys: np.ndarray) -> Dict[str, np.ndarray]:
        position = self.index.get_indexer(keys)
        missing = position < 0
        out = {}
        for column, values in self.columns.items():
            taken = values[position]
            if missing.any():
                if taken.dtype.kind in "iub":
                    taken = taken.astype(np.float64)
                taken[missing] = np.nan if taken.dtype.kind == "f" else None
            out[column] = taken
        return out


def join_rows(clicks: pd.DataFrame, events: pd.DataFrame, promoted, meta) -> pd.DataFrame:
    """clicks ⋈ events (inner, display_id) ⋈ promoted (left, ad_id) ⋈ meta (left, document_id, then
    document_id_promo with suffix ``_promo``); ``promoted``/``meta`` from :func:`prepare_promoted` and
    :func:`prepare_documents_meta`, as frames or as :class:`KeyedTable` (built once for many calls). Columns:
    ``JOINED_COLUMNS``, in clicks order (the order of pandas' merges: left keys' order)."""
    if not isinstance(promoted, KeyedTable):
        promoted = KeyedTable(promoted, "ad_id")
    if not isinstance(meta, KeyedTable):
        meta = KeyedTable(meta, "document_id")
    events = events.drop_duplicates("display_id")
    position = pd.Index(events["display_id"].to_numpy()).get_indexer(clicks["display_id"].to_numpy())
    found = position >= 0
    if not found.all():   # inner join: clicks rows without their event are dropped
        clicks, position = clicks[found], position[found]
    columns = {"display_id": clicks["display_id"].to_numpy(), "ad_id": clicks["ad_id"].to_numpy(),
               "clicked": clicks["clicked"].to_numpy()}
    for column in EVENT_COLUMNS[1:]:
        columns[column] = events[column].to_numpy()[position]
    columns.update(promoted.take(columns["ad_id"]))
    columns.update(meta.take(columns["document_id"]))
    columns.update({f"{c}_promo": v for c, v in meta.take(columns["document_id_promo"]).items()})
    df = pd.DataFrame(columns)
    for column in ID_COLUMNS:
        df[column] = df[column].fillna(-1).astype(np.int64)
    df["platform"] = (df["platform"].fillna(1) - 1).astype(np.int64)
    df["geo_location"] = df["geo_location"].fillna("").astype(str)
    df["clicked"] = df["clicked"].astype(np.int64)
    return df[JOINED_COLUMNS]


def is_train(df: pd.DataFrame, draws_of_sorted_displays: np.ndarray) -> np.ndarray:
    """Train if the display's day <= ``TRAIN_LAST_DAY`` and its draw > ``VALID_FRACTION_OF_TRAIN_DAYS``;
    ``draws_of_sorted_displays[i]`` belongs to the i-th smallest display id of ``df``."""
    displays = np.sort(df["display_id"].unique())
    draw = draws_of_sorted_displays[np.searchsorted(displays, df["display_id"].to_numpy())]
    day = (df["timestamp"] // F.MS_PER_DAY).to_numpy()
    return (day <= F.TRAIN_LAST_DAY) & (draw > F.VALID_FRACTION_OF_TRAIN_DAYS)


def empty_split_error(name: str, joined_rows: int) -> EmptySplitError:
    return EmptySplitError(
        f"the {name} set is empty after the split ({joined_rows} joined rows; train = day <= "
        f"{F.TRAIN_LAST_DAY} and draw > {F.VALID_FRACTION_OF_TRAIN_DAYS}, valid = the rest): check "
        f"events.csv timestamps (ms after {F.TIMESTAMP_DELTA_MS}) and that clicks_train.csv display_ids "
        f"appear in events.csv")


# ------------------------------------------------------------------------------------------------ bucket files
def write_ipc(df: pd.DataFrame, path: str) -> None:
    """``df`` as an LZ4-compressed Arrow IPC (feather) file (the stage's bucket and block files)."""
    feather.write_feather(pa.Table.from_pandas(df, preserve_index=False), path, compression="lz4")


def _read_bucket(directory: str) -> Optional[pd.DataFrame]:
    if not os.path.isdir(directory):
        return None
    names = sorted(os.listdir(directory))   # block_<zero-padded index>: file order
    frames = [feather.read_table(os.path.join(directory, n)).to_pandas() for n in names]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0] if frames else None


class Buckets:
    """Cuts frames by display range into ``<root>/<bucket>/block_<i>.arrow`` files (row order kept)."""

    def __init__(self, root: str, low: int, width: int, count: int):
        self.root, self.low, self.width, self.count, self.blocks = root, low, width, count, 0
        os.makedirs(root)

    def add(self, df: pd.DataFrame) -> None:
        ids = df["display_id"].to_numpy()
        keep = (ids >= self.low) & (ids < self.low + self.width * self.count)   # others cannot join
        if not keep.all():
            df, ids = df[keep], ids[keep]
        bucket = (ids - self.low) // self.width
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(self.count + 1))
        for b in range(self.count):
            if bounds[b] < bounds[b + 1]:
                directory = os.path.join(self.root, f"{b:06d}")
                os.makedirs(directory, exist_ok=True)
                write_ipc(df.iloc[order[bounds[b]:bounds[b + 1]]], os.path.join(directory,
                                                                                   f"block_{self.blocks:06d}.arrow"))
        self.blocks += 1

    def read(self, b: int) -> Optional[pd.DataFrame]:
        return _read_bucket(os.path.join(self.root, f"{b:06d}"))


class _PartitionWriter:
    """Rewrites a sequence of frames (bucket files) as ``len(bounds) - 1`` parquet files cut at row ``bounds``."""

    def __init__(self, directory: str, bounds: np.ndarray):
        os.makedirs(directory)
        self.directory, self.bounds = directory, bounds
        self.paths = [os.path.join(directory, f"part_{i}.parquet") for i in range(len(bounds) - 1)]
        self.part, self.row, self.writer = 0, 0, None

    def add(self, df: pd.DataFrame) -> None:
        start = 0
        while start < len(df):
            end = min(len(df), start + int(self.bounds[self.part + 1]) - self.row)
            if end > start:
                table = pa.Table.from_pandas(df.iloc[start:end], preserve_index=False)
                if self.writer is None:
                    self.writer = pq.ParquetWriter(self.paths[self.part], table.schema)
                self.writer.write_table(table)
                self.row += end - start
                start = end
            if self.row == self.bounds[self.part + 1]:
                self._close()
                self.part += 1

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def close(self) -> List[str]:
        self._close()
        return self.paths


def _partition_bounds(rows: int, parts: int) -> np.ndarray:
    """Row boundaries of ``numpy.array_split(range(rows), parts)`` (the in-memory code's partitions)."""
    parts = max(1, min(parts, rows))
    sizes = [rows // parts + (1 if i < rows % parts else 0) for i in range(parts)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def default_num_partitions(rows: int, partition_rows: int) -> int:
    """4 (the former fixed count) up to 4 * partition_rows rows, then one partition per ``partition_rows``."""
    return max(4, -(-rows // max(1, partition_rows)))


# ------------------------------------------------------------------------------------------------ the stage
def stream_join_and_split(input_dir: str, scratch: str, *, seed: int = 0,
                          partition_rows: int = DEFAULT_PARTITION_ROWS, num_partitions: Optional[int] = None,
                          block_bytes: Optional[int] = None, on_block: Optional[BlockCallback] = None,
                          on_rows: Optional[RowsCallback] = None) -> Dict[str, object]:
    """Stage 1 out of core. Writes ``<scratch>/joined_train/part_<i>.parquet`` and ``joined_valid/...`` and returns
    ``{"train": [paths], "test": [paths], "rows": {"train": n, "test": n}, "document_ids": sorted page ids,
    "clicks_rows": n}``. ``num_partitions``: files per set (None: :func:`default_num_partitions`). Raises
    :class:`RawInputError` (bad value: file, row, column) and :class:`EmptySplitError`."""
    if partition_rows < 1:
        raise ValueError(f"--partition_rows must be at least 1, got {partition_rows}")
    read_kwargs = {} if block_bytes is None else {"block_bytes": block_bytes}
    block_cb = (lambda stage: (lambda done, got, size: on_block(stage, done, got, size))) if on_block else \
        (lambda stage: None)
    # 1. events: blocks to a staging area (their display-id range sets the buckets), then clicks by bucket.
    buckets = _bucket_clicks_and_events(input_dir, scratch, partition_rows, block_cb, read_kwargs)
    # 2. the catalogue tables, whole.
    promoted = KeyedTable(prepare_promoted(read_raw_table_streamed(input_dir, "promoted_content")), "ad_id")
    meta = KeyedTable(prepare_documents_meta(read_raw_table_streamed(input_dir, "documents_meta")), "document_id")
    # 3. joins and split, bucket by bucket in display order (one generator: the in-memory code's draws).
    joined, rows, pages = _join_and_split_buckets(scratch, buckets, promoted, meta, seed, on_rows)
    # 4. rewrite as the partitions the workflow reads.
    out = {"rows": rows, "clicks_rows": buckets.clicks_rows, "event_rows": buckets.event_rows,
           "document_ids": pages}
    out.update(_write_partitions(scratch, joined, rows, num_partitions, partition_rows, on_rows))
    return out


@dataclass
class _BucketedInput:
    """clicks_train and events cut into the same display ranges (:class:`Buckets`), and their row counts."""
    clicks: Buckets
    events: Buckets
    count: int
    clicks_rows: int
    event_rows: int


def _bucket_clicks_and_events(input_dir: str, scratch: str, partition_rows: int, block_cb,
                              read_kwargs) -> _BucketedInput:
    """Stage events.csv's blocks (their display ids set the range), then cut clicks_train and events into about
    ``clicks rows / partition_rows`` display-range buckets."""
    events_dir = os.path.join(scratch, "events_blocks")
    os.makedirs(events_dir)
    low, high, event_rows, blocks = None, None, 0, 0
    for frame in iter_raw_frames(input_dir, "events", EVENT_COLUMNS, on_block=block_cb("read events.csv"),
                                 **read_kwargs):
        if len(frame):
            ids = frame["display_id"].to_numpy()
            low = int(ids.min()) if low is None else min(low, int(ids.min()))
            high = int(ids.max()) if high is None else max(high, int(ids.max()))
            write_ipc(frame, os.path.join(events_dir, f"block_{blocks:06d}.arrow"))
            blocks += 1
            event_rows += len(frame)
    if low is None:
        raise RawInputError(f"{raw_path(input_dir, 'events')}: no rows (every clicks_train display needs its event)")
    clicks_bytes = os.path.getsize(raw_path(input_dir, "clicks_train"))
    # About 20 bytes per clicks row in Kaggle's file; a wrong guess changes bucket sizes, not results.
    count = max(1, min(-(-clicks_bytes // 20 // partition_rows), high - low + 1))
    width = -(-(high - low + 1) // count)
    clicks_buckets = Buckets(os.path.join(scratch, "clicks_buckets"), low, width, count)
    events_buckets = Buckets(os.path.join(scratch, "events_buckets"), low, width, count)
    clicks_rows = 0
    for frame in iter_raw_frames(input_dir, "clicks_train", on_block=block_cb("read clicks_train.csv"),
                                 **read_kwargs):
        clicks_rows += len(frame)
        clicks_buckets.add(frame)
    for name in sorted(os.listdir(events_dir)):
        events_buckets.add(feather.read_table(os.path.join(events_dir, name)).to_pandas())
    shutil.rmtree(events_dir)
    return _BucketedInput(clicks_buckets, events_buckets, count, clicks_rows, event_rows)


def _join_and_split_buckets(scratch: str, buckets: _BucketedInput, promoted, meta, seed: int,
                            on_rows: Optional[RowsCallback]):
    """Each bucket joined (:func:`join_rows`) and split (:func:`is_train`, one generator for every bucket, in display
    order), written as ``split_<mapping>/block_<bucket>.arrow``; returns ``(directories, rows, page ids)``. Raises
    :class:`EmptySplitError` for a split left without rows."""
    rng = np.random.default_rng(seed)
    joined = {m: os.path.join(scratch, f"split_{m}") for m in ("train", "test")}
    for directory in joined.values():
        os.makedirs(directory)
    rows = {"train": 0, "test": 0}
    pages, done = np.zeros(0, np.int64), 0
    for b in range(buckets.count):
        clicks = buckets.clicks.read(b)
        events = buckets.events.read(b)
        if clicks is not None:
            done += len(clicks)
        if clicks is None or events is None:
            if on_rows:
                on_rows("join and split", done, buckets.clicks_rows)
            continue
        df = join_rows(clicks, events, promoted, meta)
        del clicks, events
        if len(df):
            displays = df["display_id"].nunique()
            train_mask = is_train(df, rng.random(displays))
            # A running union: as big as the catalogue's pages, not one array per bucket.
            pages = np.union1d(pages, df["document_id"].to_numpy())
            for mapping, part in (("train", df[train_mask]), ("test", df[~train_mask])):
                part = part.sort_values(["display_id", "ad_id"], kind="stable")
                if len(part):
                    write_ipc(part, os.path.join(joined[mapping], f"block_{b:06d}.arrow"))
                    rows[mapping] += len(part)
        if on_rows:
            on_rows("join and split", done, buckets.clicks_rows)
    shutil.rmtree(buckets.clicks.root)
    shutil.rmtree(buckets.events.root)
    joined_rows = rows["train"] + rows["test"]
    for name, mapping in (("training", "train"), ("validation", "test")):
        if rows[mapping] == 0:
            raise empty_split_error(name, joined_rows)
    return joined, rows, pages


def _write_partitions(scratch: str, joined: Dict[str, str], rows: Dict[str, int], num_partitions: Optional[int],
                      partition_rows: int, on_rows: Optional[RowsCallback]) -> Dict[str, List[str]]:
    """The split blocks rewritten as ``joined_train/`` and ``joined_valid/`` parquet partitions; returns
    ``{"train": [paths], "test": [paths]}``."""
    out, written, joined_rows = {}, 0, rows["train"] + rows["test"]
    for mapping, subdir in (("train", "joined_train"), ("test", "joined_valid")):
        parts = num_partitions or default_num_partitions(rows[mapping], partition_rows)
        writer = _PartitionWriter(os.path.join(scratch, subdir), _partition_bounds(rows[mapping], parts))
        for name in sorted(os.listdir(joined[mapping])):
            df = feather.read_table(os.path.join(joined[mapping], name)).to_pandas()
            writer.add(df)
            written += len(df)
            if on_rows:
                on_rows("write partitions", written, joined_rows)
        out[mapping] = writer.close()
        shutil.rmtree(joined[mapping])
    return out
