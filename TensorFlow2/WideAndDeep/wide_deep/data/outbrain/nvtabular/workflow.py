"""The Outbrain feature engineering: joins and split (pandas), then one NVTabular workflow (the 29 features).

Reference B.4, in two stages:

1. :func:`join_and_split` (pandas; NVIDIA did this with cuDF): ``clicks_train`` ⋈ ``events`` (display_id) ⋈
   ``promoted_content`` (ad_id; its document_id becomes ``document_id_promo``) ⋈ ``documents_meta`` on
   ``document_id`` and again on ``document_id_promo`` (suffix ``_promo``). ``publisher_id`` missing in
   ``documents_meta`` gets a new unique id per document; ids still missing after the joins (a page absent from
   ``documents_meta``) become -1. ``platform``: missing -> 1, then minus 1. Split per display: train if its day
   (``timestamp // 86,400,000``) is <= 10 and its U(0,1) draw is > 0.2, else valid. The draws come from
   ``numpy.random.default_rng(seed)`` over the sorted display ids (not cupy's stream as in NVIDIA's code), so the
   split is the same whatever the partitioning. Both sets are sorted by display_id (valid must be: MAP@12 groups
   a display's ads).
   :func:`document_tables` builds, from ``documents_{topics,entities,categories}``, the per-document id lists
   (ordered by confidence, highest first) and the sparse document x term confidence matrices of the similarities.

2. :func:`build_workflow` (NVTabular; fitted on train, applied to train and valid):
   - ``geo_location`` -> ``geo_location_country`` (first 2 characters), ``geo_location_state`` (first 5);
   - ``publish_time[_promo]`` -> days between event and publication (0 outside [0, 3650]) -> ``FillMedian`` ->
     ``LogOp``: ``publish_time[_promo]_days_since_published``;
   - ``JoinGroupby(cont_cols=[clicked], stats=[sum, count])`` over ``CTR_INPUTS`` -> ``<col>_ctr`` = sum / count,
     0 where count < ``CTR_THRESHOLDS[col]`` or the value was not in train (:class:`ClickThroughRate`);
     ``ad_id_count``, ``document_id_promo_count`` -> ``FillMissing(0)`` -> ``LogOp`` -> ``Normalize``;
   - ``ColumnSimilarity(metric="tfidf", on_device=False)`` between ``document_id`` and ``document_id_promo`` over
     the categories, topics and entities matrices: ``document_id_document_id_promo_sim_<categories|topics|entities>``;
   - ``JoinExternal`` of the page's topic / entity / category lists -> ``Categorify(max_size=cardinality)`` ->
     ``ListSlice(3)``: ``topic_id_list``, ``entity_id_list``, ``category_id_list``;
   - the 13 one-hot categoricals -> ``HashBucket(HASH_BUCKET_SIZES)`` (int32 ids in ``[0, buckets)``; our
     :class:`ValueHashBucket`, because NVTabular 23.8's CPU hash also hashes the row index);
   - numericals cast to float32, ``clicked`` to int32, ``display_id`` kept (int64) for MAP@12.

Where NVIDIA used ``HashBucket`` on the lists too, we use ``Categorify``'s ``max_size`` cap: on CPU NVTabular 23.8's
``HashBucket`` cannot hash list columns. Every operator here runs on CPU (``Dataset(..., cpu=True)``) and GPU.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import nvtabular as nvt
import pandas as pd
import scipy.sparse
from nvtabular import ops
from nvtabular.ops import join_groupby as _join_groupby

from .. import features as F
from ..joins import JOINED_COLUMNS  # noqa: F401  (API)
# Stage 1 and the catalogue helpers live in ``tables`` (no NVTabular there); imported back here, where they were.
from ..tables import (DocumentLists, cached_index, compact_tfidf, document_tables, join_and_split,  # noqa: F401
                      similarity_row)  # (API)

# NVTabular 23.8 casts JoinGroupby's joined ``count`` to int32. On CPU (pandas) a value unseen in training joins as
# NaN and that cast raises IntCastingNaNError (cuDF keeps a null instead). Counts stay float64 here, NaN until
# FillMissing; they end as float32 features either way. Set on import, so Dask workers that unpickle this
# workflow (and import this module) get it too.
_join_groupby.AGG_DTYPES["count"] = np.float64


# ------------------------------------------------------------------------------------------------ stage 2: NVTabular
def country(col):
    """``US>CA>803`` -> ``US``."""
    return col.str.slice(0, 2)


def state(col):
    """``US>CA>803`` -> ``US>CA``."""
    return col.str.slice(0, 5)


def days_since_published(col, df):
    """Whole days from publication (``col``, epoch ms) to the event; 0 outside [0, 3650]; NaN stays NaN."""
    event_ms = df["timestamp"].astype("float64") + F.TIMESTAMP_DELTA_MS
    days = np.floor((event_ms - col.astype("float64")) / F.MS_PER_DAY)
    return days.where(days.isna() | ((days >= 0) & (days <= F.MAX_DAYS_SINCE_PUBLISHED)), 0.0)


def to_float32(col):
    return col.astype("float32")


def to_int32(col):
    return col.astype("int32")


class ClickThroughRate(ops.Operator):
    """``<col>_clicked_sum``, ``<col>_count`` (from ``JoinGroupby``) -> ``<col>_ctr`` (float32).

    CTR = sum / count where count >= ``thresholds[col]``, else 0 (too few impressions to trust; a value unseen in
    training has no count and gets 0 too).
    """

    def __init__(self, thresholds: Dict[str, int]):
        super().__init__()
        self.thresholds = dict(thresholds)

    def transform(self, col_selector, df):
        out = {}
        for column, threshold in self.thresholds.items():
            clicks = df[f"{column}_clicked_sum"].astype("float64")
            count = df[f"{column}_count"].astype("float64")
            out[f"{column}_ctr"] = (clicks / count).where(count >= threshold, 0.0).fillna(0.0).astype("float32")
        return type(df)(out, index=df.index)

    def column_mapping(self, col_selector):
        return {f"{c}_ctr": [f"{c}_clicked_sum", f"{c}_count"] for c in self.thresholds}

    @property
    def output_dtype(self):
        return np.float32


class ValueHashBucket(ops.HashBucket):
    """``HashBucket`` whose CPU path hashes values only.

    merlin-core 23.8 hashes a pandas column with ``pandas.util.hash_pandas_object(index=True)``, so on CPU equal
    values in different rows (or partitions) land in different buckets. Here a pandas column is hashed with
    ``index=False``; a cuDF column goes to NVTabular's own (value) hash. CPU and GPU bucket ids differ, as
    NVTabular's CPU and GPU hashes always did.
    """

    def transform(self, col_selector, df):
        if not isinstance(df, pd.DataFrame):
            return super().transform(col_selector, df)
        buckets = (self.num_buckets if isinstance(self.num_buckets, dict)
                   else {name: self.num_buckets for name in col_selector.names})
        for column, count in buckets.items():
            hashed = pd.util.hash_pandas_object(df[column], index=False).to_numpy()
            df[column] = (hashed % np.uint64(count)).astype(self.output_dtype)
        return df


class IndexedJoinGroupby(ops.JoinGroupby):
    """``JoinGroupby`` whose CPU transform looks the statistics up instead of merging them in.

    NVTabular 23.8 reads each column's statistics file and merges it into every partition (a pandas merge hashes
    the statistics again each time, then the rows are sorted back): 37 of 64 s of the transform at 2M rows with the
    real catalogue. Here the statistics are read once per process and looked up with a hash index; the output
    columns, values and dtypes are the merge's (NaN for a value unseen in training; an integer statistic becomes
    float64 where a row has none, as in a merge). cuDF frames and column groups go to NVTabular's own transform.
    """

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_lookups", None)   # rebuilt on first use in each process
        return state

    def _lookup(self, name: str):
        lookups = self.__dict__.setdefault("_lookups", {})
        path = self.categories[self.storage_name.get(name, name)]
        if path not in lookups:
            from ..joins import KeyedTable
            stats = pd.read_parquet(path)
            lookups[path] = KeyedTable(stats, self.storage_name.get(name, name))
        return lookups[path]

    def transform(self, col_selector, df):
        if not isinstance(df, pd.DataFrame) or any(isinstance(n, (list, tuple)) for n in col_selector.grouped_names):
            return super().transform(col_selector, df)
        out = {}
        for name in col_selector.names:
            if name not in df.columns:
                continue
            for column, values in self._lookup(name).take(df[name].to_numpy()).items():
                if column in out:
                    continue
                agg = next((a for a in _join_groupby.AGG_DTYPES if column.endswith(f"{self.name_sep}{a}")), None)
                out[column] = values.astype(_join_groupby.AGG_DTYPES[agg]) if agg else values
        return pd.DataFrame(out)


class DocumentListCategorify(ops.StatOperator):
    """``document_id`` -> the page's topic, entity and category id lists, encoded as ``JoinExternal`` (the lists per
    row) >> ``Categorify(max_size=cap)`` >> ``ListSlice(max_hotness)`` encode them, computed per document.

    The former chain held one Python list per row and per feature (about 35 us a row on CPU, half of the
    transform). A row's lists depend only on its page, so here: fit counts the training rows of each page
    (``value_counts`` per partition), Categorify's statistic follows as each term's count = the sum of the
    counts of the pages listing it, and the vocabulary is ordered exactly as NVTabular 23.8's ``_write_uniques``
    orders it (values sorted, then the same pandas sort by count, descending) and cut at ``cap - 3`` (pad 0,
    null 1, out-of-vocabulary 2, terms from 3). Each page's first ``max_hotness`` codes are kept; transform looks
    the page up. A page outside ``documents`` (new data through the saved workflow) gets empty lists.

    ``lists``: ``{feature: (documents, document_index, terms)}`` from :func:`document_tables`.
    """

    def __init__(self, lists: Dict[str, DocumentLists], caps: Dict[str, int], max_hotness: int):
        super().__init__()
        self.lists = dict(lists)
        self.caps, self.max_hotness = dict(caps), int(max_hotness)
        self.documents: Dict[str, np.ndarray] = {}
        self.offsets: Dict[str, np.ndarray] = {}
        self.codes: Dict[str, np.ndarray] = {}

    def fit(self, col_selector, ddf):
        return ddf[col_selector.names[0]].value_counts()

    def fit_finalize(self, page_rows):
        page_rows = page_rows.to_pandas() if hasattr(page_rows, "to_pandas") else page_rows
        for name, (documents, document_index, terms) in self.lists.items():
            weight = np.zeros(len(documents), dtype=np.int64)
            ids = page_rows.index.to_numpy(dtype=np.int64)
            position = np.minimum(np.searchsorted(documents, ids), max(len(documents) - 1, 0))
            found = documents[position] == ids if len(documents) else np.zeros(len(ids), bool)
            weight[position[found]] = page_rows.to_numpy(dtype=np.int64)[found]
            values, inverse = np.unique(terms, return_inverse=True)
            size = np.bincount(inverse, weights=weight[document_index], minlength=len(values)).astype(np.int64)
            seen = size > 0
            size_name = f"{name}_size"
            vocabulary = pd.DataFrame({name: values[seen], size_name: size[seen]})
            vocabulary = vocabulary.sort_values([name], na_position="first", ignore_index=True)
            vocabulary = vocabulary.sort_values(size_name, ascending=False, ignore_index=True)
            kept = vocabulary[name].to_numpy()[: self.caps[name] - 3]
            code_of_value = np.full(len(values), 2, dtype=np.int32)
            code_of_value[np.searchsorted(values, kept)] = 3 + np.arange(len(kept), dtype=np.int32)
            codes = code_of_value[inverse]
            # The first max_hotness terms of each document (pairs are grouped by document, in document order).
            starts = np.searchsorted(document_index, np.arange(len(documents) + 1))
            rank = np.arange(len(document_index)) - starts[document_index]
            keep = rank < self.max_hotness
            self.documents[name] = documents
            self.codes[name] = codes[keep]
            self.offsets[name] = np.searchsorted(document_index[keep], np.arange(len(documents) + 1))
        self.lists = {}   # the raw pairs are not needed any more (and not saved with the workflow)

    def clear(self):
        self.documents, self.offsets, self.codes = {}, {}, {}

    def transform(self, col_selector, df):
        ids = df[col_selector.names[0]].to_numpy(dtype=np.int64)
        out = {}
        empty = np.zeros(0, dtype=np.int32)
        pages_of = {}   # the lists share one documents array: look the rows up once
        for name in self.caps:
            documents, offsets, codes = self.documents[name], self.offsets[name], self.codes[name]
            if id(documents) not in pages_of:
                pages_of[id(documents)] = np.unique(cached_index(documents).get_indexer(ids), return_inverse=True)
            pages, inverse = pages_of[id(documents)]
            arrays = np.empty(len(pages), dtype=object)
            # One array per distinct page of the partition, shared by its rows (read only from here on).
            arrays[:] = [codes[offsets[p]:offsets[p + 1]] if p >= 0 else empty for p in pages.tolist()]
            out[name] = arrays[inverse]
        return pd.DataFrame(out, index=df.index)

    def column_mapping(self, col_selector):
        return {name: list(col_selector.names) for name in self.caps}

    @property
    def output_dtype(self):
        return np.int32

    @property
    def output_tags(self):
        from merlin.schema import Tags
        return [Tags.CATEGORICAL, Tags.LIST]

    def _compute_shape(self, col_schema, input_schema):
        return col_schema.with_shape((None, (0, self.max_hotness)))

    def _compute_properties(self, col_schema, input_schema):
        cap = self.caps.get(col_schema.name)
        properties = dict(col_schema.properties)
        properties["value_count"] = {"min": 0, "max": self.max_hotness}
        if cap:
            properties["domain"] = {"min": 0, "max": cap - 1, "name": col_schema.name}
        return col_schema.with_properties(properties)


class CompactColumnSimilarity(ops.ColumnSimilarity):
    """``ColumnSimilarity(metric="inner")`` over :func:`compact_tfidf`'s matrices: each pair's document ids are
    first turned into matrix rows (:func:`similarity_row`). Output: NVTabular's TF-IDF similarity, same columns."""

    def __init__(self, documents: np.ndarray, features: scipy.sparse.csr_matrix):
        super().__init__(features, metric="inner", on_device=False)
        self.documents = documents

    def _initialize_features(self):
        # NVTabular converts the matrix again and keeps a second copy as the right-hand side (176 MB each at 20M
        # generated clicks rows); the matrix is CSR with sorted indices already, and both sides are the same.
        if not self._initialized:
            self.left_features = self.right_features = self.left_features.tocsr()
            self._initialized = True

    def transform(self, col_selector, df):
        rows = type(df)({c: similarity_row(self.documents, df[c]) for c in col_selector.names}, index=df.index)
        return super().transform(col_selector, rows)


def build_workflow(list_tables: Dict[str, DocumentLists], matrices: Dict[str, scipy.sparse.coo_matrix],
                   stats_path: str, client=None, list_encoding: str = "per_page", similarity: str = "compact"):
    """Stage 2: the NVTabular ``Workflow`` producing ``features.OUTPUT_COLUMNS`` from ``JOINED_COLUMNS``.

    ``list_encoding``: ``per_page`` (:class:`DocumentListCategorify`) or ``per_row`` (NVTabular's ``JoinExternal``
    >> ``Categorify`` >> ``ListSlice`` on every row: the same output, several times slower on CPU; kept as the
    reference the tests compare with).

    ``similarity``: ``compact`` (:func:`compact_tfidf`: the TF-IDF weights computed once, rows only for pages with
    terms) or ``nvtabular`` (``ColumnSimilarity(metric="tfidf")`` on the id-indexed matrices: the same values, kept
    as the tests' reference).

    ``stats_path``: where ``Categorify`` and ``JoinGroupby`` write their fitted statistics (``Workflow.save`` copies
    them into the saved workflow). ``client``: a ``distributed.Client`` to fit and transform on, or None.
    """
    geo = ["geo_location"]
    geo_country = geo >> ops.LambdaOp(country) >> ops.Rename(postfix="_country")
    geo_state = geo >> ops.LambdaOp(state) >> ops.Rename(postfix="_state")
    onehot_inputs = [c for c in F.ONEHOT_FEATURES if c not in ("geo_location_country", "geo_location_state")]
    onehot = (onehot_inputs + geo_country + geo_state) >> ValueHashBucket(F.HASH_BUCKET_SIZES)

    days = (["publish_time", "publish_time_promo"]
            >> ops.LambdaOp(days_since_published, dependency=["timestamp"])
            >> ops.Rename(postfix="_days_since_published")
            >> ops.FillMedian() >> ops.LogOp() >> ops.LambdaOp(to_float32))

    stats = F.CTR_INPUTS >> IndexedJoinGroupby(cont_cols=[F.LABEL], stats=["sum", "count"], out_path=stats_path)
    ctr = stats >> ClickThroughRate(F.CTR_THRESHOLDS)
    counts = (stats[F.COUNT_FEATURES] >> ops.FillMissing(0) >> ops.LogOp() >> ops.Normalize()
              >> ops.LambdaOp(to_float32))

    similarities = []
    if similarity == "compact":
        documents, weighted = compact_tfidf(matrices)
        for suffix, matrix in weighted.items():
            similarities.append([["document_id", "document_id_promo"]] >> CompactColumnSimilarity(documents, matrix)
                                >> ops.Rename(postfix=f"_{suffix}") >> ops.LambdaOp(to_float32))
    elif similarity == "nvtabular":   # NVTabular's own TF-IDF on the id-indexed matrices: the tests' reference
        for suffix, matrix in matrices.items():
            similarities.append([["document_id", "document_id_promo"]]
                                >> ops.ColumnSimilarity(matrix, metric="tfidf", on_device=False)
                                >> ops.Rename(postfix=f"_{suffix}") >> ops.LambdaOp(to_float32))
    else:
        raise ValueError(f"similarity must be 'compact' or 'nvtabular', got {similarity!r}")

    caps = {name: F.FEATURE_BY_NAME[name].cardinality for name in list_tables}
    if list_encoding == "per_page":
        multihot = [["document_id"] >> DocumentListCategorify(list_tables, caps, F.MAX_HOTNESS)]
    elif list_encoding == "per_row":   # NVTabular's own chain: the definition DocumentListCategorify is tested against
        multihot = []
        for name, (documents, index, terms) in list_tables.items():
            starts = np.searchsorted(index, np.arange(len(documents) + 1))
            table = pd.DataFrame({"document_id": documents,
                                  name: [terms[starts[i]:starts[i + 1]] for i in range(len(documents))]})
            joined = ["document_id"] >> ops.JoinExternal(table, on="document_id", columns_ext=["document_id", name])
            multihot.append(joined[name] >> ops.Categorify(max_size=caps[name], dtype=np.int32, out_path=stats_path)
                            >> ops.ListSlice(F.MAX_HOTNESS))
    else:
        raise ValueError(f"list_encoding must be 'per_page' or 'per_row', got {list_encoding!r}")

    label = [F.LABEL] >> ops.LambdaOp(to_int32)
    output = label + [F.DISPLAY_ID] + onehot + ctr + counts + days
    for node in similarities + multihot:
        output = output + node
    return nvt.Workflow(output, client=client)
