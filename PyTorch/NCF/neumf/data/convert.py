"""Turn raw interactions into the NCF recipe's dataset (parquet files + ``feature_spec.yaml``).

Two protocols:

* **Leave-one-out with sampled test negatives** (NVIDIA's recipe, the default), from a raw ratings file:
  ML-20m ``ratings.csv``, ML-1m ``ratings.dat``, ML-100k ``u.data`` or a BYO CSV with the header
  ``user_id,item_id,timestamp`` (also ``.gz``). Every rating is an implicit positive (no filtering, no rating
  threshold). User and item ids are factorised to ``0..N-1`` in order of first appearance, rows are sorted by
  time (stable), repeated ``(user, item)`` pairs are dropped (the earliest kept), each user's latest interaction
  becomes the test positive and the rest the training positives. ``--valid_negative`` (100) test negatives per
  user are drawn uniformly, with replacement, from the items the user has no *training* interaction with
  (``--seed``, 1); the held-out item itself may be drawn, which the evaluation's duplicate mask handles.

      python convert.py --path /data/ml-20m/ratings.csv --output /data/cache/ml-20m

* **The NCF paper's published split** (He et al. 2017): ``PREFIX.train.rating``, ``PREFIX.test.rating`` and
  ``PREFIX.test.negative`` (99 negatives per user, ids already 0-based). The ``.rating`` files have four
  tab-separated fields (``user item rating timestamp``) or three (no timestamp, as DeepCF, DMF and ConvNCF publish
  theirs: file order then stands for time):

      python convert.py --paper_split Data/ml-1m --output /data/cache/ml-1m-paper

  When ``PREFIX.train.rating`` is absent, ``--path`` names the ML-1m ``ratings.dat`` (or a prefix of it, sorted by
  user, such as ``ratings.users-1-2999.dat.gz``) and the training rows are rebuilt as the paper made them: every
  rating except the test one, user = UserID - 1, item = order of first appearance of the MovieID. ``--max_user``
  keeps users ``0..max_user`` only (needed when the ratings file is a prefix whose last user may be cut short).

Output (all of it appears at once, or not at all):

    OUTPUT/feature_spec.yaml   channels user_ch=[user], item_ch=[item], label_ch=[label];
                               metadata.test_samples_per_series = 1 + negatives per user
    OUTPUT/train.parquet       user, item (int32), label (float32, all 1): training positives
    OUTPUT/test.parquet        per user ``test_samples_per_series`` consecutive rows: the positive (label 1) first,
                               then its negatives (label 0)
    OUTPUT/user_ids.parquet    raw, id: each user's id in the input and its code (the paper's split: identity);
    OUTPUT/item_ids.parquet    the same for items. Serving maps raw ids in requests through them
                               (``recsys_common.serving.raw_features``)

``--min_interactions N`` (default 0: no filter, NVIDIA's current converter) first drops the users with fewer than
N distinct (user, item) interactions and reports how many users and raw rows it dropped; ``2`` is the least that
lets every remaining user have a training row and a test row (a random sample of MovieLens has users with one
rating), ``20`` is what MovieLens guarantees and NVIDIA's first converter applied. Dropping users never changes the
other users' counts, so one pass is enough.

``OUTPUT`` may already hold other files (NVIDIA documents ``--output /data``, next to the raw data): a non-empty
OUTPUT is refused unless ``--overwrite`` is given, and even then only this tool's own previous outputs are replaced
(``recsys_common.io.atomic_directory``); the input file and any other file are never touched.

Bad input (wrong column count, non-numeric ids, a rating outside the layout's range, a truncated last line, an empty
file, a user with a single interaction) raises
:class:`ConversionError` naming the file and line; nothing is written.
"""
from __future__ import annotations

import argparse
import gzip
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from recsys_common.cli import InputError, run_main
from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import OutputDirectoryError, atomic_directory, check_output_directory
from recsys_common.movielens_ctr import check_rating_range, iter_delimited_columns

USER, ITEM, LABEL = "user", "item", "label"
TRAIN_FILE, TEST_FILE = "train.parquet", "test.parquet"
USER_IDS_FILE, ITEM_IDS_FILE = "user_ids.parquet", "item_ids.parquet"   # raw id -> code (id_mapping_table)
TOOL = "PyTorch/NCF/convert.py"  # its name in the output directory's record of who wrote what


class ConversionError(InputError):
    """Raw input that cannot be converted; the message names the file and line."""


# --------------------------------------------------------------------------------------------- raw formats
@dataclass(frozen=True)
class RawFormat:
    """How one raw ratings layout is read: separator, header, the columns and which of them we keep."""
    name: str
    separator: str
    has_header: bool
    columns: Sequence[str]          # all columns of a line, in order
    user: str
    item: str
    timestamp: Optional[str]         # None: the layout has no time; the line number stands in (file order)
    rating: Optional[str] = None     # checked against ``rating_range`` when given (NCF itself ignores it)
    rating_range: Optional[tuple] = None   # (lowest, highest, step) the format allows


FORMATS = {
    # ML-20m, ML-25m and ml-latest(-small) share this layout: half-star ratings 0.5 to 5
    "ml-20m": RawFormat("ml-20m", ",", True, ("userId", "movieId", "rating", "timestamp"),
                        "userId", "movieId", "timestamp", "rating", (0.5, 5.0, 0.5)),
    "ml-1m": RawFormat("ml-1m", "::", False, ("UserID", "MovieID", "Rating", "Timestamp"),
                       "UserID", "MovieID", "Timestamp", "Rating", (1, 5, 1)),
    "ml-100k": RawFormat("ml-100k", "\t", False, ("user_id", "item_id", "rating", "timestamp"),
                         "user_id", "item_id", "timestamp", "rating", (1, 5, 1)),
    "csv": RawFormat("csv", ",", True, ("user_id", "item_id", "timestamp"), "user_id", "item_id", "timestamp"),
    # the NCF paper's *.rating files: user \t item \t rating \t timestamp, 0-based ids
    "paper-rating": RawFormat("paper-rating", "\t", False, ("user", "item", "rating", "timestamp"),
                              "user", "item", "timestamp"),
    # the same without the timestamp, as DeepCF, DMF and ConvNCF publish their splits: file order stands for time
    "paper-rating3": RawFormat("paper-rating3", "\t", False, ("user", "item", "rating"), "user", "item", None),
}


def paper_rating_format(path: str) -> str:
    """``paper-rating`` or ``paper-rating3``: the layout of a paper's ``.rating`` file, from its first line's field
    count (4: with a timestamp, 3: without). Later lines must match it (the reader names the first that does not)."""
    text = _read_text_head(path)
    first = next((line for line in text.splitlines() if line.strip()), None)
    if first is None:
        raise ConversionError(f"{path}: empty file")
    count = len(first.rstrip("\r").split("\t"))
    if count not in (3, 4):
        raise ConversionError(f"{path}: line 1: expected 3 or 4 '\\t'-separated fields (user, item, rating[, "
                              f"timestamp]), found {count}: {first!r}")
    return "paper-rating" if count == 4 else "paper-rating3"


def _read_text_head(path: str, size: int = 1 << 16) -> str:
    """The first ``size`` bytes of ``path`` (also ``.gz``) as text: enough for a first line."""
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: file not found")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read(size).decode("latin-1")
    except (OSError, EOFError) as err:
        raise ConversionError(f"{path}: cannot read: {err}") from err


def detect_format(path: str) -> str:
    """The raw format of ``path`` from its name (as NVIDIA's loader does), else the BYO CSV."""
    name = os.path.basename(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    parent = os.path.basename(os.path.dirname(os.path.abspath(path))).lower()
    if name == "u.data" or "ml-100k" in parent:
        return "ml-100k"
    if name.startswith("ratings") and name.endswith(".dat"):
        return "ml-1m"
    if name.endswith(".rating"):
        return "paper-rating"
    if name == "ratings.csv" and ("ml-20m" in parent or "ml-25m" in parent or "ml-latest" in parent):
        return "ml-20m"
    return "csv"


def _read_text(path: str) -> str:
    """A small file's text (the paper's ``.test.negative``); ratings files are streamed instead."""
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: file not found")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
        return data.decode("latin-1")
    except (OSError, EOFError) as err:
        raise ConversionError(f"{path}: cannot read: {err}") from err


def read_ratings(path: str, fmt: Optional[str] = None) -> pd.DataFrame:
    """Read a raw ratings file into columns ``user, item, timestamp`` (the raw ids, int64), in file order.

    Raises ConversionError naming the file and the 1-based line for a wrong column count, a non-numeric id or
    timestamp, a rating outside the format's range, or an empty file.
    """
    columns = read_ratings_columns(path, fmt)
    return pd.DataFrame({name: values.astype(np.int64, copy=False) for name, values in columns.items()})


def read_ratings_columns(path: str, fmt: Optional[str] = None) -> dict:
    """The columns ``user, item, timestamp`` of a raw ratings file as numpy arrays, in file order.

    Each column is int32 when every value fits, else int64 (an ML-20m ``ratings.csv`` of 20M rows then takes
    240 MB). Every format, ML-1m's ``::`` included, is streamed a block at a time by
    ``recsys_common.movielens_ctr.iter_delimited_columns`` (pyarrow's CSV parser; a block it refuses is read line by
    line from there on, which names the bad line or reads ids written like ``7.0``), so memory is the output arrays
    plus one block, whatever the file size.
    """
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise ConversionError(f"{path}: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    spec = FORMATS[fmt]
    ints = [spec.user, spec.item] + ([spec.timestamp] if spec.timestamp else [])
    floats = [spec.rating] if spec.rating_range else []
    capacity = _row_capacity(path, len(spec.columns))
    columns = {"user": _GrowingColumn(capacity), "item": _GrowingColumn(capacity),
               "timestamp": _GrowingColumn(capacity)}
    for first_line, batch in iter_delimited_columns(path, spec.separator, spec.columns, ints, floats,
                                                    has_header=spec.has_header, error=ConversionError):
        if floats:
            check_rating_range(path, first_line, spec.rating, batch[spec.rating], spec.rating_range, fmt,
                               error=ConversionError)
        for target, source in (("user", spec.user), ("item", spec.item), ("timestamp", spec.timestamp)):
            # no time column: the 0-based line number, so that "sorted by time" keeps file order
            columns[target].append(batch[source] if source else
                                   np.arange(first_line - 1, first_line - 1 + len(batch[spec.user])))
        del batch
    return {target: column.values() for target, column in columns.items()}


def _row_capacity(path: str, num_columns: int) -> int:
    """An upper bound of the rows of ``path``: every line has at least one character per field plus separators.
    For a ``.gz`` the bound is that of the uncompressed size gzip records (modulo 4 GiB: a hint only)."""
    size = os.path.getsize(path)
    if path.endswith(".gz"):
        with open(path, "rb") as f:
            f.seek(max(0, size - 4))
            size = max(size, int.from_bytes(f.read(4), "little"))
    return size // (2 * num_columns) + 1


class _GrowingColumn:
    """An int32 column filled batch by batch into one preallocated array, so that no concatenation doubles the
    memory at the end. The capacity is an upper bound of the rows (:func:`_row_capacity`): the pages past the
    filled part are never touched, so they cost address space, not memory. Values that do not fit int32 turn the
    column into int64; a capacity that proves too small (a ``.gz`` hint) doubles."""

    def __init__(self, capacity: int):
        self.data = np.empty(capacity, dtype=np.int32)
        self.size = 0

    def append(self, values: np.ndarray) -> None:
        info = np.iinfo(np.int32)
        if self.data.dtype == np.int32 and values.size and (values.min() < info.min or values.max() > info.max):
            self.data = self.data.astype(np.int64)
        end = self.size + len(values)
        if end > len(self.data):
            grown = np.empty(max(end, 2 * len(self.data)), dtype=self.data.dtype)
            grown[:self.size] = self.data[:self.size]
            self.data = grown
        self.data[self.size:end] = values
        self.size = end

    def values(self) -> np.ndarray:
        return self.data[:self.size]


@dataclass
class Split:
    """A converted dataset in memory: training positives and per-user test candidate lists."""
    train_users: np.ndarray        # int [P] (int32 from convert_ratings, int64 from the paper's split)
    train_items: np.ndarray        # int [P]
    test_users: np.ndarray         # int64 [U]
    test_candidates: np.ndarray    # int [U, 1 + negatives] (int32 from convert_ratings); column 0 the positive
    num_users: int
    num_items: int
    dropped: Optional["FilterReport"] = None  # users/rows removed by --min_interactions, if it was given
    # The raw id of each code (raw_user_ids[u] is user u's id in the input file); None: the ids are the codes
    # (the paper's split). write_split saves them as the raw -> code mapping that serving maps requests with.
    raw_user_ids: Optional[np.ndarray] = None
    raw_item_ids: Optional[np.ndarray] = None


@dataclass(frozen=True)
class FilterReport:
    """What :func:`drop_sparse_users` removed."""
    users: int
    rows: int
    min_interactions: int


def drop_sparse_users(ratings, min_interactions: int) -> tuple:
    """Drop the users with fewer than ``min_interactions`` distinct items; returns (kept ratings, FilterReport).

    ``ratings``: a DataFrame or a dict of equal-length arrays ``user, item, timestamp``; the kept rows come back in
    the same form. Counts distinct (user, item) pairs, as leave-one-out sees them after dropping repeats. Only users
    are removed, so no other user's count changes and one pass leaves every kept user with at least
    ``min_interactions``.
    """
    if min_interactions <= 1:
        return ratings, FilterReport(0, 0, min_interactions)
    distinct = pd.DataFrame({"user": ratings["user"], "item": ratings["item"]}).drop_duplicates()
    per_user = distinct["user"].value_counts()
    sparse = per_user.index[per_user.to_numpy() < min_interactions]
    drop = np.isin(np.asarray(ratings["user"]), sparse.to_numpy())
    if isinstance(ratings, pd.DataFrame):
        kept = ratings[~drop].reset_index(drop=True)
    else:
        kept = {name: np.asarray(values)[~drop] for name, values in ratings.items()}
    return kept, FilterReport(int(len(sparse)), int(drop.sum()), min_interactions)


@dataclass
class LeaveOneOut:
    """What :func:`leave_one_out` returns: training rows in time order, and each user's held-out item."""
    train_users: np.ndarray   # int32 [P] (factorised ids)
    train_items: np.ndarray   # int32 [P]
    test_users: np.ndarray    # int64 [U]: 0..U-1
    test_items: np.ndarray    # int64 [U]
    num_users: int
    num_items: int
    train_keys: Optional[np.ndarray] = None   # sorted distinct user * num_items + item of the training rows
    raw_user_ids: Optional[np.ndarray] = None  # the input's id of each user code, item code
    raw_item_ids: Optional[np.ndarray] = None


def _first_occurrences(keys: np.ndarray) -> np.ndarray:
    """Boolean mask: True at the first row of each distinct key (a stable sort keeps the earliest row first)."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    first_sorted = np.ones(len(keys), dtype=bool)
    first_sorted[1:] = sorted_keys[1:] != sorted_keys[:-1]
    del sorted_keys
    first = np.empty(len(keys), dtype=bool)
    first[order] = first_sorted
    return first


_PACK_CHUNK = 1 << 20   # rows per step of the element-wise passes below: their temporaries stay at ~8 MB


def _bits(value: int) -> int:
    return max(1, int(value).bit_length())


def _factorize_int32(values: np.ndarray) -> tuple:
    """``pd.factorize`` (codes in order of first appearance) with int32 codes; returns (codes, raw ids by code).

    Ids that are non-negative and at most a few times the row count (MovieLens' are) go through a lookup table
    indexed by the id, which needs no int64 copy of the column (pandas hashes int64: at 20M rows that is 160 MB
    for the copy and 160 MB for its codes)."""
    n = len(values)
    if n and values.dtype.kind in "iu" and int(values.min()) >= 0 and int(values.max()) < max(4 * n, 1 << 16):
        first = np.full(int(values.max()) + 1, n, dtype=np.int64)   # each id's first row
        for lo in range(0, n, _PACK_CHUNK):
            hi = min(n, lo + _PACK_CHUNK)
            np.minimum.at(first, values[lo:hi], np.arange(lo, hi, dtype=np.int64))
        uniques = np.flatnonzero(first < n)
        uniques = uniques[np.argsort(first[uniques], kind="stable")]   # in order of first appearance
        table = np.empty(len(first), dtype=np.int32)
        table[uniques] = np.arange(len(uniques), dtype=np.int32)
        return table[values], uniques.astype(values.dtype)
    codes, uniques = pd.factorize(values)
    return codes.astype(np.int32), uniques


def _time_packs(timestamps: np.ndarray) -> bool:
    """Whether the time span and the row number fit 63 bits together (for :func:`_time_order`)."""
    return _bits(int(timestamps.max()) - int(timestamps.min())) + _bits(len(timestamps) - 1) <= 63


def _time_order(timestamps: np.ndarray) -> np.ndarray:
    """``np.argsort(timestamps, kind="stable")`` as one in-place ``np.sort`` of ``(time << b) | row`` (several times
    faster than a stable argsort); needs :func:`_time_packs`."""
    n = len(timestamps)
    row_bits = _bits(n - 1)
    low = int(timestamps.min())
    packed = np.empty(n, dtype=np.int64)
    for lo in range(0, n, _PACK_CHUNK):
        hi = min(n, lo + _PACK_CHUNK)
        chunk = timestamps[lo:hi].astype(np.int64)
        chunk -= low
        chunk <<= row_bits
        chunk |= np.arange(lo, hi, dtype=np.int64)
        packed[lo:hi] = chunk
    packed.sort()
    packed &= (1 << row_bits) - 1
    return packed


def _check_two_interactions_per_user(per_user: np.ndarray, raw_users: np.ndarray, path: str) -> None:
    """Leave-one-out needs two distinct interactions per user: raise :class:`ConversionError` naming the first five
    users with fewer (``per_user``: distinct interactions per dense user id; ``raw_users``: their ids in the file)."""
    lonely = np.flatnonzero(per_user < 2)
    if lonely.size:
        examples = ", ".join(str(raw_users[u]) for u in lonely[:5])
        raise ConversionError(f"{path}: {lonely.size} user(s) have a single distinct interaction (user id(s) "
                              f"{examples}{', ...' if lonely.size > 5 else ''}); leave-one-out needs at least two "
                              f"per user (one for training, one for the test). Drop them with --min_interactions 2 "
                              f"(or more), or add interactions.")


def leave_one_out(ratings, path: str = "<ratings>", consume: bool = False) -> LeaveOneOut:
    """Factorise ids, sort by time, drop repeated pairs, hold out each user's latest row.

    ``ratings``: a DataFrame or a dict of arrays ``user, item, timestamp`` (raw ids, in file order). Ids are
    numbered in order of first appearance; the sort by time is stable, so equal timestamps keep file order; of a
    repeated (user, item) pair the earliest row is kept; the training rows stay in time order.

    How (ML-20m's 20M rows in a few seconds and ~3 int64 arrays of memory): every ordering is one in-place
    ``np.sort`` of int64 keys that pack the sort key with a row number, instead of stable argsorts and gathers:
      1. time rank: sort ``(timestamp << b) | row`` -> the rows in time order (ties in file order);
      2. pairs: sort ``(pair << b) | rank`` with ``pair = user * num_items + item``: each pair's first entry is
         its earliest row (kept), and a user's entries are contiguous;
      3. the kept rows re-packed rank-major, ``(rank << p) | pair``: a user's maximum is its latest row (the test
         row); sorting them gives the training rows in time order.
    When ids and times are too wide to pack into 63 bits, :func:`_leave_one_out_general` does the same with
    argsorts. Returns the sorted, distinct training pairs too (``train_keys``, for the negative sampler).
    ``consume``: ``ratings`` is a dict the caller no longer needs; its columns are removed as they are encoded.
    """
    n = len(ratings["user"])
    if n == 0:
        raise ConversionError(f"{path}: no interactions left to convert (--min_interactions dropped every user?)")
    columns = dict(ratings) if not consume else ratings   # consume: free each raw column once it is encoded
    users, raw_users = _factorize_int32(np.asarray(columns.pop("user")))
    items, raw_items = _factorize_int32(np.asarray(columns.pop("item")))
    timestamps = np.asarray(columns.pop("timestamp"))
    num_users, num_items = len(raw_users), len(raw_items)
    row_bits, pair_bits = _bits(n - 1), _bits(num_users * num_items - 1)
    if row_bits + pair_bits > 63 or not _time_packs(timestamps):   # too wide to pack: the argsort path
        # (re-factorising codes numbered in order of first appearance keeps them: raw_items stays their map)
        split = _leave_one_out_general({"user": users, "item": items, "timestamp": timestamps}, path, raw_users)
    else:
        encoded = {"user": users, "item": items, "timestamp": timestamps}
        del users, items, timestamps   # the dict holds the only references: freed inside, step by step
        kept = _earliest_row_of_each_pair(encoded, num_items, row_bits)
        split = _hold_out_latest(kept, n, num_users, num_items, row_bits, pair_bits, raw_users, path)
    split.raw_user_ids, split.raw_item_ids = np.asarray(raw_users), np.asarray(raw_items)
    return split


def _earliest_row_of_each_pair(encoded: dict, num_items: int, row_bits: int) -> np.ndarray:
    """Steps 1-2 of :func:`leave_one_out`: ``(pair << row_bits) | rank`` of the earliest row of each (user, item)
    pair, sorted by pair. ``encoded``'s arrays are popped and freed as soon as they are packed, so that no more than
    three n-row arrays are alive at once."""
    users, items = encoded.pop("user"), encoded.pop("item")
    n = len(users)
    # the pairs first (in row order), then each row's time rank is or-ed in
    packed = np.empty(n, dtype=np.int64)
    for lo in range(0, n, _PACK_CHUNK):
        chunk = users[lo:lo + _PACK_CHUNK].astype(np.int64)
        chunk *= num_items
        chunk += items[lo:lo + _PACK_CHUNK]
        chunk <<= row_bits
        packed[lo:lo + _PACK_CHUNK] = chunk
    del users, items, chunk
    by_time = _time_order(encoded.pop("timestamp"))
    for lo in range(0, n, _PACK_CHUNK):
        hi = min(n, lo + _PACK_CHUNK)
        packed[by_time[lo:hi]] |= np.arange(lo, hi, dtype=np.int64)   # by_time is a permutation: no repeats
    del by_time
    packed.sort()
    first = np.empty(n, dtype=bool)   # the earliest row of each pair
    first[0] = True
    for lo in range(1, n, _PACK_CHUNK):
        hi = min(n, lo + _PACK_CHUNK)
        first[lo:hi] = (packed[lo:hi] >> row_bits) != (packed[lo - 1:hi - 1] >> row_bits)
    return packed[first]


def _hold_out_latest(kept: np.ndarray, n: int, num_users: int, num_items: int, row_bits: int, pair_bits: int,
                     raw_users, path: str) -> LeaveOneOut:
    """Step 3 of :func:`leave_one_out`: ``kept`` (from :func:`_earliest_row_of_each_pair`, re-packed here in place)
    -> each user's latest row as its test item, the other rows as training pairs in time order."""
    # 3. re-pack rank-major: (rank << pair_bits) | pair; the per-user maximum is the user's latest kept row
    row_mask, pair_mask = (1 << row_bits) - 1, (1 << pair_bits) - 1
    per_user = np.zeros(num_users, dtype=np.int64)
    for lo in range(0, len(kept), _PACK_CHUNK):
        chunk = kept[lo:lo + _PACK_CHUNK]
        pair = chunk >> row_bits
        per_user += np.bincount(pair // num_items, minlength=num_users)
        chunk &= row_mask
        chunk <<= pair_bits
        chunk |= pair
    del chunk, pair
    _check_two_interactions_per_user(per_user, raw_users, path)
    starts = np.concatenate([[0], np.cumsum(per_user)[:-1]])
    latest = np.maximum.reduceat(kept, starts)          # [num_users], ordered by user
    test_items = (latest & pair_mask) % num_items
    is_test_rank = np.zeros(n, dtype=bool)
    is_test_rank[latest >> pair_bits] = True
    kept.sort()                                          # rank-major: the kept rows in time order
    train = np.empty(len(kept) - num_users, dtype=np.int64)   # distinct training pairs, in time order
    train_users = np.empty(len(train), dtype=np.int32)
    train_items = np.empty(len(train), dtype=np.int32)
    done = 0
    for lo in range(0, len(kept), _PACK_CHUNK):
        chunk = kept[lo:lo + _PACK_CHUNK]
        pairs = chunk[~is_test_rank[chunk >> pair_bits]] & pair_mask
        end = done + len(pairs)
        train[done:end] = pairs
        train_users[done:end] = pairs // num_items
        train_items[done:end] = pairs % num_items
        done = end
    del chunk, pairs, is_test_rank
    train.sort()                                          # the sampler's lookup table, built in place
    return LeaveOneOut(train_users, train_items, np.arange(num_users, dtype=np.int64),
                       test_items.astype(np.int64), num_users, num_items, train_keys=train)


def _leave_one_out_general(ratings, path: str = "<ratings>", raw_user_ids=None) -> LeaveOneOut:
    """:func:`leave_one_out` with argsorts, for keys too wide to pack into 63 bits (slower: stable argsorts).

    ``ratings``: a DataFrame or a dict of arrays ``user, item, timestamp`` (raw ids, in file order). Ids are
    numbered in order of first appearance; the sort by time is stable, so equal timestamps keep file order; of a
    repeated (user, item) pair the earliest row is kept; the training rows stay in time order. Works on flat
    numpy arrays (int32 ids, an int64 argsort) so that ML-20m's 20M rows need a few hundred MB, not several GB.
    """
    if len(ratings["user"]) == 0:
        raise ConversionError(f"{path}: no interactions left to convert (--min_interactions dropped every user?)")
    users, raw_users = pd.factorize(np.asarray(ratings["user"]))
    users = users.astype(np.int32)
    if raw_user_ids is not None:   # ratings["user"] holds codes already: name the users by their raw ids
        raw_users = np.asarray(raw_user_ids)[raw_users]
    items, raw_items = pd.factorize(np.asarray(ratings["item"]))
    items = items.astype(np.int32)
    num_users, num_items = len(raw_users), len(raw_items)
    by_time = np.argsort(np.asarray(ratings["timestamp"]), kind="stable")
    users, items = users[by_time], items[by_time]
    del by_time
    keep = _first_occurrences(users.astype(np.int64) * num_items + items)
    users, items = users[keep], items[keep]
    del keep
    per_user = np.bincount(users, minlength=num_users)
    _check_two_interactions_per_user(per_user, raw_users, path)
    # Each user's latest row: its first occurrence when reading the time-ordered rows backwards. np.unique sorts
    # the users (stable, with return_index), so the test rows come out ordered by user, every user once.
    test_users, from_end = np.unique(users[::-1], return_index=True)
    latest = len(users) - 1 - from_end
    is_train = np.ones(len(users), dtype=bool)
    is_train[latest] = False
    return LeaveOneOut(users[is_train], items[is_train], test_users.astype(np.int64),
                       items[latest].astype(np.int64), num_users, num_items)


def _sorted_distinct_keys(train_users: np.ndarray, train_items: np.ndarray, num_items: int) -> np.ndarray:
    """Sorted distinct ``user * num_items + item`` of the training pairs, built in place (one int64 array)."""
    keys = train_users.astype(np.int64)
    keys *= num_items
    keys += train_items
    keys.sort()
    if len(keys):
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    return keys


def _in_sorted(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``np.isin(keys, table)`` for a sorted ``table``: the keys are sorted first (packed with their position), so
    that ``np.searchsorted`` walks the table once instead of jumping at random (20x faster at 14M keys)."""
    if len(table) == 0 or len(keys) == 0:
        return np.zeros(keys.shape, dtype=bool)
    position_bits = _bits(len(keys) - 1)
    if _bits(int(keys.max())) + position_bits > 63:
        found = np.searchsorted(table, keys)
        return table[np.minimum(found, len(table) - 1)] == keys
    packed = keys << position_bits
    packed |= np.arange(len(keys), dtype=np.int64)
    packed.sort()
    sorted_keys = packed >> position_bits
    found = np.searchsorted(table, sorted_keys)
    hit = table[np.minimum(found, len(table) - 1)] == sorted_keys
    out = np.empty(len(keys), dtype=bool)
    out[packed & ((1 << position_bits) - 1)] = hit
    return out


# Users per step of the first membership pass of the negative sampler (100 candidates each: ~1.6M keys a step)
_SAMPLER_USERS = 1 << 14


def sample_test_negatives(train_users: np.ndarray, train_items: np.ndarray, test_users: np.ndarray,
                          num_items: int, num_negatives: int, seed: int,
                          train_keys: Optional[np.ndarray] = None) -> np.ndarray:
    """``num_negatives`` items per test user, uniform with replacement over items without a training interaction.

    Vectorised rejection sampling: all draws at once, then the draws that hit a training pair are redrawn (in row
    order) until none does. ``train_keys``: the sorted distinct ``user * num_items + item`` of the training rows if
    the caller has them (:func:`leave_one_out` does), else built here. Returns int64
    ``[len(test_users), num_negatives]``.
    """
    if num_negatives == 0:
        return np.zeros((len(test_users), 0), dtype=np.int64)
    rng = np.random.default_rng(seed)
    if train_keys is None:
        train_keys = _sorted_distinct_keys(train_users, train_items, num_items)
    per_user = np.bincount(train_users, minlength=int(test_users.max()) + 1)
    full = np.flatnonzero(per_user[test_users] >= num_items)
    if full.size:
        raise ConversionError(f"user {int(test_users[full[0]])} has a training interaction with every item: "
                              f"no test negative can be drawn")
    out = rng.integers(0, num_items, size=(len(test_users), num_negatives), dtype=np.int64)
    todo = np.empty(out.shape, dtype=bool)
    for lo in range(0, len(test_users), _SAMPLER_USERS):   # first pass: every draw, a block of users at a time
        keys = test_users[lo:lo + _SAMPLER_USERS, None] * num_items + out[lo:lo + _SAMPLER_USERS]
        todo[lo:lo + _SAMPLER_USERS] = _in_sorted(train_keys, keys.reshape(-1)).reshape(keys.shape)
    while True:
        n = int(todo.sum())
        if n == 0:
            return out
        out[todo] = rng.integers(0, num_items, size=n, dtype=np.int64)
        rows = np.nonzero(todo)[0]
        todo[todo] = _in_sorted(train_keys, test_users[rows] * num_items + out[todo])


def convert_ratings(path: str, valid_negative: int = 100, seed: int = 1, fmt: Optional[str] = None,
                    min_interactions: int = 0) -> Split:
    """NVIDIA's protocol on one raw ratings file (see the module docstring).

    ``min_interactions``: drop users with fewer distinct items first (0: keep all); ``Split.dropped`` says what went.
    """
    ratings, dropped = drop_sparse_users(read_ratings_columns(path, fmt), min_interactions)
    split = leave_one_out(ratings, path, consume=isinstance(ratings, dict))
    del ratings
    negatives = sample_test_negatives(split.train_users, split.train_items, split.test_users, split.num_items,
                                      valid_negative, seed, train_keys=split.train_keys)
    split.train_keys = None
    # int32 (item codes are): half the memory of int64, and what the parquet file stores
    candidates = np.empty((len(split.test_users), 1 + valid_negative), dtype=np.int32)
    candidates[:, 0] = split.test_items
    candidates[:, 1:] = negatives
    del negatives
    return Split(split.train_users, split.train_items, split.test_users, candidates, split.num_users,
                 split.num_items, dropped, split.raw_user_ids, split.raw_item_ids)


def read_paper_negatives(path: str) -> tuple:
    """``PREFIX.test.negative``: ``(user,item)\\t`` then the negatives, tab-separated. Returns (pairs [U,2], negs [U,K])."""
    text = _read_text(path)
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ConversionError(f"{path}: empty file: no test negatives")
    pairs, negatives, width = [], [], None
    for number, line in enumerate(lines, start=1):
        fields = line.rstrip("\t").split("\t")
        head = fields[0].strip()
        if not (head.startswith("(") and head.endswith(")") and head.count(",") == 1):
            raise ConversionError(f"{path}: line {number}: expected '(user,item)' as the first field, got {head!r}")
        try:
            pair = [int(x) for x in head[1:-1].split(",")]
            negs = [int(x) for x in fields[1:]]
        except ValueError as err:
            raise ConversionError(f"{path}: line {number}: non-numeric id: {err}") from err
        if width is None:
            width = len(negs)
        elif len(negs) != width:
            raise ConversionError(f"{path}: line {number}: expected {width} negatives (as on line 1), "
                                  f"found {len(negs)}")
        pairs.append(pair)
        negatives.append(negs)
    return np.asarray(pairs, dtype=np.int64), np.asarray(negatives, dtype=np.int64)


def convert_paper_split(prefix: str, ratings_path: Optional[str] = None, max_user: Optional[int] = None) -> Split:
    """The NCF paper's split (see the module docstring). The ``.rating`` files have four fields (``user item rating
    timestamp``) or three (no timestamp: DeepCF's, DMF's, ConvNCF's files). The training rows come out in time order
    (stable: file order where times tie or are absent), so a user's last training row is its latest one: the row
    ``ncf.py`` holds out as the user's validation item."""
    test_file = prefix + ".test.rating"
    test = read_ratings(test_file, paper_rating_format(test_file))
    pairs, negatives = read_paper_negatives(prefix + ".test.negative")
    if len(pairs) != len(test) or not (np.array_equal(pairs[:, 0], test["user"].to_numpy())
                                       and np.array_equal(pairs[:, 1], test["item"].to_numpy())):
        raise ConversionError(f"{prefix}.test.negative: its (user,item) pairs do not match "
                              f"{prefix}.test.rating line for line")
    train_file = prefix + ".train.rating"
    if os.path.isfile(train_file):
        train = read_ratings(train_file, paper_rating_format(train_file))
        train = train.iloc[np.argsort(train["timestamp"].to_numpy(), kind="stable")][["user", "item"]]
    elif ratings_path:
        raw = read_ratings(ratings_path, "ml-1m")
        items, _ = pd.factorize(raw["item"])  # the paper's item id: order of first appearance of the MovieID
        by_time = np.argsort(raw["timestamp"].to_numpy(), kind="stable")   # after the ids: they follow file order
        train = pd.DataFrame({"user": raw["user"].to_numpy()[by_time] - 1, "item": items.astype(np.int64)[by_time]})
        if max_user is None:
            max_user = int(train["user"].max())
        train = train[train["user"] <= max_user]
        held_out = test[test["user"] <= max_user]
        key = train["user"].to_numpy() * 1_000_000 + train["item"].to_numpy()
        held_key = held_out["user"].to_numpy() * 1_000_000 + held_out["item"].to_numpy()
        found = np.isin(held_key, key)
        if not found.all():
            u = int(held_out["user"].to_numpy()[~found][0])
            raise ConversionError(f"{ratings_path}: user {u}'s test item from {prefix}.test.rating is not among its "
                                  f"ratings: the item mapping or the ratings file does not match the paper's split")
        train = train[~np.isin(key, held_key)]
    else:
        raise ConversionError(f"{train_file} not found: pass --path with the ML-1m ratings.dat to rebuild it")
    if max_user is not None:
        keep = test["user"].to_numpy() <= max_user
        test, negatives = test[keep], negatives[keep]
        train = train[train["user"] <= max_user]
    train = train.drop_duplicates(subset=["user", "item"])
    test_users = test["user"].to_numpy()
    candidates = np.concatenate([test["item"].to_numpy()[:, None], negatives], axis=1)
    num_users = int(max(train["user"].max(), test_users.max())) + 1
    num_items = int(max(train["item"].max(), candidates.max())) + 1
    return Split(train["user"].to_numpy(), train["item"].to_numpy(), test_users, candidates, num_users, num_items)


# --------------------------------------------------------------------------------------------- output
def feature_spec_for(split: Split) -> FeatureSpec:
    samples = split.test_candidates.shape[1]
    return FeatureSpec(
        feature_spec={USER: {"dtype": "int32", "cardinality": int(split.num_users)},
                      ITEM: {"dtype": "int32", "cardinality": int(split.num_items)},
                      LABEL: {"dtype": "float32"}},
        source_spec={"train": [{"type": "parquet", "features": [USER, ITEM, LABEL], "files": [TRAIN_FILE]}],
                     "test": [{"type": "parquet", "features": [USER, ITEM, LABEL], "files": [TEST_FILE]}]},
        channel_spec={"user_ch": [USER], "item_ch": [ITEM], "label_ch": [LABEL]},
        metadata={"test_samples_per_series": int(samples)},
    )


OUTPUT_FILES = ("feature_spec.yaml", TRAIN_FILE, TEST_FILE, USER_IDS_FILE, ITEM_IDS_FILE)


def check_output(output: str, inputs: Sequence[str], overwrite: bool) -> None:
    """Refuse, before any work, an output that would replace an input or a non-empty directory without overwrite."""
    out = os.path.abspath(output)
    for path in inputs:
        if path and os.path.dirname(os.path.abspath(path)) == out and os.path.basename(path) in OUTPUT_FILES:
            raise ConversionError(f"--output {output}: would replace the input {path} (this tool writes "
                                  f"{', '.join(OUTPUT_FILES)}): choose another output directory")
    try:
        check_output_directory(out, overwrite)
    except OutputDirectoryError as err:
        raise ConversionError(f"--output: {err}") from err


def id_mapping_table(raw_ids: Optional[np.ndarray], count: int) -> pa.Table:
    """``raw, id``: each code's id in the input (int64 for numeric ids, else string) and the code (int32), by code.
    Without raw ids (the paper's split, whose files hold the codes) the mapping is the identity over ``count``."""
    if raw_ids is None:
        raw_ids = np.arange(count, dtype=np.int64)
    raw = np.asarray(raw_ids)
    raw = raw.astype(np.int64) if raw.dtype.kind in "iu" else raw.astype(str)
    return pa.table({"raw": raw, "id": np.arange(len(raw), dtype=np.int32)})


def write_split(split: Split, output: str, overwrite: bool = False) -> str:
    """Write parquet files and ``feature_spec.yaml`` into ``output`` atomically. Returns the spec's path.

    ``overwrite=False`` refuses a non-empty ``output``; ``overwrite=True`` replaces this tool's own files there and
    keeps every other file (``recsys_common.io.atomic_directory``).
    """
    samples = split.test_candidates.shape[1]

    def train_table():
        return pa.table({USER: split.train_users.astype(np.int32, copy=False),
                         ITEM: split.train_items.astype(np.int32, copy=False),
                         LABEL: np.ones(len(split.train_users), dtype=np.float32)})

    def test_table():
        labels = np.zeros(split.test_candidates.shape, dtype=np.float32)
        labels[:, 0] = 1.0
        return pa.table({USER: np.repeat(split.test_users.astype(np.int32), samples),
                         ITEM: split.test_candidates.reshape(-1).astype(np.int32),
                         LABEL: labels.reshape(-1)})

    # built one at a time, each freed once written: at ML-20m size the two tables hold ~400 MB together
    tables = {TRAIN_FILE: train_table, TEST_FILE: test_table,
              USER_IDS_FILE: lambda: id_mapping_table(split.raw_user_ids, split.num_users),
              ITEM_IDS_FILE: lambda: id_mapping_table(split.raw_item_ids, split.num_items)}
    with atomic_directory(output, overwrite=overwrite, tool=TOOL, marker="feature_spec.yaml") as tmp:
        for name, make_table in tables.items():
            pq.write_table(make_table(), os.path.join(tmp, name))
        spec = feature_spec_for(split)
        spec.base_directory = tmp
        spec.validate(check_files=True)
        spec.to_yaml(os.path.join(tmp, "feature_spec.yaml"))
    return os.path.join(output, "feature_spec.yaml")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", type=str, help="raw ratings file (ratings.csv, ratings.dat, u.data or BYO CSV)")
    parser.add_argument("--output", type=str, required=True, help="output dataset directory")
    parser.add_argument("--valid_negative", type=int, default=100,
                        help="number of test negatives sampled per user (leave-one-out protocol)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the test-negative sampling")
    parser.add_argument("--format", choices=sorted(FORMATS), default=None,
                        help="raw format; default: detected from the file name")
    parser.add_argument("--paper_split", type=str, default=None, metavar="PREFIX",
                        help="convert the NCF paper's PREFIX.{train.rating,test.rating,test.negative}")
    parser.add_argument("--max_user", type=int, default=None,
                        help="with --paper_split: keep users 0..MAX_USER only")
    parser.add_argument("--min_interactions", type=int, default=0, metavar="N",
                        help="drop users with fewer than N distinct items first and report them (0: no filter, "
                             "NVIDIA's behaviour; 2 makes every user convertible; MovieLens guarantees 20)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --output, replacing only this tool's previous outputs there")
    args = parser.parse_args(argv)
    if not args.paper_split and not args.path:
        parser.error("one of --path or --paper_split is required")
    if args.valid_negative < 0:
        parser.error("--valid_negative must be >= 0")
    if args.min_interactions < 0:
        parser.error("--min_interactions must be >= 0")
    if args.min_interactions and args.paper_split:
        parser.error("--min_interactions applies to --path (leave-one-out) only; the paper's split is fixed")
    return args


def main(argv: Optional[List[str]] = None) -> str:
    """Converts; returns the written ``feature_spec.yaml``. Raises one of :data:`INPUT_ERRORS` on bad input."""
    args = parse_args(argv)
    inputs = [args.path] + ([args.paper_split + ext for ext in (".train.rating", ".test.rating",
                                                                  ".test.negative")] if args.paper_split else [])
    check_output(args.output, inputs, args.overwrite)  # before the conversion: fail in seconds, not minutes
    if args.paper_split:
        split = convert_paper_split(args.paper_split, args.path, args.max_user)
    else:
        split = convert_ratings(args.path, args.valid_negative, args.seed, args.format, args.min_interactions)
    if split.dropped is not None and split.dropped.min_interactions > 1:
        print(f"convert.py: --min_interactions {split.dropped.min_interactions}: dropped {split.dropped.users} "
              f"user(s) and {split.dropped.rows} row(s)")
    spec_path = write_split(split, args.output, overwrite=args.overwrite)
    print(f"convert.py: {len(split.train_users)} training positives, {split.num_users} users, "
          f"{split.num_items} items, {split.test_candidates.shape[1]} test samples per user -> {spec_path}")
    return spec_path


# Bad input (a malformed row, an output name taken by a file this tool did not write): exit 2 (recsys_common.cli).
INPUT_ERRORS = (ConversionError, OutputDirectoryError)

if __name__ == "__main__":
    run_main(main, prog="convert.py", input_errors=INPUT_ERRORS)
