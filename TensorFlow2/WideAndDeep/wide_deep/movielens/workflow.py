"""The MovieLens ETL's own fitted workflow: genres join, categorical vocabularies, label; fit, save, load, transform.

No NVTabular: pyarrow and numpy only, a part at a time (memory: one part plus the vocabularies), and the same results
under pandas 1.5 / numpy 1.26 / pyarrow 12 and pandas 3 / numpy 2 / pyarrow 26 (nothing here goes through pandas).

The encoding is the one NVTabular 23.8's ``Categorify`` (default options) defines:

    index 0        padding (never produced)
    index 1        null (a missing value)
    index 2        out of vocabulary (a value never seen in the fitted data: train)
    index 3 + k    the k-th vocabulary entry; entries in decreasing number of occurrences in the fitted data, and
                   equally frequent values in increasing value order (numbers numerically, strings by code point)

A list column (``genres``) is encoded value by value and keeps its lists (its vocabulary counts every value of every
list). The embedding table of a column needs ``len(vocabulary) + 3`` rows (``cardinality``: what NVTabular's
``get_embedding_sizes`` gives with default options).

Tie order: NVTabular sorts the value-ordered vocabulary by count with pandas' default unstable quicksort, so among
equally frequent values its order is whatever numpy's quicksort does with them, which differs between numpy 1.26
and numpy 2.x and between CPUs (AVX-512 or not); it is not a definition to reproduce. Ours is the order a stable sort
of that same value-ordered table gives (NVTabular's own order wherever its sort happens to keep ties in place, e.g.
fewer than 17 values or no ties). Every other part of the output is NVTabular's value for value.

Saved (``save(path)``, loaded by :func:`load_workflow`; no pickle)::

    workflow.json                 format, version, the columns, offsets, cardinalities, label rule, join key
    vocab.<column>.parquet        <column>, <column>_size (occurrences in train), row k = index 3 + k
    movies.parquet                movieId (int64), genres (list<string>): the joined table
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterable, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recsys_common.cli import InputError

FORMAT = "wide_deep.movielens.workflow"
VERSION = 1
USER, ITEM, GENRES, LABEL = "userId", "movieId", "genres", "rating"
CATEGORICAL = (USER, ITEM, GENRES)
POSITIVE_ABOVE = 3
PAD_INDEX, NULL_INDEX, OOV_INDEX, FIRST_INDEX = 0, 1, 2, 3
SPEC_FILE = "workflow.json"
MOVIES_FILE = "movies.parquet"
OUTPUT_SCHEMA = pa.schema([(USER, pa.int64()), (ITEM, pa.int64()), (GENRES, pa.list_(pa.int64())),
                           (LABEL, pa.int8())])


class WorkflowFormatError(InputError):
    """A workflow directory that is not this module's (or is damaged): the message names the file."""


def movies_table(movie_ids: Iterable[int], genres: Iterable[List[str]]) -> pa.Table:
    """``movieId`` (int64) and ``genres`` (list<string>), sorted by movieId (the join looks ids up by bisection)."""
    table = pa.table({ITEM: pa.array(np.asarray(list(movie_ids), dtype=np.int64)),
                      GENRES: pa.array([list(g) for g in genres], type=pa.list_(pa.string()))})
    return table.take(pc.sort_indices(table, sort_keys=[(ITEM, "ascending")]))


def _as_table(ratings) -> pa.Table:
    if isinstance(ratings, pa.Table):
        return ratings
    return pa.Table.from_pandas(ratings[[USER, ITEM, LABEL]], preserve_index=False)


def _column_array(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


class _Counts:
    """Running occurrence counts of one column's values (nulls not counted), merged a part at a time."""

    def __init__(self, name: str):
        self.name = name
        self.table: Optional[pa.Table] = None

    def add(self, values: pa.Array) -> None:
        values = values.drop_null()
        if not len(values):
            return
        counted = pc.value_counts(values)
        part = pa.table({"value": counted.field("values"), "count": counted.field("counts").cast(pa.int64())})
        if self.table is not None:
            merged = pa.concat_tables([self.table, part]).group_by("value").aggregate([("count", "sum")])
            part = merged.select(["value", "count_sum"]).rename_columns(["value", "count"])
        self.table = part

    def vocabulary(self, value_type: pa.DataType) -> pa.Table:
        """``<name>, <name>_size`` in encoding order: count descending, then value ascending."""
        if self.table is None:
            return pa.table({self.name: pa.array([], type=value_type), f"{self.name}_size": pa.array([], pa.int64())})
        ordered = self.table.take(pc.sort_indices(self.table, sort_keys=[("count", "descending"),
                                                                          ("value", "ascending")]))
        return pa.table({self.name: ordered.column("value").cast(value_type),
                         f"{self.name}_size": ordered.column("count")})


class MovieLensWorkflow:
    """Join genres, encode ``userId``/``movieId``/``genres`` with the fitted vocabularies, label ``rating > 3``."""

    def __init__(self, movies: pa.Table, vocabularies: Optional[Dict[str, pa.Table]] = None):
        self.movies = movies
        self._movie_ids = _column_array(movies, ITEM).to_numpy(zero_copy_only=False)
        if len(self._movie_ids) > 1 and not (np.diff(self._movie_ids) > 0).all():
            raise ValueError("movies: movieId must be unique and sorted (use movies_table)")
        self.vocabularies: Dict[str, pa.Table] = dict(vocabularies or {})
        self._counts: Dict[str, _Counts] = {}

    # ------------------------------------------------------------------------------------------------- join
    def join(self, ratings) -> pa.Table:
        """``userId, movieId, genres, rating``: each rating with its movie's genres (null for a movie the movies
        table lacks: NVTabular's left ``JoinExternal``), row order kept."""
        table = _as_table(ratings)
        items = _column_array(table, ITEM).cast(pa.int64()).to_numpy(zero_copy_only=False)
        pos = np.searchsorted(self._movie_ids, items)
        clipped = np.minimum(pos, max(len(self._movie_ids) - 1, 0))
        missing = (self._movie_ids[clipped] != items) if len(self._movie_ids) else np.ones(len(items), bool)
        genres = _column_array(self.movies, GENRES).take(pa.array(clipped, mask=missing, type=pa.int64()))
        return pa.table({USER: _column_array(table, USER), ITEM: _column_array(table, ITEM), GENRES: genres,
                         LABEL: _column_array(table, LABEL)})

    # -------------------------------------------------------------------------------------------------- fit
    def fit_part(self, ratings) -> None:
        """Count the categorical values of one part of the training ratings (call for every part, then
        :meth:`finish_fit`)."""
        joined = self.join(ratings)
        for name in CATEGORICAL:
            values = _column_array(joined, name)
            if pa.types.is_list(values.type):
                values = values.flatten()
            self._counts.setdefault(name, _Counts(name)).add(values)

    def finish_fit(self) -> "MovieLensWorkflow":
        types = {USER: pa.int64(), ITEM: pa.int64(), GENRES: pa.string()}
        self.vocabularies = {name: self._counts.get(name, _Counts(name)).vocabulary(types[name])
                             for name in CATEGORICAL}
        self._counts = {}
        return self

    def fit(self, parts: Iterable) -> "MovieLensWorkflow":
        for part in parts:
            self.fit_part(part)
        return self.finish_fit()

    def cardinalities(self) -> Dict[str, int]:
        """Embedding rows per column: the vocabulary plus padding, null and out-of-vocabulary."""
        return {name: len(self.vocabularies[name]) + FIRST_INDEX for name in CATEGORICAL}

    # -------------------------------------------------------------------------------------------- transform
    def _encode(self, name: str, values: pa.Array) -> np.ndarray:
        vocab = self.vocabularies[name].column(name)
        if values.type != vocab.type:
            values = values.cast(vocab.type)
        pos = pc.index_in(values, value_set=vocab.combine_chunks() if isinstance(vocab, pa.ChunkedArray) else vocab)
        codes = pc.fill_null(pos.cast(pa.int64()), OOV_INDEX - FIRST_INDEX).to_numpy(zero_copy_only=False) \
            + FIRST_INDEX
        if values.null_count:
            codes[values.is_null().to_numpy(zero_copy_only=False)] = NULL_INDEX
        return codes.astype(np.int64)

    def transform_table(self, ratings) -> pa.Table:
        """Raw ratings (``userId, movieId, rating``; a pandas DataFrame or a pyarrow Table) -> the output columns
        ``userId, movieId`` (int64), ``genres`` (list<int64>), ``rating`` (int8 0/1), row for row."""
        if not self.vocabularies:
            raise ValueError("the workflow is not fitted: call fit() or load_workflow()")
        joined = self.join(ratings)
        columns = {}
        for name in (USER, ITEM):
            columns[name] = pa.array(self._encode(name, _column_array(joined, name)), pa.int64())
        genres = _column_array(joined, GENRES)
        lengths = pc.fill_null(pc.list_value_length(genres), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = np.zeros(len(genres) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        flat = self._encode(GENRES, genres.flatten())
        columns[GENRES] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.int64()),
                                                   mask=genres.is_null() if genres.null_count else None)
        rating = _column_array(joined, LABEL).to_numpy(zero_copy_only=False)
        columns[LABEL] = pa.array((rating > POSITIVE_ABOVE).astype(np.int8), pa.int8())
        return pa.table([columns[n] for n in OUTPUT_SCHEMA.names], schema=OUTPUT_SCHEMA)

    def transform(self, ratings):
        """:meth:`transform_table` as a pandas DataFrame (``genres``: lists of ints), the notebook's
        ``workflow.transform(dataset).to_ddf().compute()``."""
        return self.transform_table(ratings).to_pandas()

    # ----------------------------------------------------------------------------------------------- saving
    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        for name in CATEGORICAL:
            pq.write_table(self.vocabularies[name], os.path.join(path, f"vocab.{name}.parquet"))
        pq.write_table(self.movies, os.path.join(path, MOVIES_FILE))
        spec = {"format": FORMAT, "version": VERSION, "columns": list(CATEGORICAL),
                "list_columns": [GENRES],
                "indices": {"pad": PAD_INDEX, "null": NULL_INDEX, "oov": OOV_INDEX, "first": FIRST_INDEX},
                "vocabulary_order": "count descending, then value ascending",
                "cardinalities": self.cardinalities(),
                "join": {"on": ITEM, "table": MOVIES_FILE, "how": "left"},
                "label": {"column": LABEL, "rule": f"{LABEL} > {POSITIVE_ABOVE}", "dtype": "int8"}}
        with open(os.path.join(path, SPEC_FILE), "w", encoding="utf-8") as f:
            json.dump(spec, f, indent=1, sort_keys=True)
            f.write("\n")


def load_workflow(path: str) -> MovieLensWorkflow:
    """The fitted workflow saved in ``path`` (the ETL's ``workflow/``), ready to :meth:`~MovieLensWorkflow.transform`
    new raw ratings as the ETL did."""
    spec_path = os.path.join(path, SPEC_FILE)
    try:
        with open(spec_path, encoding="utf-8") as f:
            spec = json.load(f)
    except FileNotFoundError:
        raise WorkflowFormatError(f"{spec_path}: no such file (not a workflow directory of "
                                  f"wide_deep.movielens.etl)") from None
    if spec.get("format") != FORMAT or spec.get("version") != VERSION:
        raise WorkflowFormatError(f"{spec_path}: format {spec.get('format')!r} version {spec.get('version')!r}, "
                                  f"expected {FORMAT!r} version {VERSION}")
    vocabularies = {}
    for name in CATEGORICAL:
        table = pq.read_table(os.path.join(path, f"vocab.{name}.parquet"))
        if table.column_names != [name, f"{name}_size"]:
            raise WorkflowFormatError(f"{os.path.join(path, f'vocab.{name}.parquet')}: columns "
                                      f"{table.column_names}, expected {[name, name + '_size']}")
        vocabularies[name] = table
    movies = pq.read_table(os.path.join(path, MOVIES_FILE))
    return MovieLensWorkflow(movies, vocabularies)


def workflow_from_nvtabular_categories(categories_dir: str, movies: pa.Table) -> MovieLensWorkflow:
    """Our workflow with the vocabularies NVTabular fitted (its ``categories/unique.<column>.parquet``, in its
    order): so the output of ``--engine nvtabular`` loads with :func:`load_workflow` too."""
    vocabularies = {}
    for name in CATEGORICAL:
        table = pq.read_table(os.path.join(categories_dir, f"unique.{name}.parquet"),
                              columns=[name, f"{name}_size"])
        table = table.replace_schema_metadata(None)
        values = table.column(name)
        keep = pc.invert(pc.is_null(values))   # NVTabular's tables hold no null row by default; drop one if there
        vocabularies[name] = table.filter(keep)
    return MovieLensWorkflow(movies, vocabularies)

