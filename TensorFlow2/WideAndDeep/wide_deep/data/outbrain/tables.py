"""Stage 1 on whole tables and the page catalogue, with pandas, numpy and scipy only (no NVTabular): both ETL engines
and the tests use these.

- :func:`join_and_split` (pandas; NVIDIA did this with cuDF): ``clicks_train`` ⋈ ``events`` (display_id) ⋈
  ``promoted_content`` (ad_id; its document_id becomes ``document_id_promo``) ⋈ ``documents_meta`` on
  ``document_id`` and again on ``document_id_promo`` (suffix ``_promo``), then the train/valid split: the definition
  the out-of-core stage 1 (:mod:`wide_deep.data.outbrain.joins`) is tested against.
- :func:`document_tables`: per-document id lists (ordered by confidence) and document x term confidence matrices.
- :func:`compact_tfidf`: NVTabular's ``ColumnSimilarity(metric="tfidf")`` weights, computed once, rows only for pages
  with terms; :func:`similarity_row` maps page ids to its rows.

(Moved here from ``nvtabular/workflow.py``, which imports them back: ``from
wide_deep.data.outbrain.nvtabular.workflow import join_and_split`` keeps working where NVTabular is installed.)
"""
from __future__ import annotations

import weakref
from typing import Dict, Tuple

import numpy as np
import pandas as pd
import scipy.sparse

from . import features as F
from .joins import empty_split_error, is_train, join_rows, prepare_documents_meta, prepare_promoted
from .raw import frame_terms


def join_and_split(tables: Dict[str, pd.DataFrame], seed: int = 0) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Stage 1 on whole in-memory tables: the joined training and validation tables (columns ``JOINED_COLUMNS``),
    sorted by display_id. The ETL computes the same rows out of core (:mod:`wide_deep.data.outbrain.joins`); this
    is the definition the tests hold it to, and the way to run stage 1 on frames (the real sample's rows).

    ``tables`` are the typed raw tables of :mod:`wide_deep.data.outbrain.raw`. Raises :class:`EmptySplitError` when
    either set would be empty.
    """
    df = join_rows(tables["clicks_train"], tables["events"], prepare_promoted(tables["promoted_content"]),
                   prepare_documents_meta(tables["documents_meta"]))
    displays = df["display_id"].nunique()
    train_mask = is_train(df, np.random.default_rng(seed).random(displays))
    train = df[train_mask].sort_values(["display_id", "ad_id"], kind="stable").reset_index(drop=True)
    valid = df[~train_mask].sort_values(["display_id", "ad_id"], kind="stable").reset_index(drop=True)
    for name, part in (("training", train), ("validation", valid)):
        if len(part) == 0:
            raise empty_split_error(name, len(df))
    return train, valid


DocumentLists = Tuple[np.ndarray, np.ndarray, np.ndarray]


def document_tables(tables: Dict[str, pd.DataFrame], document_ids: np.ndarray
                    ) -> Tuple[Dict[str, DocumentLists], Dict[str, scipy.sparse.coo_matrix]]:
    """Per-document id lists (``LIST_SOURCES``) and document x term matrices (``SIMILARITY_SOURCES``).

    ``tables``: per ``documents_*`` source, the typed frame, or the ``(document ids, term codes, confidences)``
    arrays of :func:`wide_deep.data.outbrain.raw.read_document_terms` (what the ETL passes: no Python strings).

    A list is ``(documents, document_index, terms)``: ``documents`` the sorted ``document_ids`` (every page the
    workflow will look up), then one (index into ``documents``, term id) pair per list element, grouped by document
    in document order, each document's terms by confidence, highest first (ties by id); a page without topics,
    say, has none. Entity ids (hex strings) become integers: their rank among the sorted distinct ids.
    Matrix rows are document ids; the matrix has two spare rows at the end, so id -1 (an ad without
    ``promoted_content``) indexes an empty row and gets similarity 0.
    """
    document_ids = np.unique(np.asarray(document_ids, dtype=np.int64))
    document_ids = document_ids[document_ids >= 0]
    # (document ids, term codes, confidences) per source; a frame's term ids become integers (entity ids are hex
    # strings: their rank among the sorted distinct ids, so codes do not depend on row order).
    term_codes = {source: tables[source] if isinstance(tables[source], tuple) else
                  frame_terms(tables[source], column) for source, column in set(F.LIST_SOURCES.values())}
    num_rows = int(max(document_ids.max(initial=0), max(
        (int(docs.max()) for docs, _, _ in term_codes.values() if len(docs)), default=0))) + 2
    lists, matrices = {}, {}
    pages = pd.Index(document_ids)
    for list_name, (source, _) in F.LIST_SOURCES.items():
        docs, codes, conf = term_codes[source]
        # Only the pages the workflow looks up are sorted (the sort is this function's largest cost).
        position = pages.get_indexer(docs)
        known = position >= 0
        docs, codes, conf, position = docs[known], codes[known], conf[known], position[known]
        order = np.lexsort((codes, -conf, docs))   # per document: highest confidence first, ties by id
        lists[list_name] = (document_ids, position[order], codes[order])
    for suffix, (source, _) in F.SIMILARITY_SOURCES.items():
        docs, codes, conf = term_codes[source]
        keep = docs < num_rows
        # Columns = the terms that occur (every column has a document frequency > 0, as TF-IDF's idf needs).
        columns = _dense_codes(codes[keep])
        # COO, not CSR: a CSR matrix holds an index entry for every row up to the largest document *id* (30x the
        # pages in the generator's data: 3 x 290 MB at 20M clicks rows), a COO one only its non-zeros.
        matrices[suffix] = _canonical_coo(conf[keep], docs[keep], columns, num_rows)
    return lists, matrices


def _dense_codes(codes: np.ndarray) -> np.ndarray:
    """``np.unique(codes, return_inverse=True)[1]``: each code's index among the sorted distinct codes. Term codes
    are small non-negative integers (ids, ranks), so a presence table does it without sorting (np.unique sorted the
    6 to 8M codes of each table: 16 s under load at the real catalogue's size)."""
    if len(codes) and codes.min() >= 0 and codes.max() < 4 * len(codes) + (1 << 20):
        present = np.zeros(int(codes.max()) + 1, dtype=bool)
        present[codes] = True
        return (np.cumsum(present) - 1)[codes]
    return np.unique(codes, return_inverse=True)[1]


def _canonical_coo(data: np.ndarray, rows: np.ndarray, columns: np.ndarray, num_rows: int
                   ) -> scipy.sparse.coo_matrix:
    """The COO matrix in canonical form (row-major, one entry per cell: the order a CSR matrix gives), what
    ``coo_matrix.sum_duplicates()`` makes, sorted on one int64 key (row x columns + column) instead of scipy's
    two-key lexsort (30 s for the three tables under load at the real catalogue's size, the sort 1.3 s). Cells
    given twice go through scipy's own ``sum_duplicates``, so their sums are scipy's."""
    num_columns = int(columns.max(initial=0)) + 1
    matrix = scipy.sparse.coo_matrix((data, (rows, columns)), shape=(num_rows, num_columns))
    if num_rows * num_columns >= 1 << 62:
        matrix.sum_duplicates()
        return matrix
    key = rows.astype(np.int64) * num_columns + columns
    order = np.argsort(key, kind="stable")
    if len(key) > 1 and not (np.diff(key[order]) > 0).all():
        matrix.sum_duplicates()
        return matrix
    matrix = scipy.sparse.coo_matrix((data[order], (rows[order], columns[order])), shape=(num_rows, num_columns))
    matrix.has_canonical_format = True
    return matrix


def compact_tfidf(matrices: Dict[str, scipy.sparse.coo_matrix]
                  ) -> Tuple[np.ndarray, Dict[str, scipy.sparse.csr_matrix]]:
    """NVTabular's ``ColumnSimilarity(metric="tfidf")`` preparation (idf = log(rows / document frequency), then each
    row scaled to unit length), done here once, with the matrices' rows cut down to the documents that have terms.

    Returns ``(documents, {suffix: csr})``: row ``i`` of each matrix is document ``documents[i]``, and one last row
    is empty (every other id: similarity 0). ``rows`` in the idf stays the original row count (largest document id
    + 2), so the weights, and the similarities computed with ``metric="inner"`` from them, are NVTabular's, in the
    same order of floating-point operations. What it saves: ``ColumnSimilarity`` keeps two CSR copies of each
    matrix, with a row per document id up to the largest one.
    """
    documents = np.unique(np.concatenate([m.row for m in matrices.values()] + [np.zeros(0, np.int32)]))
    out = {}
    for suffix, m in matrices.items():
        idf = np.log(float(m.shape[0]) / np.bincount(m.col))
        data = m.data * idf[m.col]
        row = np.searchsorted(documents, m.row)
        data = data / np.sqrt(np.bincount(row, data ** 2, minlength=len(documents)))[row]
        out[suffix] = scipy.sparse.csr_matrix((data, (row, m.col)), shape=(len(documents) + 1, m.shape[1]))
    return documents.astype(np.int64), out


_INDEXES: Dict[int, tuple] = {}


def cached_index(values: np.ndarray) -> pd.Index:
    """A ``pandas.Index`` (hash table) over the unique ``values``, built once per array object and dropped with it.

    The operators below look every row's id up in arrays of up to 3M ids (the real catalogue's pages), per
    partition; ``np.searchsorted`` of 1M unsorted ids into them took about 0.5 s per lookup (cache misses), a
    hash lookup a tenth of that, and the table is shared by the three lists and the three similarities."""
    key = id(values)
    hit = _INDEXES.get(key)
    if hit is not None and hit[0]() is values:
        return hit[1]
    index = pd.Index(np.array(values, copy=True))   # a copy: the cache must not keep ``values`` alive
    _INDEXES[key] = (weakref.ref(values, lambda _, key=key: _INDEXES.pop(key, None)), index)
    return index


def similarity_row(documents: np.ndarray, col):
    """Document id -> its row in :func:`compact_tfidf`'s matrices (the last, empty row for a page without terms,
    -1 for an ad without ``promoted_content``, or a page unseen when the workflow was fitted)."""
    ids = np.asarray(col.to_numpy() if hasattr(col, "to_numpy") else col, dtype=np.int64)
    position = cached_index(documents).get_indexer(ids)
    return type(col)(np.where(position >= 0, position, len(documents)).astype(np.int64), index=col.index)
