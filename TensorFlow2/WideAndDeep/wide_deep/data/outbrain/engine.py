"""Stage 2 of the Outbrain ETL on the default engine: pandas, numpy, pyarrow and scipy (``distributed`` only when asked
for a cluster); no NVTabular or merlin.

It computes the columns, dtypes, row order and files of the NVTabular workflow of
:mod:`wide_deep.data.outbrain.nvtabular.workflow` (``--engine nvtabular``), with each NVTabular 23.8 operator's
definition written out here (the tests compare the two engines column by column, ``tests/test_etl_engines.py``):

- one-hot ids: ``HashBucket`` = ``pandas.util.hash_array`` of the column's values (int64 as read, strings as Python
  objects: the hash is pandas' own, equal under pandas 1.5 and 3, whatever the string dtype) modulo the bucket
  count, int32. ``geo_location_country`` / ``_state``: the first 2 / 5 characters of ``geo_location``.
- ``publish_time[_promo]_days_since_published``: whole days from publication to the event (0 outside [0, 3650]),
  ``FillMedian``, ``LogOp``. ``FillMedian`` is dask's approximate median (``quantile(0.5, method="dask")``): per
  partition, the 0th, 50th and 100th percentiles (numpy, linear) and the row count; then dask's
  ``merge_percentiles(method="lower")`` over the partitions, written out in :func:`merged_median`. With one partition
  that is the exact median; with several it is not (the same approximation NVTabular fitted, on the same
  partitions). ``LogOp``: ``log(float32(x) + 1)`` in float32.
- ``<col>_ctr``: ``JoinGroupby(cont_cols=[clicked], stats=[sum, count])`` fitted on train, then clicks / count in
  float64 where count >= ``CTR_THRESHOLDS[col]``, else 0 (also for a value unseen in train); float32.
- ``ad_id_count``, ``document_id_promo_count``: the training count (0 if unseen), ``LogOp``, then ``Normalize``:
  NVTabular's moments, per partition the non-null count, the float32 sum (pandas 1.5 sums float32 in float32) as
  float64 and the float64 sum of squares, summed over partitions in a tree of 32 (dask's ``split_every``), every
  sum as numpy 1.26 adds (:func:`numpy1_sum`: numpy 2's float32 sum differs); std with ddof 1 from ``sum2 - sum**2 / n``; transform ``(x - mean) / std`` in float32 (the
  statistics cast to float32, as numpy does for a float32 column minus a Python float).
- ``document_id_document_id_promo_sim_<categories|topics|entities>``: ``ColumnSimilarity(metric="tfidf")``: the
  TF-IDF weights of :func:`wide_deep.data.outbrain.tables.compact_tfidf` (shared with the NVTabular engine), and the
  inner product of the two pages' rows summed term by term in column order from 0.0 (NVTabular's numba loop), in
  float64, then float32.
- ``topic_id_list``, ``entity_id_list``, ``category_id_list``: ``Categorify(max_size=cap)`` >> ``ListSlice(3)`` on
  the page's list: a term's count is the training rows whose page lists it; the vocabulary is the terms seen, by
  count descending, cut at ``cap - 3`` (codes from 3; 0 pad, 1 null, 2 out of vocabulary). Ties among equal counts
  are ordered by term id here (a stable sort); NVTabular orders them with numpy's quicksort, whose tie order changed
  between numpy 1.26 and 2.x (SIMD sorting networks) and differs between machines, so tied terms' codes may be
  permuted between the engines (the test allows exactly that; every other code is equal).

Equal where exactness is possible, and the tests check it: every column but the lists bit for bit (the lists up
to the tie order above). Not guaranteed bit for bit: ``FillMedian`` with more than 5 partitions (dask sorts the
partitions' percentiles with numpy's quicksort, here a stable sort; equal values in another order can move the
merged median to a neighbouring value), and the TF-IDF weights wherever numpy 2's float64 ``log`` rounds
differently from numpy 1.26's (not seen in the tests; a float32 ulp at most in a similarity).

Partition by partition (one parquet file of stage 1 at a time, bounded memory): fit reads the training partitions
twice (counts, sums, percentiles and page counts; then the moments of the normalized counts), transform reads each
partition once and writes it. Partitions map onto output files as NVTabular's ``to_parquet(output_files=n)`` maps
them (:func:`file_groups`). With a ``distributed.Client`` the partitions run as tasks on its workers.

The fitted statistics are saved in ``workflow/`` without pickle (:func:`save_fitted`, :func:`load_fitted`):
``stats.json`` (medians, moments, settings), ``groupby.<column>.parquet`` (value, clicks, count),
``lists.npz`` and ``similarity.npz`` (numpy arrays, read with ``allow_pickle=False``). ``load_fitted(path)
.transform(joined_rows)`` turns new joined rows (``joins.JOINED_COLUMNS``) into the output rows.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from . import features as F
from .tables import compact_tfidf

FORMAT = "wide_deep.outbrain.fitted_stage2"
FORMAT_VERSION = 1
STATS_NAME = "stats.json"
LISTS_NAME = "lists.npz"
SIMILARITY_NAME = "similarity.npz"

GEO = ["geo_location_country", "geo_location_state"]
HASHED = [c for c in F.ONEHOT_FEATURES if c not in GEO] + GEO
CTR_COLUMNS = list(F.CTR_THRESHOLDS)
COUNT_INPUTS = [c[: -len("_count")] for c in F.COUNT_FEATURES]
DAYS_INPUTS = ["publish_time", "publish_time_promo"]
DAYS = [f"{c}_days_since_published" for c in DAYS_INPUTS]
SIMILARITIES = [f"document_id_document_id_promo_sim_{s}" for s in F.SIMILARITY_SOURCES]
LISTS = list(F.LIST_SOURCES)
# The column order of NVTabular's output files (the order of the workflow's output nodes).
COLUMN_ORDER = ([F.LABEL, F.DISPLAY_ID] + HASHED + [f"{c}_ctr" for c in CTR_COLUMNS] + list(F.COUNT_FEATURES)
                + DAYS + SIMILARITIES + LISTS)
MOMENTS_SPLIT_EVERY = 32
# List columns as NVTabular's pyarrow 12 writes them (``list<item: int32>``); pyarrow >= 13 defaults to the
# Parquet-compliant ``list<element: ...>``, which readers of the older files may not expect.
PARQUET_OPTIONS = {"use_compliant_nested_type": False}   # dask's tree reduction width in NVTabular's Normalize fit


# ------------------------------------------------------------------------------------------------ operator definitions
def read_partition(path: str) -> pd.DataFrame:
    import pyarrow.parquet as pq
    return pq.read_table(path).to_pandas()


def _objects(values) -> np.ndarray:
    """Strings as a numpy object array (pandas 3's ``str`` dtype and pandas 1.5's object alike; missing: None/NaN)."""
    return np.asarray(pd.Series(values).to_numpy(dtype=object), dtype=object)


def hash_bucket(values, buckets: int) -> np.ndarray:
    """``HashBucket``: pandas' value hash (``hash_pandas_object(..., index=False)``) modulo ``buckets``, int32."""
    values = np.asarray(values)
    if values.dtype.kind not in "iufb":
        values = _objects(values)
    hashed = pd.util.hash_array(values)
    return (hashed % np.uint64(buckets)).astype(np.int32)


def geo_prefix(geo: np.ndarray, length: int) -> np.ndarray:
    """``US>CA>803`` -> its first ``length`` characters (``str.slice``), missing stays missing."""
    return pd.Series(_objects(geo), dtype=object).str.slice(0, length).to_numpy(dtype=object)


def days_since_published(publish_ms, timestamp) -> np.ndarray:
    """Whole days from publication (epoch ms) to the event; 0 outside [0, 3650]; NaN (unknown) stays NaN."""
    event_ms = np.asarray(timestamp).astype(np.float64) + F.TIMESTAMP_DELTA_MS
    days = np.floor((event_ms - np.asarray(publish_ms).astype(np.float64)) / F.MS_PER_DAY)
    keep = np.isnan(days) | ((days >= 0) & (days <= F.MAX_DAYS_SINCE_PUBLISHED))
    return np.where(keep, days, 0.0)


def log_op(values) -> np.ndarray:
    """``LogOp``: ``log(float32(x) + 1)``, float32."""
    return np.log(np.asarray(values).astype(np.float32) + np.float32(1))


def partition_percentiles(values: np.ndarray) -> Tuple[Optional[List[float]], int]:
    """Dask's per-partition step of ``quantile(0.5)``: the 0th, 50th, 100th percentiles of the non-NaN values."""
    values = values[~np.isnan(values)]
    if not len(values):
        return None, 0
    return [float(v) for v in np.percentile(values, [0.0, 50.0, 100.0])], int(len(values))


def merged_median(parts: Sequence[Tuple[Optional[List[float]], int]]) -> float:
    """Dask's ``merge_percentiles([50], [[0, 50, 100]] * P, parts, method="lower")``: each partition's percentiles
    weighted by the share of its rows below them, sorted by value, and the lowest value whose cumulative weight
    reaches half the rows. The sort is stable (dask's is numpy's quicksort; the same order for up to 5 partitions)."""
    parts = [(np.asarray(v, dtype=np.float64), n) for v, n in parts if n]
    if not parts:
        return float("nan")
    qs = np.array([0.0, 50.0, 100.0])
    weights = np.concatenate([qs[:1], np.diff(qs)])
    values = np.concatenate([v for v, _ in parts])
    counts = np.concatenate([weights * n for _, n in parts])
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(counts[order])
    desired = 50.0 * sum(n for _, n in parts)
    left = min(int(np.searchsorted(cumulative, desired, side="left")), len(values) - 1)
    right = int(np.searchsorted(cumulative, desired, side="right")) - 1
    return float(values[min(left, right)])


PAIRWISE_BLOCK = 128   # numpy's pairwise summation: blocks of up to 128 values, 8 partial sums each
REDUCE_BUFFER = 8192   # numpy 1.x's reduction calls its inner loop on at most this many values at a time


def _pairwise_leaves(start: int, n: int, out: List[Tuple[int, int]]) -> None:
    if n <= PAIRWISE_BLOCK:
        out.append((start, n))
        return
    half = n // 2
    half -= half % 8
    _pairwise_leaves(start, half, out)
    _pairwise_leaves(start + half, n - half, out)


def _pairwise_combine(start: int, n: int, leaf: Dict[int, object]):
    if n <= PAIRWISE_BLOCK:
        return leaf[start]
    half = n // 2
    half -= half % 8
    return _pairwise_combine(start, half, leaf) + _pairwise_combine(start + half, n - half, leaf)


def numpy1_sum(values: np.ndarray):
    """``numpy.sum`` of a contiguous float array as numpy 1.26 computes it (what NVTabular's pandas 1.5 sums give):
    the array cut into runs of 8192 values, each run summed pairwise (blocks of at most 128 values in 8 partial
    sums, halves of multiples of 8 above that), the runs' sums added in order from 0, all in the array's dtype.
    numpy 2 sums float32 otherwise (its own SIMD blocking: a float32 ulp apart at 16,000 values), and without the
    8192-value runs; this is the same sum under both."""
    values = np.ascontiguousarray(values)
    scalar = values.dtype.type
    leaves: List[Tuple[int, int]] = []
    runs = [(start, min(REDUCE_BUFFER, len(values) - start)) for start in range(0, len(values), REDUCE_BUFFER)]
    for start, n in runs:
        _pairwise_leaves(start, n, leaves)
    leaf: Dict[int, object] = {}
    by_length: Dict[int, List[int]] = {}
    for start, n in leaves:
        by_length.setdefault(n, []).append(start)
    for n, starts in by_length.items():   # every leaf of one length at once: the same float ops, vectorized
        block = values[np.asarray(starts)[:, None] + np.arange(n)]
        if n < 8:
            total = np.zeros(len(starts), dtype=values.dtype)
            for i in range(n):
                total = total + block[:, i]
        else:
            partial = block[:, :8].copy()
            i = 8
            while i < n - n % 8:
                partial = partial + block[:, i:i + 8]
                i += 8
            total = (((partial[:, 0] + partial[:, 1]) + (partial[:, 2] + partial[:, 3]))
                     + ((partial[:, 4] + partial[:, 5]) + (partial[:, 6] + partial[:, 7])))
            for j in range(i, n):
                total = total + block[:, j]
        leaf.update(zip(starts, total))
    result = scalar(0)
    for start, n in runs:
        result = scalar(result + _pairwise_combine(start, n, leaf))
    return result


def chunk_moments(values: np.ndarray) -> Tuple[int, float, float]:
    """NVTabular's per-partition moments of a float32 column: (non-null count, float32 sum as float64, float64 sum of
    squares)."""
    values = values[~np.isnan(values)]
    return (int(len(values)), float(np.float64(numpy1_sum(values))),
            float(numpy1_sum(np.square(values.astype(np.float64)))))


def reduce_moments(chunks: Sequence[Tuple[int, float, float]]) -> Dict[str, float]:
    """The partitions' moments summed in dask's tree (``split_every`` 32), then mean and std (ddof 1) as NVTabular's
    ``_finalize_moments`` computes them."""
    level = [(np.int64(n), np.float64(s), np.float64(s2)) for n, s, s2 in chunks]
    while len(level) > 1:
        level = [tuple(numpy1_sum(np.array([c[k] for c in level[i:i + MOMENTS_SPLIT_EVERY]])) for k in range(3))
                 for i in range(0, len(level), MOMENTS_SPLIT_EVERY)]
    n, x, x2 = level[0]
    var = x2 - np.square(x) / n
    div = n - 1
    var = var / (div if div >= 1 else 1)
    if n - 1 == 0:
        var = np.float64("nan")
    return {"count": int(n), "sum": float(x), "sum2": float(x2), "mean": float(x / n), "std": float(np.sqrt(var))}


def normalize(values: np.ndarray, mean: float, std: float) -> np.ndarray:
    """``Normalize``: ``(x - mean) / std`` (``x - mean`` if std is not positive) on a float32 column, float32."""
    values = np.asarray(values, dtype=np.float32)
    out = values - np.float32(mean)
    if std > 0:
        out = out / np.float32(std)
    return out.astype(np.float32)


def click_through_rate(clicks: np.ndarray, count: np.ndarray, threshold: int) -> np.ndarray:
    """clicks / count (float64) where count >= threshold, else 0 (NaN count: unseen in train), float32."""
    ok = count >= threshold     # NaN compares False
    out = np.zeros(len(count), dtype=np.float64)
    np.divide(clicks, count, out=out, where=ok)
    return out.astype(np.float32)


def entry_keys(matrix) -> np.ndarray:
    """``row * columns + column`` of each stored entry of the CSR ``matrix``: sorted when its indices are."""
    rows = np.repeat(np.arange(matrix.shape[0], dtype=np.int64), np.diff(matrix.indptr))
    return rows * matrix.shape[1] + matrix.indices


def row_inner_products(left: np.ndarray, right: np.ndarray, matrix, keys: Optional[np.ndarray] = None) -> np.ndarray:
    """Per pair ``(left[i], right[i])`` of rows of the CSR ``matrix`` (sorted indices), the sum of the products of
    their common columns, accumulated in column order from 0.0 as NVTabular's loop does (float64). ``keys``:
    :func:`entry_keys` of ``matrix``, if computed already."""
    indptr, indices, data = matrix.indptr, matrix.indices, matrix.data
    num_columns = matrix.shape[1]
    out = np.zeros(len(left), dtype=np.float64)
    lengths = (indptr[left + 1] - indptr[left]).astype(np.int64)
    total = int(lengths.sum())
    if total == 0:
        return out
    pair = np.repeat(np.arange(len(left)), lengths)
    starts = np.repeat(indptr[left].astype(np.int64) - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    entry = starts + np.arange(total)                      # the left row's entries, in column order
    if keys is None:
        keys = entry_keys(matrix)
    wanted = right[pair].astype(np.int64) * num_columns + indices[entry]
    found = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    match = keys[found] == wanted
    pair, products = pair[match], data[entry[match]] * data[found[match]]
    if not len(pair):
        return out
    first = np.concatenate([[True], pair[1:] != pair[:-1]])
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(pair)), 0))
    rank = np.arange(len(pair)) - group_start
    for k in range(int(rank.max()) + 1):                   # term by term: sequential sums, vectorized over pairs
        at = rank == k
        out[pair[at]] += products[at]
    return out


# ------------------------------------------------------------------------------------------------ fitted statistics
class Fitted:
    """The fitted stage 2: everything needed to transform joined rows (:meth:`transform`)."""

    def __init__(self, medians: Dict[str, float], moments: Dict[str, Dict[str, float]],
                 groupby: Dict[str, pd.DataFrame], lists: Dict[str, Dict[str, np.ndarray]],
                 similarity_documents: np.ndarray, similarity: Dict[str, object]):
        self.medians, self.moments, self.groupby = medians, moments, groupby
        self.lists, self.similarity_documents, self.similarity = lists, similarity_documents, similarity
        self._lookups: Dict[str, Tuple[pd.Index, np.ndarray, np.ndarray]] = {}
        self._similarity_index = None
        self._similarity_keys: Dict[str, np.ndarray] = {}

    def lookup(self, column: str, values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(clicks, count) of each value in train, float64, NaN where unseen."""
        if column not in self._lookups:
            table = self.groupby[column]
            self._lookups[column] = (pd.Index(table[column].to_numpy()), table["clicked_sum"].to_numpy(np.float64),
                                     table["count"].to_numpy(np.float64))
        index, clicks, count = self._lookups[column]
        position = index.get_indexer(np.asarray(values))
        unseen = position < 0
        clicks, count = clicks[position], count[position]
        clicks[unseen] = np.nan
        count[unseen] = np.nan
        return clicks, count

    def log_counts(self, df: pd.DataFrame) -> Dict[str, np.ndarray]:
        """``FillMissing(0) >> LogOp`` of the training counts (the input of Normalize)."""
        out = {}
        for name, column in zip(F.COUNT_FEATURES, COUNT_INPUTS):
            _, count = self.lookup(column, df[column].to_numpy())
            out[name] = log_op(np.where(np.isnan(count), 0.0, count))
        return out

    def transform_table(self, df: pd.DataFrame):
        """Joined rows -> the output rows as a ``pyarrow.Table`` (``COLUMN_ORDER``, NVTabular's dtypes)."""
        import pyarrow as pa
        columns: Dict[str, object] = {F.LABEL: df[F.LABEL].to_numpy().astype(np.int32),
                                      F.DISPLAY_ID: df[F.DISPLAY_ID].to_numpy()}
        geo = df["geo_location"].to_numpy(dtype=object)
        sources = {"geo_location_country": geo_prefix(geo, 2), "geo_location_state": geo_prefix(geo, 5)}
        for name in HASHED:
            values = sources[name] if name in sources else df[name].to_numpy()
            columns[name] = hash_bucket(values, F.HASH_BUCKET_SIZES[name])
        for column in CTR_COLUMNS:
            clicks, count = self.lookup(column, df[column].to_numpy())
            columns[f"{column}_ctr"] = click_through_rate(clicks, count, F.CTR_THRESHOLDS[column])
        for name, logged in self.log_counts(df).items():
            columns[name] = normalize(logged, self.moments[name]["mean"], self.moments[name]["std"])
        timestamp = df["timestamp"].to_numpy()
        for name, column in zip(DAYS, DAYS_INPUTS):
            days = days_since_published(df[column].to_numpy(), timestamp)
            columns[name] = log_op(np.where(np.isnan(days), self.medians[name], days))
        if self._similarity_index is None:
            self._similarity_index = pd.Index(self.similarity_documents)
        rows = []
        for column in ("document_id", "document_id_promo"):
            position = self._similarity_index.get_indexer(df[column].to_numpy().astype(np.int64))
            rows.append(np.where(position >= 0, position, len(self.similarity_documents)).astype(np.int64))
        for name, suffix in zip(SIMILARITIES, F.SIMILARITY_SOURCES):
            matrix = self.similarity[suffix]
            if suffix not in self._similarity_keys:
                matrix.sort_indices()
                self._similarity_keys[suffix] = entry_keys(matrix)
            columns[name] = row_inner_products(rows[0], rows[1], matrix,
                                               self._similarity_keys[suffix]).astype(np.float32)
        pages = df["document_id"].to_numpy().astype(np.int64)
        for name in LISTS:
            columns[name] = self._list_column(name, pages)
        arrays = [columns[name] if isinstance(columns[name], pa.Array) else pa.array(columns[name])
                  for name in COLUMN_ORDER]
        return pa.Table.from_arrays(arrays, names=COLUMN_ORDER)

    def _list_column(self, name: str, pages: np.ndarray):
        import pyarrow as pa
        table = self.lists[name]
        documents, offsets, codes = table["documents"], table["offsets"], table["codes"]
        position = np.minimum(np.searchsorted(documents, pages), max(len(documents) - 1, 0))
        found = documents[position] == pages if len(documents) else np.zeros(len(pages), bool)
        start = np.where(found, offsets[position], 0)
        lengths = np.where(found, offsets[np.minimum(position + 1, len(offsets) - 1)] - offsets[position], 0)
        row_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        gather = np.repeat(start - row_offsets[:-1], lengths) + np.arange(int(row_offsets[-1]))
        return pa.ListArray.from_arrays(pa.array(row_offsets, pa.int32()),
                                        pa.array(codes[gather].astype(np.int32), pa.int32()))

    def transform(self, df: pd.DataFrame) -> pd.DataFrame:
        """Joined rows (``joins.JOINED_COLUMNS``; e.g. :func:`wide_deep.data.outbrain.tables.join_and_split`'s) ->
        the output rows as written to ``train/`` and ``valid/`` (multi-hot: numpy int32 arrays)."""
        return self.transform_table(df.reset_index(drop=True)).to_pandas()


def list_vocabularies(lists, page_ids: np.ndarray, page_rows: np.ndarray,
                      caps: Optional[Dict[str, int]] = None) -> Dict[str, Dict[str, np.ndarray]]:
    """``Categorify(max_size=cap) >> ListSlice(MAX_HOTNESS)`` fitted per page: ``{name: {documents, offsets, codes,
    vocabulary, vocabulary_count}}``. ``lists`` from :func:`wide_deep.data.outbrain.tables.document_tables`;
    ``page_ids``/``page_rows``: training rows per page. ``caps``: vocabulary caps (default: the features'
    cardinalities)."""
    out = {}
    for name, (documents, document_index, terms) in lists.items():
        cap = (caps or {}).get(name, F.FEATURE_BY_NAME[name].cardinality)
        weight = np.zeros(len(documents), dtype=np.int64)
        if len(documents):
            position = np.minimum(np.searchsorted(documents, page_ids), len(documents) - 1)
            found = documents[position] == page_ids
            np.add.at(weight, position[found], page_rows[found])
        values, inverse = np.unique(terms, return_inverse=True)
        size = np.bincount(inverse.ravel(), weights=weight[document_index], minlength=len(values)).astype(np.int64)
        seen = np.flatnonzero(size > 0)
        order = seen[np.lexsort((values[seen], -size[seen]))]   # count descending, ties by term id
        kept = order[: cap - 3]
        code_of_value = np.full(len(values), 2, dtype=np.int32)
        code_of_value[kept] = 3 + np.arange(len(kept), dtype=np.int32)
        codes = code_of_value[inverse.ravel()]
        starts = np.searchsorted(document_index, np.arange(len(documents) + 1))
        rank = np.arange(len(document_index)) - starts[document_index]
        keep = rank < F.MAX_HOTNESS
        out[name] = {"documents": np.asarray(documents, dtype=np.int64), "codes": codes[keep].astype(np.int32),
                     "offsets": np.searchsorted(document_index[keep], np.arange(len(documents) + 1)).astype(np.int64),
                     "vocabulary": values[kept].astype(np.int64), "vocabulary_count": size[kept]}
    return out


def save_fitted(fitted: Fitted, path: str) -> None:
    """Write ``fitted`` into the directory ``path`` (JSON, parquet, npz; no pickle)."""
    os.makedirs(path, exist_ok=True)
    stats = {"format": FORMAT, "version": FORMAT_VERSION, "columns": COLUMN_ORDER, "medians": fitted.medians,
             "moments": fitted.moments, "hash_buckets": F.HASH_BUCKET_SIZES, "ctr_thresholds": F.CTR_THRESHOLDS,
             "max_hotness": F.MAX_HOTNESS, "list_caps": {n: F.FEATURE_BY_NAME[n].cardinality for n in LISTS},
             "groupby": {c: f"groupby.{c}.parquet" for c in fitted.groupby}}
    for column, table in fitted.groupby.items():
        table.to_parquet(os.path.join(path, stats["groupby"][column]), index=False)
    np.savez(os.path.join(path, LISTS_NAME),
             **{f"{name}.{key}": array for name, arrays in fitted.lists.items() for key, array in arrays.items()})
    matrices = {"documents": fitted.similarity_documents}
    for suffix, m in fitted.similarity.items():
        matrices.update({f"{suffix}.indptr": m.indptr, f"{suffix}.indices": m.indices, f"{suffix}.data": m.data,
                         f"{suffix}.shape": np.asarray(m.shape, dtype=np.int64)})
    np.savez(os.path.join(path, SIMILARITY_NAME), **matrices)
    with open(os.path.join(path, STATS_NAME), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1, sort_keys=True)


_LOADED: Dict[str, Tuple[float, Fitted]] = {}


def load_fitted(path: str, cache: bool = False) -> Fitted:
    """The stage 2 fitted by the default engine and saved in ``path`` (``<output_dir>/workflow``). Reads no pickle.
    ``cache``: keep it for the next call in this process (the ETL's tasks)."""
    import scipy.sparse
    stats_path = os.path.join(path, STATS_NAME)
    if cache and path in _LOADED and _LOADED[path][0] == os.stat(stats_path).st_mtime_ns:
        return _LOADED[path][1]
    with open(stats_path, encoding="utf-8") as f:
        stats = json.load(f)
    if stats.get("format") != FORMAT or stats.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} does not hold a stage 2 fitted by the default engine (format {FORMAT} "
                         f"v{FORMAT_VERSION}); a workflow of --engine nvtabular loads with nvtabular.Workflow.load")
    groupby = {c: pd.read_parquet(os.path.join(path, name)) for c, name in stats["groupby"].items()}
    with np.load(os.path.join(path, LISTS_NAME), allow_pickle=False) as z:
        lists: Dict[str, Dict[str, np.ndarray]] = {}
        for key in z.files:
            name, part = key.split(".", 1)
            lists.setdefault(name, {})[part] = z[key]
    with np.load(os.path.join(path, SIMILARITY_NAME), allow_pickle=False) as z:
        documents = z["documents"]
        similarity = {s: scipy.sparse.csr_matrix((z[f"{s}.data"], z[f"{s}.indices"], z[f"{s}.indptr"]),
                                                 shape=tuple(int(v) for v in z[f"{s}.shape"]))
                      for s in F.SIMILARITY_SOURCES}
    fitted = Fitted(stats["medians"], stats["moments"], groupby, lists, documents, similarity)
    if cache:
        _LOADED.clear()
        _LOADED[path] = (os.stat(stats_path).st_mtime_ns, fitted)
    return fitted


# ------------------------------------------------------------------------------------------------ per-partition tasks
def fit_summary(path: str) -> dict:
    """Fit pass 1 on one training partition: per CTR column (values, clicks, counts), the days' percentiles, the
    training rows per page."""
    df = read_partition(path)
    clicked = df[F.LABEL].to_numpy().astype(np.int64)
    groups = {}
    for column in CTR_COLUMNS:
        values, inverse = np.unique(df[column].to_numpy(), return_inverse=True)
        inverse = inverse.ravel()
        groups[column] = (values, np.bincount(inverse, clicked, len(values)).astype(np.int64),
                          np.bincount(inverse, minlength=len(values)).astype(np.int64))
    timestamp = df["timestamp"].to_numpy()
    days = {name: partition_percentiles(days_since_published(df[column].to_numpy(), timestamp))
            for name, column in zip(DAYS, DAYS_INPUTS)}
    pages, rows = np.unique(df["document_id"].to_numpy().astype(np.int64), return_counts=True)
    return {"rows": len(df), "groups": groups, "days": days, "pages": (pages, rows.astype(np.int64))}


def moments_summary(path: str, fit_dir: str) -> dict:
    """Fit pass 2 on one training partition: the moments of the logged counts (Normalize's input)."""
    df = read_partition(path)
    fitted = _partial_fitted(fit_dir)
    return {"rows": len(df), "moments": {n: chunk_moments(v) for n, v in fitted.log_counts(df).items()}}


def transform_partition(path: str, workflow_dir: str, out_path: str) -> int:
    """Transform one joined partition with the saved statistics and write it to ``out_path``; its rows."""
    import pyarrow.parquet as pq
    table = load_fitted(workflow_dir, cache=True).transform_table(read_partition(path))
    pq.write_table(table, out_path, **PARQUET_OPTIONS)
    return table.num_rows


def _partial_fitted(fit_dir: str) -> Fitted:
    groupby = {c: pd.read_parquet(os.path.join(fit_dir, f"groupby.{c}.parquet")) for c in CTR_COLUMNS}
    return Fitted({}, {}, groupby, {}, np.zeros(0, np.int64), {})


def _run_tasks(client, fn: Callable, args: List[tuple], on_done: Callable[[object], None]) -> list:
    """``fn(*a)`` for each ``a`` in order, here or as tasks of ``client``; ``on_done(result)`` as each finishes."""
    if client is None:
        results = []
        for a in args:
            results.append(fn(*a))
            on_done(results[-1])
        return results
    from distributed import as_completed
    futures = [client.submit(fn, *a, pure=False) for a in args]
    for future in as_completed(futures):
        on_done(future.result())
    return [f.result() for f in futures]


def fit(train_paths: List[str], lists, matrices, workflow_dir: str, client=None,
        on_rows: Optional[Callable[[str, int, int], None]] = None, total_rows: int = 0) -> Fitted:
    """Fit stage 2 on the training partitions and save it in ``workflow_dir``; ``lists``/``matrices`` from
    :func:`wide_deep.data.outbrain.tables.document_tables`."""
    done = [0]
    passes = 2 * max(total_rows, 1)

    def progress(result):
        done[0] += result["rows"]
        if on_rows:
            on_rows("fit workflow on train", done[0], passes)

    summaries = _run_tasks(client, fit_summary, [(p,) for p in train_paths], progress)
    groupby = {}
    for column in CTR_COLUMNS:
        values = np.concatenate([s["groups"][column][0] for s in summaries])
        unique, inverse = np.unique(values, return_inverse=True)
        inverse = inverse.ravel()
        clicks = np.bincount(inverse, np.concatenate([s["groups"][column][1] for s in summaries]), len(unique))
        count = np.bincount(inverse, np.concatenate([s["groups"][column][2] for s in summaries]), len(unique))
        groupby[column] = pd.DataFrame({column: unique, "clicked_sum": clicks.astype(np.int64),
                                        "count": count.astype(np.int64)})
    medians = {name: merged_median([s["days"][name] for s in summaries]) for name in DAYS}
    pages = np.concatenate([s["pages"][0] for s in summaries])
    page_ids, inverse = np.unique(pages, return_inverse=True)
    page_rows = np.bincount(inverse.ravel(), np.concatenate([s["pages"][1] for s in summaries]),
                            len(page_ids)).astype(np.int64)
    del summaries
    os.makedirs(workflow_dir, exist_ok=True)
    for column, table in groupby.items():    # pass 2 reads them (here or on the workers)
        table.to_parquet(os.path.join(workflow_dir, f"groupby.{column}.parquet"), index=False)
    chunks = _run_tasks(client, moments_summary, [(p, workflow_dir) for p in train_paths], progress)
    moments = {name: reduce_moments([c["moments"][name] for c in chunks]) for name in F.COUNT_FEATURES}
    documents, weighted = compact_tfidf(matrices)
    fitted = Fitted(medians, moments, groupby, list_vocabularies(lists, page_ids, page_rows), documents, weighted)
    save_fitted(fitted, workflow_dir)
    return fitted


# ------------------------------------------------------------------------------------------------ output files
def file_groups(num_partitions: int, num_files: int) -> List[List[Tuple[int, int, int]]]:
    """Which rows go to each output file, as NVTabular's ``to_parquet(output_files=num_files)`` writes them: per file
    a list of ``(partition, piece, pieces)``: piece ``piece`` of partition ``partition`` cut in ``pieces`` (1: the
    whole partition). Fewer files than partitions: ``ceil(P / files)`` consecutive partitions a file (files left
    with none are not written, as NVTabular warns); more: dask's ``repartition(npartitions=files)`` first cuts
    partition ``p`` into ``files // P`` pieces (the last partition ``files // P + files % P``), evenly
    (:func:`split_bounds`), then one piece a file."""
    if num_files <= num_partitions:
        split = math.ceil(num_partitions / num_files)
        groups = []
        for i in range(num_files):
            start, stop = i * split, min(i * split + split, num_partitions)
            if start < stop:
                groups.append([(p, 0, 1) for p in range(start, stop)])
        return groups
    div, mod = divmod(num_files, num_partitions)
    pieces = [div] * num_partitions
    pieces[-1] += mod
    return [[(p, k, pieces[p])] for p in range(num_partitions) for k in range(pieces[p])]


def split_bounds(rows: int, pieces: int) -> np.ndarray:
    """dask's ``split_evenly`` bounds."""
    return np.linspace(0, rows, pieces + 1).astype(int)


def write_files(pieces: List[str], out_dir: str, num_files: int) -> List[str]:
    """Rewrite the transformed partitions ``pieces`` (one parquet file each) as ``out_dir/part_<i>.parquet`` per
    :func:`file_groups`, plus NVTabular's ``_file_list.txt`` (paths under ``out_dir``) and ``_metadata``."""
    import pyarrow.parquet as pq
    names = []
    groups = file_groups(len(pieces), num_files)
    if len(groups) == len(pieces) and all(g == [(i, 0, 1)] for i, g in enumerate(groups)):
        for i, piece in enumerate(pieces):
            shutil.move(piece, os.path.join(out_dir, f"part_{i}.parquet"))
            names.append(f"part_{i}.parquet")
    else:
        for i, group in enumerate(groups):
            name = f"part_{i}.parquet"
            writer = None
            for partition, k, count in group:
                table = pq.read_table(pieces[partition])
                if count > 1:
                    bounds = split_bounds(table.num_rows, count)
                    table = table.slice(int(bounds[k]), int(bounds[k + 1] - bounds[k]))
                if writer is None:
                    writer = pq.ParquetWriter(os.path.join(out_dir, name), table.schema, **PARQUET_OPTIONS)
                writer.write_table(table)
            writer.close()
            names.append(name)
        for piece in pieces:
            os.remove(piece)
    collected = []
    schema = None
    for name in names:
        meta = pq.read_metadata(os.path.join(out_dir, name))
        meta.set_file_path(name)
        collected.append(meta)
        schema = schema or pq.read_schema(os.path.join(out_dir, name))
    if schema is not None:
        pq.write_metadata(schema, os.path.join(out_dir, "_metadata"), metadata_collector=collected,
                          **PARQUET_OPTIONS)
    with open(os.path.join(out_dir, "_file_list.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join([str(len(names))] + [os.path.join(out_dir, n) for n in names]) + "\n")
    return names


def transform(paths: List[str], workflow_dir: str, out_dir: str, num_files: int, client=None,
              on_rows: Optional[Callable[[str, int, int], None]] = None, what: str = "transform",
              total_rows: int = 0) -> List[str]:
    """Transform the joined partitions ``paths`` with the statistics in ``workflow_dir`` and write ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    done = [0]

    def progress(rows):
        done[0] += rows
        if on_rows:
            on_rows(what, done[0], max(total_rows, done[0]))

    pieces = [os.path.join(out_dir, f".piece_{i}.parquet") for i in range(len(paths))]
    _run_tasks(client, transform_partition, [(p, workflow_dir, o) for p, o in zip(paths, pieces)], progress)
    return write_files(pieces, out_dir, num_files)
