"""MovieLens ratings -> categorical workflow -> parquet + FeatureSpec (the ETL of the HugeCTR MovieLens notebook).

    python -m wide_deep.movielens.etl --input_dir /data/ml-100k --output_dir /data/movielens
    python -m wide_deep.movielens.etl --input_dir /data/ml-1m --output_dir /data/movielens-1m
    python -m wide_deep.movielens.etl --input_dir /data/ml-25m --output_dir /data/movielens-25m

Input (``--input_dir``): a GroupLens MovieLens directory, recognised by its files:
    ml-100k   ``u.data`` (user \\t item \\t rating \\t timestamp, whole stars 1-5) and ``u.item`` (latin-1, 19
              genre flags)
    ml-1m     ``ratings.dat`` (or ``ratings.dat.gz`` or one partial ``ratings.*.dat.gz``; ``::``-separated, whole
              stars) and ``movies.dat`` (latin-1, ``MovieID::Title::Genre|Genre``)
    csv       ml-20m, ml-25m, ml-latest and ml-latest-small (what the Merlin/HugeCTR MovieLens notebooks use):
              ``ratings.csv`` (header ``userId,movieId,rating,timestamp``, half stars 0.5-5) and ``movies.csv``
              (UTF-8, header ``movieId,title,genres``, titles quoted when they hold a comma, genres ``A|B`` or
              ``(no genres listed)``, which stays one genre value as in the notebooks)

Real size: the ratings are streamed (``recsys_common.movielens_ctr.iter_delimited_columns``, a block at a time),
split and written as raw parquet parts of ``--part_rows`` rows; the workflow then fits and transforms part by part,
so memory depends on ``--part_rows`` (and the vocabularies), not on the number of ratings (ML-25M's 25M ratings
included). Each step prints its progress (rows done of the total, rows/s, time left).

Engines (``--engine``): ``pyarrow`` (the default) is our own workflow (``wide_deep.movielens.workflow``: pyarrow and
numpy, no NVTabular); ``nvtabular`` runs the NVTabular 23.8 workflow (needs nvtabular and merlin-core, e.g. the
``.venv-nvtabular`` environment). Both write the same files with the same values, except the order of equally
frequent values in a vocabulary, which NVTabular leaves to numpy's unstable sort (see the workflow module).

What it computes, as the Merlin MovieLens examples do: ratings split at random into train (1 - ``--valid_fraction``)
and valid with ``--seed``; the workflow joins each rating with its movie's genres (``JoinExternal``),
``Categorify``s ``userId``, ``movieId`` and the genre list ``genres`` (statistics from train only: index 1 null, 2 an
id unseen in train, 3 on the values by decreasing frequency), and turns ``rating`` into the label ``rating > 3`` (int8).

Output (``--output_dir``, staged and moved into place at the end: on any error nothing is written)::

    train/part_<i>.parquet  valid/part_<i>.parquet   userId, movieId (int64), genres (list<int64>), rating (int8
                         0/1); one part per ``--part_rows`` ratings (ml-100k and ml-1m: one part, ``part_0``)
    feature_spec.yaml    recsys_common FeatureSpec: mappings ``train`` and ``test`` (= valid/); channels ``label``
                         [rating], ``onehot_categorical`` [userId, movieId], ``multihot_categorical`` [genres]
                         (``max_hotness`` = most genres of a movie), ``numerical`` []
    workflow/            the fitted workflow: ``wide_deep.movielens.workflow.load_workflow(path)`` (JSON and parquet:
                         workflow.json, vocab.<column>.parquet, movies.parquet); the nvtabular engine adds its
                         own (workflow.pkl, categories/: ``nvtabular.Workflow.load(path)``)

``run_etl(...)`` does it from explicit arguments; ``main(argv)`` is the command line (exit 2 on bad input).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from recsys_common.cli import InputError, run_main
from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import OutputDirectoryError, atomic_directory, check_output_directory
from recsys_common.logger import Progress as _Progress
from recsys_common.movielens_ctr import (MovieLensFormatError, check_rating_range, find_ratings_file,
                                         iter_delimited_columns)

from .workflow import MovieLensWorkflow, movies_table, workflow_from_nvtabular_categories

TOOL = "wide_deep.movielens.etl"
SPEC_NAME = "feature_spec.yaml"
WORKFLOW_DIR = "workflow"
USER, ITEM, GENRES, LABEL = "userId", "movieId", "genres", "rating"
ONEHOT_CHANNEL, MULTIHOT_CHANNEL, NUMERICAL_CHANNEL, LABEL_CHANNEL = (
    "onehot_categorical", "multihot_categorical", "numerical", "label")
# rating > 3 is a positive, as in the Merlin MovieLens examples (4 and 5 stars; 3.5 is not).
POSITIVE_ABOVE = 3
ML100K_GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
                 "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
                 "War", "Western")
DEFAULT_PART_ROWS = 2_000_000
RAW_DIR = "_raw"   # inside the staging directory: the split ratings before the workflow (removed before the move)
ENGINES = ("pyarrow", "nvtabular")
DEFAULT_ENGINE = "pyarrow"


class MovieLensInputError(InputError):
    """The input directory lacks a file, or a line of it is malformed (the message names the file and line)."""


@dataclass(frozen=True)
class Layout:
    """One GroupLens layout: its files, how a ratings line is split, and the ratings it allows."""
    name: str
    ratings: str                 # path of the ratings file
    movies: str                  # path of the movies file
    separator: str
    has_header: bool
    columns: Tuple[str, ...]     # the ratings file's columns (headerless) or its expected header
    user: str
    item: str
    rating: str
    rating_range: Tuple[float, float, float]   # lowest, highest, step
    rating_dtype: str            # what the raw rating column holds in the output of the split (int64 / float64)


def detect_layout(input_dir: str, ratings_file: Optional[str] = None) -> Layout:
    """Recognise the MovieLens layout of ``input_dir`` by its files; raise MovieLensInputError if it is none."""
    if not os.path.isdir(input_dir):
        raise MovieLensInputError(f"{input_dir}: --input_dir is not a directory")

    def there(name):
        return os.path.isfile(os.path.join(input_dir, name))

    if there("u.data"):
        if not there("u.item"):
            raise MovieLensInputError(f"{input_dir}: has u.data but no u.item (the movies' genres)")
        return Layout("ml-100k", ratings_file or os.path.join(input_dir, "u.data"), os.path.join(input_dir, "u.item"),
                      "\t", False, ("user", "item", "rating", "timestamp"), "user", "item", "rating", (1, 5, 1),
                      "int64")
    if there("ratings.csv") or there("movies.csv"):
        if not there("movies.csv"):
            raise MovieLensInputError(f"{input_dir}: has ratings.csv but no movies.csv (the movies' genres: "
                                      f"ml-20m/ml-25m/ml-latest ship both)")
        if not (ratings_file or there("ratings.csv")):
            raise MovieLensInputError(f"{input_dir}: has movies.csv but no ratings.csv")
        return Layout("csv", ratings_file or os.path.join(input_dir, "ratings.csv"),
                      os.path.join(input_dir, "movies.csv"), ",", True, ("userId", "movieId", "rating", "timestamp"),
                      "userId", "movieId", "rating", (0.5, 5.0, 0.5), "float64")
    if there("movies.dat"):
        try:
            path = ratings_file or find_ratings_file(input_dir)
        except FileNotFoundError as e:
            raise MovieLensInputError(str(e)) from None
        return Layout("ml-1m", path, os.path.join(input_dir, "movies.dat"), "::", False,
                      ("UserID", "MovieID", "Rating", "Timestamp"), "UserID", "MovieID", "Rating", (1, 5, 1), "int64")
    raise MovieLensInputError(f"{input_dir}: no MovieLens files found: expected ml-100k (u.data, u.item), ml-1m "
                              f"(ratings.dat, movies.dat) or ml-20m/ml-25m/ml-latest (ratings.csv, movies.csv)")


# ------------------------------------------------------------------------------------------------------- movies
def _read_movies_ml100k(path: str) -> pd.DataFrame:
    ids, genres = [], []
    with open(path, encoding="latin-1") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("|")
            if len(fields) != 5 + len(ML100K_GENRES):
                raise MovieLensInputError(f"{path}:{n}: expected {5 + len(ML100K_GENRES)} '|'-separated fields "
                                          f"(id, title, dates, URL, {len(ML100K_GENRES)} genre flags), got {len(fields)}")
            try:
                ids.append(int(fields[0]))
                flags = [int(x) for x in fields[5:]]
            except ValueError:
                raise MovieLensInputError(f"{path}:{n}: movie id and genre flags must be integers") from None
            genres.append([g for g, flag in zip(ML100K_GENRES, flags) if flag] or ["unknown"])
    return pd.DataFrame({ITEM: np.asarray(ids, dtype=np.int64), GENRES: genres})


def _read_movies_ml1m(path: str) -> pd.DataFrame:
    ids, genres = [], []
    with open(path, encoding="latin-1") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("::")
            if len(fields) != 3:
                raise MovieLensInputError(f"{path}:{n}: expected MovieID::Title::Genres, got {len(fields)} fields")
            try:
                ids.append(int(fields[0]))
            except ValueError:
                raise MovieLensInputError(f"{path}:{n}: MovieID must be an integer, got {fields[0]!r}") from None
            genres.append([g for g in fields[2].strip().split("|") if g] or ["unknown"])
    return pd.DataFrame({ITEM: np.asarray(ids, dtype=np.int64), GENRES: genres})


def _read_movies_csv(path: str) -> pd.DataFrame:
    """``movies.csv`` of ml-20m/25m/latest: header ``movieId,title,genres``, RFC 4180 quoting (titles with commas)."""
    ids, genres = [], []
    with open(path, encoding="utf-8", newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None:
            raise MovieLensInputError(f"{path}: empty file (expected the header movieId,title,genres)")
        if [h.strip() for h in header] != ["movieId", "title", "genres"]:
            raise MovieLensInputError(f"{path}: line 1: header {','.join(header)!r} is not movieId,title,genres")
        for row in rows:
            n = rows.line_num
            if not row:
                continue
            if len(row) != 3:
                raise MovieLensInputError(f"{path}: line {n}: expected 3 fields (movieId, title, genres; a title "
                                          f"with a comma must be quoted), found {len(row)}: {','.join(row)!r}")
            try:
                ids.append(int(row[0]))
            except ValueError:
                raise MovieLensInputError(f"{path}: line {n}: column 'movieId' must be an integer, "
                                          f"got {row[0]!r}") from None
            genres.append([g for g in row[2].strip().split("|") if g] or ["(no genres listed)"])
    return pd.DataFrame({ITEM: np.asarray(ids, dtype=np.int64), GENRES: genres})


def read_movies(layout: Layout) -> pd.DataFrame:
    """The movies file of ``layout`` -> ``movieId`` (int64), ``genres`` (lists of genre names)."""
    reader = {"ml-100k": _read_movies_ml100k, "ml-1m": _read_movies_ml1m, "csv": _read_movies_csv}[layout.name]
    try:
        movies = reader(layout.movies)
    except UnicodeDecodeError as e:
        raise MovieLensInputError(f"{layout.movies}: not {'UTF-8' if layout.name == 'csv' else 'latin-1'} text: "
                                  f"{e}") from None
    if movies.empty:
        raise MovieLensInputError(f"{layout.movies}: no movies")
    duplicated = movies[ITEM].duplicated()
    if duplicated.any():
        raise MovieLensInputError(f"{layout.movies}: movie {int(movies[ITEM][duplicated].iloc[0])} appears twice")
    return movies


# ------------------------------------------------------------------------------------------------------ ratings
def iter_ratings(layout: Layout, movie_ids: np.ndarray) -> Iterator[pd.DataFrame]:
    """Stream the ratings of ``layout`` as DataFrames ``userId, movieId, rating`` (a pyarrow block each).

    Checked on the way: the layout's columns and integers (file, line and column named), ratings inside the
    layout's range, and every movie present in the movies file (``movie_ids``, sorted).
    """
    try:
        for first_line, batch in iter_delimited_columns(layout.ratings, layout.separator, layout.columns,
                                                        [layout.user, layout.item], [layout.rating],
                                                        has_header=layout.has_header, error=MovieLensInputError):
            check_rating_range(layout.ratings, first_line, layout.rating, batch[layout.rating], layout.rating_range,
                               layout.name if layout.name != "csv" else "ml-20m/ml-25m/ml-latest",
                               error=MovieLensInputError)
            items = batch[layout.item]
            found = np.searchsorted(movie_ids, items)
            missing = np.flatnonzero(movie_ids[np.minimum(found, len(movie_ids) - 1)] != items)
            if missing.size:
                i = int(missing[0])
                raise MovieLensInputError(f"{layout.movies}: has no movie {int(items[i])} (rated on line "
                                          f"{first_line + i} of {layout.ratings}; {missing.size} rating(s) of that "
                                          f"block refer to movies it lacks)")
            rating = batch[layout.rating]
            yield pd.DataFrame({USER: batch[layout.user], ITEM: items,
                                LABEL: rating.astype(np.int64) if layout.rating_dtype == "int64" else rating})
    except MovieLensFormatError as e:
        raise MovieLensInputError(str(e)) from None


def read_movielens(input_dir: str, ratings_file: Optional[str] = None) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Read a (small) MovieLens directory whole -> (ratings ``userId, movieId, rating``, movies ``movieId, genres``).

    For tests and notebooks; :func:`run_etl` streams instead. Raises ``MovieLensInputError`` naming the file (and
    line) when a file is missing or malformed, or when a rating names a movie the movies file lacks.
    """
    layout = detect_layout(input_dir, ratings_file)
    movies = read_movies(layout)
    parts = list(iter_ratings(layout, np.sort(movies[ITEM].to_numpy())))
    ratings = pd.concat(parts, ignore_index=True)
    return ratings, movies


class SplitDraw:
    """The seeded train/valid draw of :func:`split_ratings`, one block at a time: drawing the blocks in order gives
    the same draws as one call on the whole file (numpy's ``random`` consumes its stream value by value)."""

    def __init__(self, valid_fraction: float, seed: int):
        if not 0.0 < valid_fraction < 1.0:
            raise ValueError(f"--valid_fraction must be in (0, 1), got {valid_fraction}")
        self.valid_fraction = valid_fraction
        self.rng = np.random.default_rng(seed)

    def __call__(self, rows: int) -> np.ndarray:
        """Boolean ``[rows]``: True for the rows drawn into valid."""
        return self.rng.random(rows) < self.valid_fraction


def split_ratings(ratings: pd.DataFrame, valid_fraction: float, seed: int) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Random train/valid split (the Merlin examples' ``train_test_split``), seeded; row order of each part kept."""
    is_valid = SplitDraw(valid_fraction, seed)(len(ratings))
    train, valid = ratings[~is_valid].reset_index(drop=True), ratings[is_valid].reset_index(drop=True)
    if train.empty or valid.empty:
        raise MovieLensInputError(f"split of {len(ratings)} ratings with --valid_fraction {valid_fraction} left "
                                  f"{'train' if train.empty else 'valid'} empty")
    return train, valid


def Progress(what: str, total: int, out: Callable[[str], None], interval: float = 10.0) -> _Progress:
    """``[movielens.etl] <what>: <done> of ~<total> rows (<pct>), <rate> rows/s, <H:MM:SS> left`` at most every
    ``interval`` seconds (and at the end): ``recsys_common.logger.Progress``."""
    return _Progress(f"[movielens.etl] {what}", max(1, int(total)), every=interval, out=out, estimated=True)


class _DaskProgress:
    """Progress of an NVTabular fit or transform: Dask's scheduler callbacks count the finished tasks of each graph
    it computes (a fit computes a few: one pass each), and the share of tasks done stands for the share of rows
    done (the parts are of equal size)."""

    def __init__(self, what: str, rows: int, out: Callable[[str], None]):
        from dask.callbacks import Callback
        passes = []

        class _Callback(Callback):
            def _start_state(self, dsk, state):
                self.total = max(1, len(state["ready"]) + len(state["waiting"]) + len(state["finished"]))
                self.done_tasks = 0
                passes.append(Progress(f"{what} (pass {len(passes) + 1})", rows, out))

            def _posttask(self, key, result, dsk, state, worker_id):
                self.done_tasks += 1
                progress = passes[-1]
                progress.update(int(progress.total * min(self.done_tasks / self.total, 1.0)) - progress.done)

            def _finish(self, dsk, state, errored):
                if not errored and passes:
                    passes[-1].update(passes[-1].total - passes[-1].done, final=True)

        self.callback = _Callback()

    def __enter__(self):
        self.callback.__enter__()
        return self

    def __exit__(self, *exc):
        return self.callback.__exit__(*exc)


def _estimated_rows(layout: Layout) -> int:
    """Ratings in the file, estimated from its size and its first lines (for progress lines only)."""
    size = os.path.getsize(layout.ratings)
    try:
        opener = gzip.open if layout.ratings.endswith(".gz") else open
        with opener(layout.ratings, "rb") as f:
            sample = f.read(1 << 16)
        if layout.ratings.endswith(".gz"):
            size *= 4   # a rough ratio for these files
        return max(1, int(size / max(len(sample) / max(sample.count(b"\n"), 1), 1)))
    except OSError:
        return 1


def write_raw_parts(layout: Layout, movies: pd.DataFrame, staging_raw: str, valid_fraction: float, seed: int,
                    part_rows: int, out: Callable[[str], None]) -> Dict[str, List[str]]:
    """Stream the ratings, split them, write ``staging_raw/{train,valid}/part_<i>.parquet``: part ``i`` holds the
    train and the valid rows of ratings ``i * part_rows`` to ``(i + 1) * part_rows - 1``; returns the files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    draw = SplitDraw(valid_fraction, seed)
    files: Dict[str, List[str]] = {"train": [], "valid": []}
    pending: Dict[str, List[pd.DataFrame]] = {"train": [], "valid": []}
    counts = {"train": 0, "valid": 0}
    for split in files:
        os.makedirs(os.path.join(staging_raw, split))

    def flush(split: str) -> None:
        if not pending[split]:
            return
        path = os.path.join(staging_raw, split, f"part_{len(files[split])}.parquet")
        frame = pd.concat(pending[split], ignore_index=True)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
        files[split].append(path)
        pending[split].clear()

    progress = Progress("read and split", _estimated_rows(layout), out)
    movie_ids = np.sort(movies[ITEM].to_numpy())
    in_part = 0
    for frame in iter_ratings(layout, movie_ids):
        progress.update(len(frame))
        while len(frame):   # cut at exactly part_rows ratings a part (train and valid together)
            piece, frame = frame.iloc[:part_rows - in_part], frame.iloc[part_rows - in_part:]
            is_valid = draw(len(piece))
            for split, rows in (("train", piece[~is_valid]), ("valid", piece[is_valid])):
                pending[split].append(rows)
                counts[split] += len(rows)
            in_part += len(piece)
            if in_part == part_rows:
                flush("train")
                flush("valid")
                in_part = 0
    flush("train")
    flush("valid")
    progress.total = progress.done
    progress.update(0, final=True)
    if not counts["train"] or not counts["valid"]:
        raise MovieLensInputError(f"split of {sum(counts.values())} ratings with --valid_fraction {valid_fraction} "
                                  f"left {'train' if not counts['train'] else 'valid'} empty")
    return files


# ----------------------------------------------------------------------------------------------------- workflow
def _label(col):
    # A named function (not a lambda) so the saved workflow pickles it by reference to this module.
    return (col > POSITIVE_ABOVE).astype("int8")


def build_workflow(movies: pd.DataFrame):
    """The NVTabular workflow: join genres, Categorify userId/movieId/genres, label = rating > 3 (int8)."""
    import nvtabular as nvt
    from nvtabular import ops
    joined = [USER, ITEM] >> ops.JoinExternal(movies, on=[ITEM])
    categorical = joined >> ops.Categorify()
    label = [LABEL] >> ops.LambdaOp(_label, dtype=np.int8)
    return nvt.Workflow(categorical + label)


def cardinalities(workflow) -> Dict[str, int]:
    """Rows each categorical's embedding table needs (NVTabular's own count, out-of-vocabulary index included)."""
    from nvtabular.ops import get_embedding_sizes
    single, multi = get_embedding_sizes(workflow)
    sizes = dict(single)
    sizes.update(multi)
    return {name: int(sizes[name][0]) for name in (USER, ITEM, GENRES)}


def build_feature_spec(base_directory: str, cards: Dict[str, int], max_hotness: int,
                       rows: Dict[str, int], files: Optional[Dict[str, List[str]]] = None) -> FeatureSpec:
    """The FeatureSpec of the output directory (paths relative to it); ``files``: per split, default one part."""
    files = files or {"train": ["train/part_0.parquet"], "test": ["valid/part_0.parquet"]}
    feature_spec = {USER: {"dtype": "int64", "cardinality": cards[USER]},
                    ITEM: {"dtype": "int64", "cardinality": cards[ITEM]},
                    GENRES: {"dtype": "int64", "cardinality": cards[GENRES], "max_hotness": int(max_hotness)},
                    LABEL: {"dtype": "int8"}}
    columns = [USER, ITEM, GENRES, LABEL]
    source_spec = {split: [{"type": "parquet", "features": columns, "files": list(names)}]
                   for split, names in files.items()}
    channel_spec = {LABEL_CHANNEL: [LABEL], ONEHOT_CHANNEL: [USER, ITEM], MULTIHOT_CHANNEL: [GENRES],
                    NUMERICAL_CHANNEL: []}
    metadata = {"dataset": "movielens", "rows": dict(rows), "workflow": WORKFLOW_DIR,
                "label": f"rating > {POSITIVE_ABOVE}", "produced_by": f"python -m {TOOL}"}
    return FeatureSpec(feature_spec, source_spec, channel_spec, metadata, base_directory=base_directory,
                       origin=os.path.join(base_directory, SPEC_NAME)).validate()


def _parquet_rows(paths: Sequence[str]) -> int:
    import pyarrow.parquet as pq
    return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)


def run_etl(input_dir: str, output_dir: str, *, ratings_file: Optional[str] = None, valid_fraction: float = 0.2,
            seed: int = 42, overwrite: bool = False, part_rows: int = DEFAULT_PART_ROWS,
            out: Callable[[str], None] = print, engine: str = DEFAULT_ENGINE) -> Dict[str, object]:
    """Run the ETL; returns ``{"rows": {"train", "test"}, "cardinalities", "max_hotness", "seconds",
    "rows_per_second", "parts", "layout"}``. Raises ``MovieLensInputError``, ``OutputDirectoryError``,
    ``ValueError`` (a flag)."""
    start = time.perf_counter()
    if part_rows < 1:
        raise ValueError(f"--part_rows must be at least 1, got {part_rows}")
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    SplitDraw(valid_fraction, seed)   # a bad fraction fails before any work
    if engine == "nvtabular":
        _require_nvtabular()
    check_output_directory(output_dir, overwrite)
    layout = detect_layout(input_dir, ratings_file)
    movies = read_movies(layout)
    max_hotness = int(movies[GENRES].map(len).max())
    with atomic_directory(output_dir, overwrite=overwrite, tool=TOOL, marker=SPEC_NAME) as staging:
        raw_dir = os.path.join(staging, RAW_DIR)
        raw = write_raw_parts(layout, movies, raw_dir, valid_fraction, seed, part_rows, out)
        rows = {"train": _parquet_rows(raw["train"]), "test": _parquet_rows(raw["valid"])}
        total = rows["train"] + rows["test"]
        out(f"[movielens.etl] read {total:,} ratings ({layout.name}) of {len(movies):,} movies from {input_dir}: "
            f"{rows['train']:,} train, {rows['test']:,} valid in {len(raw['train'])} part(s) "
            f"({time.perf_counter() - start:.1f} s)")
        if engine == "nvtabular":
            cards, files = _run_nvtabular(staging, output_dir, movies, raw, rows, out)
        else:
            cards, files = _run_pyarrow(staging, output_dir, movies, raw, rows, out)
        shutil.rmtree(raw_dir)   # our own intermediate files, inside our own staging directory
        spec = build_feature_spec(staging, cards, max_hotness, rows, files)
        spec.to_yaml(os.path.join(staging, SPEC_NAME))
    seconds = time.perf_counter() - start
    out(f"[movielens.etl] done: cardinalities {cards}, max_hotness {max_hotness}, {seconds:.1f} s "
        f"({total / seconds:,.0f} rows/s) -> {os.path.abspath(output_dir)}")
    return {"rows": rows, "cardinalities": cards, "max_hotness": max_hotness, "seconds": seconds,
            "rows_per_second": total / seconds, "parts": len(raw["train"]), "layout": layout.name, "engine": engine}


def _movies_table(movies: pd.DataFrame):
    return movies_table(movies[ITEM].to_numpy(), movies[GENRES])


def _run_pyarrow(staging: str, output_dir: str, movies: pd.DataFrame, raw: Dict[str, List[str]],
                 rows: Dict[str, int], out: Callable[[str], None]) -> Tuple[Dict[str, int], Dict[str, List[str]]]:
    """Our engine: fit the vocabularies on the train parts, then transform every part into its output file."""
    import pyarrow.parquet as pq
    t = time.perf_counter()
    workflow = MovieLensWorkflow(_movies_table(movies))
    progress = Progress("fit", rows["train"], out)
    for path in raw["train"]:
        part = pq.read_table(path)
        workflow.fit_part(part)
        progress.update(part.num_rows)
    progress.update(0, final=True)
    workflow.finish_fit()
    workflow.save(os.path.join(staging, WORKFLOW_DIR))
    out(f"[movielens.etl] fitted the workflow on train ({rows['train']:,} rows) in "
        f"{time.perf_counter() - t:.1f} s ({rows['train'] / max(time.perf_counter() - t, 1e-9):,.0f} rows/s)")
    files = {}
    for split, subdir, mapping in (("train", "train", "train"), ("valid", "valid", "test")):
        t = time.perf_counter()
        os.makedirs(os.path.join(staging, subdir))
        progress = Progress(f"transform {subdir}/", rows[mapping], out)
        counts = []
        for i, path in enumerate(raw[split]):
            table = workflow.transform_table(pq.read_table(path))
            # uncompressed, list items named "item": the files NVTabular (merlin.io) writes
            pq.write_table(table, os.path.join(staging, subdir, f"part_{i}.parquet"), compression="none",
                           use_compliant_nested_type=False)
            counts.append(table.num_rows)
            progress.update(table.num_rows)
        progress.update(0, final=True)
        names = [f"part_{i}.parquet" for i in range(len(raw[split]))]
        final_dir = os.path.join(os.path.abspath(output_dir), subdir)
        _write_reader_lists(os.path.join(staging, subdir), final_dir, names, counts)
        files[mapping] = [f"{subdir}/{name}" for name in names]
        seconds = max(time.perf_counter() - t, 1e-9)
        out(f"[movielens.etl] wrote {subdir}/ ({rows[mapping]:,} rows, {len(names)} part(s)) in {seconds:.1f} s "
            f"({rows[mapping] / seconds:,.0f} rows/s)")
    return workflow.cardinalities(), files


def _write_reader_lists(directory: str, final_dir: str, names: List[str], counts: List[int]) -> None:
    """What HugeCTR's Parquet reader takes, as merlin.io writes it: ``_file_list.txt`` (the number of files, then
    their paths, in the final directory) and ``_metadata.json`` (rows per file)."""
    with open(os.path.join(directory, "_file_list.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join([str(len(names))] + [os.path.join(final_dir, n) for n in names]) + "\n")
    meta = {"file_stats": [{"file_name": n, "num_rows": int(c)} for n, c in zip(names, counts)],
            "cats": [], "conts": [], "labels": []}
    with open(os.path.join(directory, "_metadata.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)


def _run_nvtabular(staging: str, output_dir: str, movies: pd.DataFrame, raw: Dict[str, List[str]],
                   rows: Dict[str, int], out: Callable[[str], None]) -> Tuple[Dict[str, int], Dict[str, List[str]]]:
    """``--engine nvtabular``: the NVTabular 23.8 workflow, fitted and applied a Dask partition (raw part) at a time;
    its vocabularies are also saved in our format (``load_workflow`` reads either engine's output)."""
    from merlin.io import Dataset
    t = time.perf_counter()
    workflow = build_workflow(movies)
    # one Dask partition per raw part: NVTabular fits its statistics and transforms a part at a time
    datasets = {split: Dataset(raw[split], engine="parquet", cpu=_cpu(), part_size=_part_size(raw[split]))
                for split in raw}
    with _DaskProgress("fit", rows["train"], out):
        workflow.fit(datasets["train"])
    workflow.save(os.path.join(staging, WORKFLOW_DIR))
    out(f"[movielens.etl] fitted the workflow on train ({rows['train']:,} rows) in "
        f"{time.perf_counter() - t:.1f} s ({rows['train'] / (time.perf_counter() - t):,.0f} rows/s)")
    files = {}
    for split, subdir, mapping in (("train", "train", "train"), ("valid", "valid", "test")):
        t = time.perf_counter()
        num_parts = len(raw[split])
        with _DaskProgress(f"transform {subdir}/", rows[mapping], out):
            workflow.transform(datasets[split]).to_parquet(os.path.join(staging, subdir),
                                                           output_files=num_parts, shuffle=None)
        files[mapping] = _check_parts(os.path.join(staging, subdir), num_parts,
                                      os.path.join(os.path.abspath(output_dir), subdir), subdir)
        seconds = time.perf_counter() - t
        out(f"[movielens.etl] wrote {subdir}/ ({rows[mapping]:,} rows, {num_parts} part(s)) in {seconds:.1f} s "
            f"({rows[mapping] / seconds:,.0f} rows/s)")
    cards = cardinalities(workflow)
    ours = workflow_from_nvtabular_categories(os.path.join(staging, WORKFLOW_DIR, "categories"), _movies_table(movies))
    ours.save(os.path.join(staging, WORKFLOW_DIR))
    return cards, files


def _part_size(paths: Sequence[str]) -> int:
    """A Dask partition size (bytes of in-memory data) that makes each raw part file one partition."""
    import pyarrow.parquet as pq
    largest = max(pq.ParquetFile(p).metadata.num_rows for p in paths)
    return max(1 << 20, largest * 64)


def _require_nvtabular() -> None:
    """``--engine nvtabular`` where NVTabular is not installed (the default environment): a ValueError saying where it
    is (exit status 2 on the command line), before any work."""
    try:
        import merlin.io  # noqa: F401
        import nvtabular  # noqa: F401
    except ImportError as e:
        raise ValueError(f"--engine nvtabular needs NVTabular 23.8 (and merlin-core), which this Python lacks ({e}); "
                         f"run it with the NVTabular environment's python (make setup-nvtabular: "
                         f".venv-nvtabular/bin/python) or use the default engine") from None


def _cpu() -> bool:
    """NVTabular on the GPU where cuDF is importable, pandas otherwise."""
    from merlin.core.compat import cudf
    return cudf is None


def _check_parts(written_dir: str, num_parts: int, final_dir: str, subdir: str) -> List[str]:
    """Check that NVTabular wrote ``part_0.parquet`` .. ``part_<num_parts - 1>.parquet`` (the names the spec lists)
    and point its ``_file_list.txt`` (what HugeCTR's Parquet reader takes) at the final directory instead of the
    staging one. Returns the files relative to the output directory."""
    expected = [f"part_{i}.parquet" for i in range(num_parts)]
    names = sorted((n for n in os.listdir(written_dir) if n.endswith(".parquet")),
                   key=lambda n: int(n[5:-8]) if n[5:-8].isdigit() else -1)
    if names != expected:
        raise RuntimeError(f"{written_dir}: expected NVTabular to write {expected[0]}..{expected[-1]}, found {names}")
    file_list = os.path.join(written_dir, "_file_list.txt")
    if os.path.exists(file_list):
        with open(file_list, encoding="utf-8") as f:
            lines = f.read().splitlines()
        lines = [os.path.join(final_dir, os.path.basename(l)) if l.endswith(".parquet") else l for l in lines]
        with open(file_list, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return [f"{subdir}/{name}" for name in expected]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m " + TOOL, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input_dir", required=True,
                   help="MovieLens directory (ml-100k, ml-1m, or ml-20m/ml-25m/ml-latest files)")
    p.add_argument("--output_dir", required=True, help="output: train/, valid/, feature_spec.yaml, workflow/")
    p.add_argument("--ratings_file", default=None, help="ratings file to read instead of the one found")
    p.add_argument("--valid_fraction", type=float, default=0.2, help="fraction of ratings drawn into valid/")
    p.add_argument("--seed", type=int, default=42, help="seed of the train/valid draw")
    p.add_argument("--part_rows", type=int, default=DEFAULT_PART_ROWS,
                   help="ratings per part (raw and output parquet files): bounds the ETL's memory")
    p.add_argument("--overwrite", action="store_true", help="replace this tool's earlier output in --output_dir")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                   help="pyarrow: our own workflow (no NVTabular); nvtabular: the NVTabular 23.8 workflow (needs "
                        "nvtabular and merlin-core)")
    return p


def main(argv: Optional[Sequence[str]] = None):
    """Parse ``argv`` and run the ETL; returns :func:`run_etl`'s result."""
    args = build_parser().parse_args(argv)
    return run_etl(args.input_dir, args.output_dir, ratings_file=args.ratings_file, valid_fraction=args.valid_fraction,
                   seed=args.seed, overwrite=args.overwrite, part_rows=args.part_rows, engine=args.engine)


if __name__ == "__main__":
    # Merlin imports TensorFlow and torch, if present, only for dtype tables (seconds on 2 cores); the ETL needs neither.
    for _name in ("tensorflow", "torch"):
        sys.modules.setdefault(_name, None)
    warnings.filterwarnings("ignore", message=r".*dtype mappings did not load successfully")
    warnings.filterwarnings("ignore", message=r".*NVTabular Dataset (in|to) CPU mode")
    run_main(main, input_errors=(MovieLensInputError, OutputDirectoryError, ValueError))
